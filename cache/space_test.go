package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// tmpfs mounts a tmpfs of the given size (mount option, "1m") for the test.
func tmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fillUp writes junk to path until the filesystem is full.
func fillUp(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	if f == nil {
		return
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// A cache on a 1 MiB filesystem, with no --cache-size: its budget is what
// the filesystem holds; fills evict and go on when something else fills
// the disk; recovery after a kill and compaction work on a full
// filesystem; a blob larger than the filesystem fails at once.
func TestFullFilesystem(t *testing.T) {
	fsDir := tmpfs(t, "1m")
	dir := filepath.Join(fsDir, "cache")
	c := mustOpen(t, Options{Dir: dir})
	if c.budget <= 0 || c.budget > 1<<20 {
		t.Fatalf("budget %d on a 1 MiB filesystem", c.budget)
	}
	for i := range 300 {
		getBlob(t, c, key(i)) // ~2 MiB in all, evicting as it goes
	}

	// Something else takes all the free space: fills evict and retry.
	fillUp(t, filepath.Join(fsDir, "junk1"))
	for i := 300; i < 350; i++ {
		getBlob(t, c, key(i))
	}

	// A blob larger than the filesystem fails at once, without filling.
	called := false
	_, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "huge.npy"}, 2<<20, func(context.Context, Writer) error {
		called = true
		return nil
	}, nil)
	if !errors.Is(err, syscall.ENOSPC) || called {
		t.Fatalf("blob larger than the filesystem: %v (fill called: %v)", err, called)
	}

	// Killed while the filesystem is full: the next Open recovers and
	// compacts, making room from the cache itself.
	c.abandon()
	fillUp(t, filepath.Join(fsDir, "junk2"))
	c = mustOpen(t, Options{Dir: dir})
	getBlob(t, c, key(400))
	getBlob(t, c, key(350))
	c.abandon()

	// With the cache emptied by hand and the filesystem full, Open still
	// works (the journal stays as it is); fills fail with ENOSPC, quickly.
	for _, d := range []string{blobsDir, chunksDir} {
		os.RemoveAll(filepath.Join(dir, d))
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	fillUp(t, filepath.Join(fsDir, "junk3"))
	c = mustOpen(t, Options{Dir: dir})
	defer c.Close()
	start := time.Now()
	data := content("x", 8192)
	_, _, err = c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "x.npy"}, int64(len(data)), writeFill(data), nil)
	if !errors.Is(err, syscall.ENOSPC) || time.Since(start) > 5*time.Second {
		t.Errorf("fill on a full filesystem with nothing to evict: %v after %v", err, time.Since(start))
	}
	// Free the space: fills work again, and are kept. (All of it: what
	// junk3 alone took back depends on how much the cache held before.)
	for _, j := range []string{"junk1", "junk2", "junk3"} {
		os.Remove(filepath.Join(fsDir, j))
	}
	getBlob(t, c, key(500))
	if !c.HasBlob(BlobKey{Layout: "L", Path: key(500)}) {
		t.Error("blob not kept after space was freed")
	}
}

// Eight fills at once on a full filesystem (a 50 MB tmpfs the cache
// filled to 31 MB, the rest taken by another file) all succeed while
// anything can be evicted: a fill that finds the room another made counts
// it, and tries again as long as there is something to evict.
func TestFullFilesystemConcurrent(t *testing.T) {
	fsDir := tmpfs(t, "50m")
	c := mustOpen(t, Options{Dir: filepath.Join(fsDir, "cache")})
	defer c.Close()
	const size = 100 << 10
	data := bytes.Repeat([]byte{7}, size)
	fill := func(p string) error {
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: p}, size, writeFill(data), nil)
		if err == nil {
			h.Close()
		}
		return err
	}
	for i := range 310 {
		if err := fill(fmt.Sprintf("warm/%04d.npy", i)); err != nil {
			t.Fatal(err)
		}
	}
	fillUp(t, filepath.Join(fsDir, "junk"))
	var failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				if err := fill(fmt.Sprintf("r%d/%04d.npy", g, i)); err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of 800 fills failed with 31 MB evictable: %v", n, first.Load())
	}
}

// Chunk stores on a full filesystem retry as fills do (whileFull): eight
// goroutines storing chunks on a 50 MB tmpfs the cache's blobs filled to
// 31 MB, the rest taken by another file, keep every chunk while anything
// can be evicted: no store gives up, and the last chunks stored are there.
// (Which goroutine stores last is the scheduler's choice: on two cores one
// may finish hundreds of chunks before another, whose chunks then evict its
// last one as the least recently used. So the check is on the last stored
// in time, not on each goroutine's last.)
func TestFullFilesystemChunks(t *testing.T) {
	fsDir := tmpfs(t, "50m")
	var logs strings.Builder
	c := mustOpen(t, Options{Dir: filepath.Join(fsDir, "cache"), Logger: testLoggerTo(t, &logs)})
	defer c.Close()
	const size = 100 << 10
	data := bytes.Repeat([]byte{7}, size)
	for i := range 310 {
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: fmt.Sprintf("warm/%04d.npy", i)}, size, writeFill(data), nil)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	}
	fillUp(t, filepath.Join(fsDir, "junk"))
	fetch := func(context.Context) ([]byte, error) { return data, nil }
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		stored []string // keys in the order their stores returned
	)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				k := fmt.Sprintf("r%d/%04d", g, i)
				if _, err := c.GetChunk(context.Background(), k, fetch); err != nil {
					t.Error(err)
				}
				mu.Lock()
				stored = append(stored, k)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if strings.Contains(logs.String(), "cache chunk not stored") {
		t.Fatalf("a chunk store gave up with blobs and older chunks to evict:\n%s", logs.String())
	}
	// The last eight chunks stored are still there: a read fetches nothing.
	for _, k := range stored[len(stored)-8:] {
		if _, err := c.GetChunk(context.Background(), k, func(context.Context) ([]byte, error) {
			t.Errorf("chunk %s, among the last eight stored, was not kept on a full filesystem", k)
			return data, nil
		}); err != nil {
			t.Error(err)
		}
	}
}
