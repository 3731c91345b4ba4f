package layout

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/zarrfs/zarrfs/zarr"
)

// An identity names a region's chunks in sorted key order, as it always
// has, though it walks them one at a time: chunk coordinates of one, two
// and three digits ("10" sorts before "2") give the hash of the sorted
// keys and their versions, so that blobs cached by an earlier release
// keep their identity.
func TestIdentityNamesChunksSorted(t *testing.T) {
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, []storeArray{{Path: "s", DType: "uint8", Shape: []int64{2, 3, 120}, Chunks: []int64{1, 1, 1},
		Dims: []string{"time", "y", "x"}, Value: func(idx []int64) float64 { return float64(idx[2]) }}})
	os.Remove(filepath.Join(dir, "s", "c", "1", "2", "7")) // one missing: "absent"
	h := viewtest.OpenStore(t, dir, zarr.Options{})
	defer h.Close()
	l, err := Build(h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustLookup(t, l, "s/1.npy")
	got, err := l.Identity(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	src := b.Sources()[0]
	keys := src.Array.RegionChunks(src.Start, src.Count)
	if !sort.StringsAreSorted(keys) || len(keys) != 360 {
		t.Fatalf("%d keys", len(keys))
	}
	want := sha256.New()
	io.WriteString(want, layoutVersion)
	want.Write([]byte{0})
	io.WriteString(want, b.Inputs())
	lst := src.Array.Listing()
	for _, k := range keys {
		v, ok, err := lst.Version(k)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			v = "absent"
		}
		want.Write([]byte{0})
		io.WriteString(want, k)
		want.Write([]byte{0})
		io.WriteString(want, v)
	}
	if w := hex.EncodeToString(want.Sum(nil))[:32]; got != w {
		t.Errorf("identity %s, want %s (the sorted keys')", got, w)
	}
}
