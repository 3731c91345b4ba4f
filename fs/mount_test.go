package fs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
	"golang.org/x/sys/unix"
)

// patternReader fills element i of a region with the low byte of
// (global linear index + array salt); failing arrays return a ChunkError.
type patternReader struct {
	reads atomic.Int64
	fail  map[string]bool
	delay atomic.Int64 // nanoseconds each Read takes
}

func (r *patternReader) Read(ctx context.Context, _ *zarr.Pin, reqs []zarr.Request) error {
	r.reads.Add(1)
	if d := time.Duration(r.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, q := range reqs {
		if r.fail[q.Array.Path] {
			return &zarr.ChunkError{Array: q.Array.Path, Key: q.Array.Path + "/c/0/0", Err: fmt.Errorf("%w: zstd: invalid frame", codec.ErrCorrupt)}
		}
		size := int64(q.Array.DType.Size)
		n := int64(len(q.Dst)) / size
		// Regions here are whole samples along axis 0: the global index of
		// the region's first element is Start[0] * (elements per sample).
		per := int64(1)
		for _, s := range q.Array.Shape[1:] {
			per *= s
		}
		base := q.Start[0] * per
		if len(q.Array.Shape) == 1 {
			base = 0
		}
		for i := range n {
			binary.LittleEndian.PutUint32(q.Dst[i*size:], uint32(base+i))
		}
	}
	return nil
}

type testMount struct {
	dir   string
	cache *cache.Cache
	l     *layout.Layout
	r     *patternReader
	logs  *syncbuf.Buffer
	m     *Mounted
}

func requireFUSE(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "no /dev/fuse: FUSE tests need it")
	}
}

func mountArrays(t testing.TB, arrays []*zarr.Array, fail map[string]bool) *testMount {
	t.Helper()
	requireFUSE(t)
	tm := &testMount{dir: t.TempDir(), r: &patternReader{fail: fail}, logs: &syncbuf.Buffer{}}
	h := &zarr.Hierarchy{Arrays: arrays, Groups: map[string]map[string]any{"": {}}}
	var err error
	tm.l, err = layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tm.cache, err = cache.Open(cache.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tm.cache.Close() })
	log := slog.New(slog.NewTextHandler(tm.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	tm.m, err = Mount(context.Background(), Options{Mountpoint: tm.dir, Layout: tm.l, Blobs: testBlobs(t, tm.cache, tm.r), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tm.m.Unmount(time.Second); err != nil {
			t.Error(err)
		}
	})
	return tm
}

// key is the cache key the mount uses for the blob at mount path p.
func (tm *testMount) key(t testing.TB, p string) cache.BlobKey {
	t.Helper()
	e, ok := tm.l.Lookup(p)
	if !ok || e.Kind != layout.KindBlob {
		t.Fatalf("%s: no such blob", p)
	}
	ident, err := tm.l.Identity(context.Background(), e.Blob)
	if err != nil {
		t.Fatal(err)
	}
	return cache.BlobKey{Layout: tm.l.ID, Path: p, Identity: ident}
}

var f32 = zarr.DType{Kind: 'f', Size: 4}

func smallArrays() []*zarr.Array {
	return []*zarr.Array{
		{Path: "t", Shape: []int64{12, 4, 8}, Chunks: []int64{5, 4, 8}, DType: f32, Dims: []string{"time", "y", "x"}, MetaHash: "t"},
		{Path: "bad", Shape: []int64{3, 4}, Chunks: []int64{1, 4}, DType: f32, Dims: []string{"time", "x"}, MetaHash: "b"},
		{Path: "lat", Shape: []int64{8}, Chunks: []int64{8}, DType: f32, Dims: []string{"y"}, MetaHash: "l"},
	}
}

func TestListAndStatNeverFill(t *testing.T) {
	tm := mountArrays(t, smallArrays(), nil)
	ents, err := os.ReadDir(tm.dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if want := "bad bad.json lat.json lat.npy t t.json"; strings.Join(got, " ") != want {
		t.Errorf("root lists %q, want %q", got, want)
	}
	for p, size := range map[string]int64{"t/00.npy": 4096 + 4*8*4, "t/11.npy": 4096 + 4*8*4, "lat.npy": 4096 + 8*4, "bad/2.npy": 4096 + 16} {
		st, err := os.Stat(filepath.Join(tm.dir, p))
		if err != nil || st.Size() != size || st.Mode().Perm() != 0o444 {
			t.Errorf("stat %s: %v size %d mode %v, want size %d", p, err, st.Size(), st.Mode(), size)
		}
	}
	ents, _ = os.ReadDir(filepath.Join(tm.dir, "t"))
	if len(ents) != 12 || ents[0].Name() != "00.npy" || ents[11].Name() != "11.npy" {
		t.Errorf("t/ lists %d entries", len(ents))
	}
	if _, err := os.Stat(filepath.Join(tm.dir, "t/12.npy")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("t/12.npy: %v", err)
	}
	if n := tm.r.reads.Load(); n != 0 {
		t.Errorf("listing and stat read the source %d times", n)
	}
	if _, err := os.Stat(tm.cache.BlobDir(tm.l.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("blob dir exists after listing: %v", err)
	}
}

func TestReadMatchesFill(t *testing.T) {
	tm := mountArrays(t, smallArrays(), nil)
	for _, p := range []string{"t/07.npy", "lat.npy", "t.json"} {
		got, err := os.ReadFile(filepath.Join(tm.dir, p))
		if err != nil {
			t.Fatal(err)
		}
		e, _ := tm.l.Lookup(p)
		var want []byte
		if e.Kind == layout.KindSidecar {
			want = e.Data
		} else {
			w := &memWriter{}
			f, err := fill.New(fill.Options{Reader: tm.r})
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Fill(context.Background(), tm.l, e.Blob, nil, w); err != nil {
				t.Fatal(err)
			}
			want = w.b
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes through the mount differ from %d filled", p, len(got), len(want))
		}
	}
	// Reading again is served from the cache: no more source reads.
	before := tm.r.reads.Load()
	if _, err := os.ReadFile(filepath.Join(tm.dir, "t/07.npy")); err != nil {
		t.Fatal(err)
	}
	if tm.r.reads.Load() != before {
		t.Error("second open read the source again")
	}
	if !tm.cache.HasBlob(tm.key(t, "t/07.npy")) {
		t.Error("blob not in the cache")
	}
}

type memWriter struct{ b []byte }

func (w *memWriter) WriteAt(p []byte, off int64) (int, error) {
	if n := off + int64(len(p)); n > int64(len(w.b)) {
		w.b = append(w.b, make([]byte, n-int64(len(w.b)))...)
	}
	return copy(w.b[off:], p), nil
}

func TestConcurrentOpensFillOnce(t *testing.T) {
	tm := mountArrays(t, smallArrays(), nil)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := os.ReadFile(filepath.Join(tm.dir, "t/03.npy")); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := tm.r.reads.Load(); n != 1 {
		t.Errorf("16 concurrent opens filled %d times", n)
	}
}

func TestReadOnly(t *testing.T) {
	tm := mountArrays(t, smallArrays(), nil)
	p := func(s string) string { return filepath.Join(tm.dir, s) }
	for name, op := range map[string]func() error{
		"open for write": func() error { f, err := os.OpenFile(p("t/00.npy"), os.O_WRONLY, 0); f.Close(); return err },
		"open rdwr json": func() error { f, err := os.OpenFile(p("t.json"), os.O_RDWR, 0); f.Close(); return err },
		"create":         func() error { return os.WriteFile(p("new.npy"), []byte("x"), 0o644) },
		"create in dir":  func() error { return os.WriteFile(p("t/new.npy"), []byte("x"), 0o644) },
		"mkdir":          func() error { return os.Mkdir(p("d"), 0o755) },
		"unlink":         func() error { return os.Remove(p("lat.npy")) },
		"rmdir":          func() error { return syscall.Rmdir(p("t")) },
		"rename":         func() error { return os.Rename(p("lat.npy"), p("lat2.npy")) },
		"truncate":       func() error { return os.Truncate(p("lat.npy"), 0) },
		"chmod":          func() error { return os.Chmod(p("lat.npy"), 0o666) },
		"symlink":        func() error { return os.Symlink("lat.npy", p("l")) },
	} {
		if err := op(); !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s: %v, want EROFS", name, err)
		}
	}
	if n := tm.r.reads.Load(); n != 0 {
		t.Errorf("write attempts read the source %d times", n)
	}
}

func TestFillErrorIsolated(t *testing.T) {
	tm := mountArrays(t, smallArrays(), map[string]bool{"bad": true})
	for range 3 {
		_, err := os.ReadFile(filepath.Join(tm.dir, "bad/1.npy"))
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("bad/1.npy: %v, want EIO", err)
		}
	}
	if _, err := os.ReadFile(filepath.Join(tm.dir, "t/01.npy")); err != nil {
		t.Errorf("a healthy file fails too: %v", err)
	}
	logs := tm.logs.String()
	if strings.Count(logs, "cannot fill file") != 1 || !strings.Contains(logs, "array=bad") || !strings.Contains(logs, "chunk=bad/c/0/0") || !strings.Contains(logs, "invalid frame") {
		t.Errorf("log lines:\n%s", logs)
	}
	if tm.cache.HasBlob(tm.key(t, "bad/1.npy")) {
		t.Error("a failed fill is visible in the cache")
	}
}

func TestPassthroughServesReads(t *testing.T) {
	tm := mountArrays(t, smallArrays(), nil)
	if !tm.m.Passthrough() {
		t.Skip("kernel did not grant FUSE passthrough")
	}
	f, err := os.Open(filepath.Join(tm.dir, "t/05.npy"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil || len(b) != 4096+128 {
		t.Fatalf("read %d bytes: %v", len(b), err)
	}
}

// BenchmarkLsLong lists a directory of 100,000 samples with readdir plus a
// stat per entry (what `ls -l` does), through a fresh mount each round.
func BenchmarkLsLong(b *testing.B) {
	arrays := []*zarr.Array{{Path: "big", Shape: []int64{100000, 721, 1440}, Chunks: []int64{10, 721, 1440}, DType: f32, Dims: []string{"time", "lat", "lon"}, MetaHash: "x"}}
	for b.Loop() {
		b.StopTimer()
		tm := mountArrays(b, arrays, nil)
		b.StartTimer()
		ents, err := os.ReadDir(filepath.Join(tm.dir, "big"))
		if err != nil || len(ents) != 100000 {
			b.Fatalf("%d entries: %v", len(ents), err)
		}
		for _, e := range ents {
			if _, err := e.Info(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		tm.m.Unmount(time.Second)
		b.StartTimer()
	}
}

// A signal the reader catches while its open waits for a fill interrupts
// the request in the kernel, which tells the daemon. The open must still
// succeed, as SA_RESTART promises, not fail with EINTR: Go's runtime
// preempts threads with SIGURG, and any program with a signal handler gets
// the same.
func TestOpenSurvivesSignals(t *testing.T) {
	tm := mountArrays(t, smallArrays(), nil)
	tm.r.delay.Store(int64(400 * time.Millisecond))
	tids := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread the signals go to; it dies with the goroutine
		tids <- unix.Gettid()
		fd, err := syscall.Open(filepath.Join(tm.dir, "t/03.npy"), syscall.O_RDONLY, 0)
		if err == nil {
			syscall.Close(fd)
		}
		done <- err
	}()
	tid := <-tids
	sent := 0
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("open interrupted by %d signals: %v", sent, err)
			}
			if sent < 3 {
				t.Fatalf("only %d signals reached the open; the test proves nothing", sent)
			}
			return
		case <-time.After(20 * time.Millisecond):
			if err := unix.Tgkill(os.Getpid(), tid, unix.SIGURG); err == nil {
				sent++
			}
		}
	}
}

// testBlobs fills blobs into c, reading with r (nil: each layout's
// hierarchy).
func testBlobs(t testing.TB, c *cache.Cache, r zarr.Reader) fill.Blobs {
	t.Helper()
	f, err := fill.New(fill.Options{Cache: c, Reader: r})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
