package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestGetBlobHitMissAndPaths(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	k := BlobKey{Layout: "abc123", Path: "train/07.npy"}
	if c.HasBlob(k) {
		t.Fatal("HasBlob before fill")
	}
	data := content("x", 5000)
	fills := 0
	fill := func(ctx context.Context, f Writer) error { fills++; return writeFill(data)(ctx, f) }
	for i := range 3 {
		h, _, err := c.GetBlob(context.Background(), k, int64(len(data)), fill, nil)
		if err != nil {
			t.Fatal(err)
		}
		if h.Path() != c.BlobPath(k) || h.Size() != int64(len(data)) {
			t.Fatalf("handle path %s size %d", h.Path(), h.Size())
		}
		if !bytes.Equal(readAll(t, h), data) {
			t.Fatal("wrong contents")
		}
		// The first call waited on the fill, the others found the blob.
		if h.Filled() != (i == 0) {
			t.Fatalf("call %d: Filled() = %v", i, h.Filled())
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if err := h.Close(); err != nil {
			t.Fatal("second Close:", err)
		}
	}
	if fills != 1 {
		t.Fatalf("%d fills, want 1", fills)
	}
	if !c.HasBlob(k) {
		t.Fatal("HasBlob after fill")
	}
	// The warmed copy is a plain file under BlobDir, mirroring the tree.
	onDisk, err := os.ReadFile(c.BlobDir("abc123") + "/train/07.npy")
	if err != nil || !bytes.Equal(onDisk, data) {
		t.Fatalf("plain file: %v", err)
	}
	if n, files := c.Usage(); n != int64(len(data)) || files != 1 {
		t.Fatalf("Usage = %d, %d", n, files)
	}
}

func TestGetBlobInvalidKeys(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir()})
	defer c.Close()
	for _, k := range []BlobKey{
		{Layout: "", Path: "a.npy"}, {Layout: "..", Path: "a.npy"}, {Layout: "a/b", Path: "a.npy"},
		{Layout: "L", Path: "../x.npy"}, {Layout: "L", Path: "/abs.npy"}, {Layout: "L", Path: "a//b.npy"},
		{Layout: "L", Path: ""}, {Layout: "L", Path: "."},
	} {
		_, _, err := c.GetBlob(context.Background(), k, 1, writeFill([]byte{1}), nil)
		if !errors.Is(err, ErrInvalidKey) {
			t.Errorf("GetBlob(%+v) = %v, want ErrInvalidKey", k, err)
		}
	}
}

// Many goroutines on overlapping keys: one fill per key, every caller gets
// the right bytes.
func TestGetBlobConcurrentOneFillPerKey(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir()})
	defer c.Close()
	const keys, workers, rounds = 8, 32, 20
	var fills [keys]atomic.Int32
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for r := range rounds {
				i := (w + r) % keys
				p := key(i)
				data := content(p, sizeOf(p))
				h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: p}, int64(len(data)),
					func(ctx context.Context, f Writer) error {
						fills[i].Add(1)
						return writeFill(data)(ctx, f)
					}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(readAll(t, h), data) {
					t.Errorf("%s: wrong contents", p)
				}
				h.Close()
			}
		}()
	}
	close(gate)
	wg.Wait()
	for i := range keys {
		if n := fills[i].Load(); n != 1 {
			t.Errorf("key %d filled %d times", i, n)
		}
	}
}

// A failing fill: every waiter gets the error, nothing is visible, and the
// next call fills again.
func TestGetBlobFillError(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	k := BlobKey{Layout: "L", Path: "bad.npy"}
	boom := errors.New("decode failed")
	release, started := make(chan struct{}), make(chan struct{}, 100)
	fail := func(ctx context.Context, f Writer) error {
		started <- struct{}{}
		f.Write([]byte("partial"))
		<-release
		return boom
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = c.GetBlob(context.Background(), k, 100, fail, nil)
		}()
	}
	<-started // the fill runs; callers that come later join it or fail alike
	close(release)
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, boom) {
			t.Errorf("caller %d: %v, want the fill's error", i, err)
		}
	}
	if _, err := os.Stat(c.BlobPath(k)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("blob visible after failed fill: %v", err)
	}
	if c.HasBlob(k) {
		t.Fatal("HasBlob after failed fill")
	}
	if tf := tempFiles(t, dir); len(tf) != 0 {
		t.Fatalf("temp files left: %v", tf)
	}
	if n, files := c.Usage(); n != 0 || files != 0 {
		t.Fatalf("Usage = %d, %d after failed fill", n, files)
	}
	data := content("ok", 100)
	h, _, err := c.GetBlob(context.Background(), k, 100, writeFill(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !bytes.Equal(readAll(t, h), data) {
		t.Fatal("wrong contents after retry")
	}
}

func TestGetBlobWrongSize(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	k := BlobKey{Layout: "L", Path: "short.npy"}
	for _, n := range []int{99, 101} {
		_, _, err := c.GetBlob(context.Background(), k, 100, writeFill(make([]byte, n)), nil)
		if !errors.Is(err, ErrFillSize) {
			t.Fatalf("fill of %d bytes: %v, want ErrFillSize", n, err)
		}
	}
	if _, err := os.Stat(c.BlobPath(k)); !errors.Is(err, os.ErrNotExist) || len(tempFiles(t, dir)) != 0 {
		t.Fatal("something left behind by a wrong-size fill")
	}
}

// A waiter whose context ends returns at once; the fill goes on for the
// caller that still wants it.
func TestGetBlobWaiterCancel(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir()})
	defer c.Close()
	k := BlobKey{Layout: "L", Path: "slow.npy"}
	data := content("slow", 4096)
	started, release := make(chan struct{}), make(chan struct{})
	fill := func(ctx context.Context, f Writer) error {
		close(started)
		<-release
		return writeFill(data)(ctx, f)
	}
	type res struct {
		h   *Handle
		err error
	}
	first := make(chan res)
	go func() {
		h, _, err := c.GetBlob(context.Background(), k, 4096, fill, nil)
		first <- res{h, err}
	}()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error)
	go func() {
		_, _, err := c.GetBlob(ctx, k, 4096, fill, nil)
		second <- err
	}()
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	close(release)
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.h.Close()
	if !bytes.Equal(readAll(t, r.h), data) {
		t.Fatal("wrong contents")
	}
}

// When the only caller gives up, the fill's context is cancelled.
func TestGetBlobLastCallerCancelStopsFill(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	k := BlobKey{Layout: "L", Path: "abandoned.npy"}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	fill := func(fctx context.Context, f Writer) error {
		cancel()
		<-fctx.Done()
		stopped <- fctx.Err()
		return fctx.Err()
	}
	if _, _, err := c.GetBlob(ctx, k, 10, fill, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("GetBlob: %v", err)
	}
	if err := <-stopped; !errors.Is(err, context.Canceled) {
		t.Fatalf("fill context: %v", err)
	}
	c.Close()
	if c.HasBlob(k) || len(tempFiles(t, dir)) != 0 {
		t.Fatal("abandoned fill left something")
	}
}

func TestClosed(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir()})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "a.npy"}, 1, writeFill([]byte{1}), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetBlob after Close: %v", err)
	}
	if _, err := c.GetChunk(context.Background(), "k", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetChunk after Close: %v", err)
	}
}

// A caller arriving while an abandoned fill winds down starts its own fill
// instead of inheriting the other caller's cancellation.
func TestGetBlobAfterAbandonedFill(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir()})
	defer c.Close()
	k := BlobKey{Layout: "L", Path: "again.npy"}
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	slow := func(fctx context.Context, f Writer) error {
		cancel()
		<-release // still winding down when the next caller comes
		return fctx.Err()
	}
	if _, _, err := c.GetBlob(ctx, k, 3, slow, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("first GetBlob: %v", err)
	}
	// Joining the abandoned fill would wait for release, which comes only
	// after this call: bound the wait so that mistake fails, not hangs.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	h, _, err := c.GetBlob(ctx2, k, 3, writeFill([]byte{1, 2, 3}), nil)
	close(release)
	if err != nil {
		t.Fatalf("second GetBlob joined the abandoned fill: %v", err)
	}
	defer h.Close()
	if !bytes.Equal(readAll(t, h), []byte{1, 2, 3}) {
		t.Fatal("wrong contents")
	}
}

// A blob larger than the whole budget is served, but neither cached nor
// allowed to flush what the cache holds.
func TestGetBlobLargerThanBudget(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir, Size: 100})
	defer c.Close()
	for i := range 5 {
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: fmt.Sprintf("s%d.npy", i)}, 10, writeFill(bytes.Repeat([]byte{byte(i)}, 10)), nil)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	}
	big := bytes.Repeat([]byte{7}, 1000)
	h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "big.npy"}, int64(len(big)), writeFill(big), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, h), big) {
		t.Fatal("wrong contents")
	}
	h.Close()
	if used, n := c.Usage(); used != 50 || n != 5 {
		t.Errorf("usage %d bytes in %d files after the oversize blob, want 50 in 5", used, n)
	}
	if c.HasBlob(BlobKey{Layout: "L", Path: "big.npy"}) || len(tempFiles(t, dir)) != 0 {
		t.Error("the oversize blob was kept")
	}
}

// TestFillChecksum fills blobs written in order (hashed as they are
// written), out of order, with overwrites and with Write and WriteAt mixed
// (hashed by reading the file back): the checksum recorded for each must be
// the file's.
func TestFillChecksum(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir()})
	defer c.Close()
	data := content("sum", 3<<20+17)
	half := int64(len(data) / 2)
	fills := map[string]func(ctx context.Context, f Writer) error{
		"in-order": func(_ context.Context, f Writer) error {
			if _, err := f.WriteAt(data[:100], 0); err != nil {
				return err
			}
			_, err := f.WriteAt(data[100:], 100)
			return err
		},
		"write-then-writeat": func(_ context.Context, f Writer) error {
			if _, err := f.Write(data[:half]); err != nil {
				return err
			}
			_, err := f.WriteAt(data[half:], half)
			return err
		},
		"backwards": func(_ context.Context, f Writer) error {
			if _, err := f.WriteAt(data[half:], half); err != nil {
				return err
			}
			_, err := f.WriteAt(data[:half], 0)
			return err
		},
		"overwrite": func(_ context.Context, f Writer) error {
			junk := bytes.Repeat([]byte{0xAB}, len(data))
			if _, err := f.WriteAt(junk, 0); err != nil {
				return err
			}
			_, err := f.WriteAt(data[10:20], 10) // an in-order-looking write after the whole file
			if err != nil {
				return err
			}
			_, err = f.WriteAt(data, 0)
			return err
		},
	}
	buf := make([]byte, 1<<20)
	for name, fill := range fills {
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: name + ".npy"}, int64(len(data)), fill, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(readAll(t, h), data) {
			t.Errorf("%s: wrong contents", name)
		}
		h.Close()
		rel, err := BlobKey{Layout: "L", Path: name + ".npy"}.rel()
		if err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		e := c.idx[rel]
		c.mu.Unlock()
		if e == nil {
			t.Fatalf("%s: not indexed", name)
		}
		if !e.sum.tree {
			t.Errorf("%s: an xxh64 recorded in a journal of version 3", name)
		}
		if err := verifyFile(c.BlobPath(BlobKey{Layout: "L", Path: name + ".npy"}), e.size, e.sum, buf); err != nil {
			t.Errorf("%s: recorded checksum does not match the file: %v", name, err)
		}
	}
}
