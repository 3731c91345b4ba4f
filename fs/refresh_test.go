package fs

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// writeGrowing writes a v3 store whose array t is uint32 shaped (n, 4) in
// chunks of (4, 4), element [i, j] = base + 4*i + j, raw little-endian,
// and rewrites only the chunks whose bytes change (as an append does).
func writeGrowing(t testing.TB, dir string, n int, base uint32) {
	t.Helper()
	doc := `{"zarr_format":3,"node_type":"array","shape":[` + strconv.Itoa(n) + `,4],"data_type":"uint32",
 "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4,4]}},
 "chunk_key_encoding":{"name":"default"},"fill_value":0,
 "codecs":[{"name":"bytes","configuration":{"endian":"little"}}],"dimension_names":["time","x"]}`
	os.MkdirAll(filepath.Join(dir, "t"), 0o755)
	os.WriteFile(filepath.Join(dir, "zarr.json"), []byte(`{"zarr_format":3,"node_type":"group"}`), 0o644)
	os.WriteFile(filepath.Join(dir, "t", "zarr.json"), []byte(doc), 0o644)
	for c := 0; c*4 < n; c++ {
		b := make([]byte, 4*4*4)
		for i := range 4 {
			if c*4+i >= n {
				break
			}
			for j := range 4 {
				binary.LittleEndian.PutUint32(b[(i*4+j)*4:], base+uint32(4*(c*4+i)+j))
			}
		}
		p := filepath.Join(dir, "t", "c", strconv.Itoa(c), "0")
		if old, err := os.ReadFile(p); err == nil && string(old) == string(b) {
			continue
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func sampleValue(t testing.TB, b []byte) uint32 {
	t.Helper()
	if len(b) < 4096+4 {
		t.Fatalf("short sample file: %d bytes", len(b))
	}
	return binary.LittleEndian.Uint32(b[4096:])
}

// A mount that refreshes its metadata shows appended samples in listings
// and lookups (names widened from 1 to 2 digits included), updates the
// sidecar, serves a chunk rewritten in place anew, and a file opened
// before the change keeps reading the version it opened.
func TestRefreshFollowsTheStore(t *testing.T) {
	requireFUSE(t)
	store := t.TempDir()
	writeGrowing(t, store, 10, 0)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(store, "t", "c", "0", "0"), old, old)
	st, err := objectstore.OpenPosix(store)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dec := must(codec.NewCPU(codec.Options{}))
	defer dec.Close()
	src := &layout.Source{Store: st, Zarr: zarr.Options{Stats: &zarr.Stats{}, Decoder: dec}}
	lay, err := src.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.Open(cache.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mnt := t.TempDir()
	m, err := Mount(context.Background(), Options{Mountpoint: mnt, Layout: lay, Blobs: testBlobs(t, c, nil),
		Refresh: src.Reopen, RefreshEvery: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Unmount(time.Second); err != nil {
			t.Error(err)
		}
		m.Layout().Close()
	}()
	if ents, _ := os.ReadDir(filepath.Join(mnt, "t")); len(ents) != 10 || ents[9].Name() != "9.npy" {
		t.Fatalf("before: %d entries", len(ents))
	}
	if _, err := os.Stat(filepath.Join(mnt, "t", "12.npy")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("t/12.npy before the append: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(mnt, "t", "3.npy"))
	if err != nil || sampleValue(t, b) != 12 {
		t.Fatalf("t/3.npy: %v", err)
	}
	held, err := os.Open(filepath.Join(mnt, "t", "3.npy"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()

	// Append 4 steps; rewrite chunk 0 (samples 0-3) in place.
	writeGrowing(t, store, 14, 0)
	b0, _ := os.ReadFile(filepath.Join(store, "t", "c", "0", "0"))
	for i := 0; i < len(b0); i += 4 {
		binary.LittleEndian.PutUint32(b0[i:], binary.LittleEndian.Uint32(b0[i:])+1000)
	}
	if err := os.WriteFile(filepath.Join(store, "t", "c", "0", "0"), b0, 0o644); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, _ := os.ReadDir(filepath.Join(mnt, "t"))
		if len(ents) == 14 && ents[13].Name() == "13.npy" && ents[3].Name() == "03.npy" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listing did not follow the append: %d entries", len(ents))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "t", "12.npy")); err != nil || sampleValue(t, b) != 48 {
		t.Errorf("t/12.npy after the append: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "t", "03.npy")); err != nil || sampleValue(t, b) != 1012 {
		t.Errorf("t/03.npy after the rewrite: %v, value %d, want 1012", err, sampleValue(t, b))
	}
	if _, err := os.Stat(filepath.Join(mnt, "t", "3.npy")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("t/3.npy after the names widened: %v", err)
	}
	var side struct {
		Shape []int64 `json:"shape"`
		Files int64   `json:"files"`
	}
	sb, _ := os.ReadFile(filepath.Join(mnt, "t.json"))
	if err := json.Unmarshal(sb, &side); err != nil || side.Shape[0] != 14 || side.Files != 14 {
		t.Errorf("t.json after the append: %s", sb)
	}
	// The file opened before keeps its version.
	got := make([]byte, 4)
	if _, err := held.ReadAt(got, 4096); err != nil || binary.LittleEndian.Uint32(got) != 12 {
		t.Errorf("a file open across the change read %d, want 12 (the version it opened): %v", binary.LittleEndian.Uint32(got), err)
	}
}

// A refresh waiting on its source ends with the mount: Unmount cancels it
// and returns, and a refresh that ended with the mount logs nothing.
func TestUnmountEndsAHungRefresh(t *testing.T) {
	requireFUSE(t)
	l, err := layout.Build(&zarr.Hierarchy{Groups: map[string]map[string]any{"": {}}}, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.Open(cache.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	entered, ended := make(chan struct{}), make(chan error, 1)
	hung := func(ctx context.Context, cur *layout.Layout) (*layout.Layout, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-ctx.Done() // a source that never answers
		ended <- ctx.Err()
		return nil, ctx.Err()
	}
	m, err := Mount(context.Background(), Options{Mountpoint: t.TempDir(), Layout: l, Blobs: testBlobs(t, c, nil),
		Refresh: hung, RefreshEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		m.Unmount(0)
		t.Fatal("no refresh began")
	}
	done := make(chan error, 1)
	go func() { done <- m.Unmount(time.Second) }()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Unmount waits on a hung refresh")
	}
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the refresh ended with %v, want its context cancelled", err)
	}
}
