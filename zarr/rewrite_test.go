package zarr_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// bloscRewritePy writes with zarr-python a v2 array pl (2, 37, 64, 128) float32
// in chunks of one time step, blosc lz4 with byte shuffle (numcodecs), then
// rewrites time step 1 with other values and keeps that chunk's new bytes
// aside (in NEW), putting the old ones back: the test swaps them in when
// it wants the rewrite to happen.
const bloscRewritePy = `
import sys
import numpy as np
import numcodecs
import zarr
store, new = sys.argv[1:3]
a = zarr.create_array(store, shape=(2, 37, 64, 128), chunks=(1, 37, 64, 128), dtype='<f4', zarr_format=2,
                      compressors=numcodecs.Blosc(cname='lz4', clevel=5, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=65536),
                      fill_value=0)
base = np.arange(37 * 64 * 128, dtype=np.float32).reshape(37, 64, 128)
a[0] = base
a[1] = base + 1e7
chunk = store + '/1.0.0.0'
old = open(chunk, 'rb').read()
a[1] = base * 3 + 2e7
open(new, 'wb').write(open(chunk, 'rb').read())
open(chunk, 'wb').write(old)
`

// rewriteAfterFirstRange is a versioned local store that a remote reader
// would see (not objectstore.IsLocal: a chunk is read in part) and that
// rewrites one chunk right after the first ranged read of it: between a
// partial read's header and its blocks.
type rewriteAfterFirstRange struct {
	*objectstore.Posix
	key     string
	once    sync.Once
	rewrite func()
	ranged  int
}

func (s *rewriteAfterFirstRange) GetRangeVersion(ctx context.Context, key string, off, n int64) ([]byte, string, error) {
	b, v, err := s.Posix.GetRangeVersion(ctx, key, off, n)
	if key == s.key {
		s.ranged++
		s.once.Do(s.rewrite)
	}
	return b, v, err
}

// A chunk read in part (a blosc header, then the blocks a selection needs)
// from a versioned store before any listing of its array, rewritten between
// the two reads, is refused with ErrChanged: never the new chunk's blocks
// decoded under the old header. Read again, it gives the new values.
func TestPartialReadRewrittenBetweenHeaderAndBlocks(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		missing(t, "python3 not on PATH: the store is written by zarr-python (make pydeps)")
	}
	if out, err := exec.Command(py, "-c", "import zarr, numcodecs").CombinedOutput(); err != nil {
		missing(t, "zarr-python and numcodecs are not importable (make pydeps): %v\n%s", err, out)
	}
	dir := t.TempDir()
	store, newChunk := filepath.Join(dir, "pl.zarr"), filepath.Join(dir, "new-chunk")
	if out, err := exec.Command(py, "-c", bloscRewritePy, store, newChunk).CombinedOutput(); err != nil {
		t.Fatalf("zarr-python: %v\n%s", err, out)
	}
	px, err := objectstore.OpenPosix(store)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	st := &rewriteAfterFirstRange{Posix: px, key: "1.0.0.0", rewrite: func() {
		if err := os.Rename(newChunk, filepath.Join(store, "1.0.0.0")); err != nil {
			t.Error(err)
		}
	}}
	h := openWith(t, st, zarr.Options{ChunkCacheBytes: -1})
	a := h.Array("")
	if a == nil || a.Listing() != nil {
		t.Fatal("no array, or one listed already: the test proves nothing")
	}
	sel := func() []zarr.Request {
		return []zarr.Request{{Array: a, Start: []int64{1, 3, 0, 0}, Count: []int64{1, 2, 64, 128}, Dst: make([]byte, 2*64*128*4)}}
	}
	reqs := sel()
	err = h.Read(context.Background(), nil, reqs)
	if h.Stats().ChunksPartial.Load() == 0 && st.ranged < 2 {
		t.Fatalf("the chunk was not read in part (%d ranged reads): the test proves nothing", st.ranged)
	}
	if !errors.Is(err, zarr.ErrChanged) {
		t.Fatalf("Read across the rewrite: %v, want ErrChanged (the new chunk's blocks under the old header)", err)
	}
	var ce *zarr.ChunkError
	if !errors.As(err, &ce) || ce.Key != "1.0.0.0" {
		t.Errorf("err = %v, want one naming chunk 1.0.0.0", err)
	}
	// Read again: the new chunk, whole or in part, gives its own values.
	again := sel()
	if err := h.Read(context.Background(), nil, again); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 0, len(again[0].Dst))
	for i := 3 * 64 * 128; i < 5*64*128; i++ {
		want = appendF32(want, float32(i)*3+2e7)
	}
	if !bytes.Equal(again[0].Dst, want) {
		t.Error("read again after the rewrite: values differ from the new chunk's")
	}
}

func appendF32(b []byte, v float32) []byte {
	return binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
}
