package fs

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// The daemon's memory does not grow with the entries listed: a plain
// listing of 100,000 samples makes the kernel look none of them up, and
// stat'ing every one keeps at most MaxInodes of them.
func TestListingMemoryBounded(t *testing.T) {
	requireFUSE(t)
	const n = 50_000
	arrays := []*zarr.Array{{Path: "x", Shape: []int64{n, 2}, Chunks: []int64{1000, 2}, DType: f32, Dims: []string{"time", "y"}, MetaHash: "x"}}
	l, err := layout.Build(&zarr.Hierarchy{Arrays: arrays, Groups: map[string]map[string]any{"": {}}}, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.Open(cache.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	m, err := Mount(context.Background(), Options{Mountpoint: dir, Layout: l, Blobs: testBlobs(t, c, &patternReader{}), Logger: slog.New(slog.DiscardHandler), MaxInodes: 2000})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmount(time.Second)

	base := heapInUse()
	f, err := os.Open(filepath.Join(dir, "x"))
	if err != nil {
		t.Fatal(err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil || len(names) != n {
		t.Fatalf("listed %d names: %v", len(names), err)
	}
	grown := heapInUse() - base
	t.Logf("a listing of %d entries: heap +%d KiB, %d looked up", n, grown>>10, m.inodes.held())
	if grown > 16<<20 {
		t.Errorf("a listing of %d entries grew the heap by %d MiB", n, grown>>20)
	}
	for _, name := range names {
		if _, err := os.Lstat(filepath.Join(dir, "x", name)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // the trimmer runs behind the lookups
	grown = heapInUse() - base
	t.Logf("after stat of every entry: heap +%d KiB, %d looked up", grown>>10, m.inodes.held())
	if grown > 32<<20 || m.inodes.held() > 2000 {
		t.Errorf("stat of %d entries: heap +%d MiB, %d names held (bound 2000)", n, grown>>20, m.inodes.held())
	}
}
