package cache

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
)

// mappedPieces counts the pieces copied through a mapping while the test
// runs, and makes piece fail (when fail >= 0) as a fault would.
func mappedPieces(t *testing.T, fail int) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	testMapFault = func(i int) error {
		n.Add(1)
		if i == fail {
			return errors.New("injected fault")
		}
		return nil
	}
	t.Cleanup(func() { testMapFault = nil })
	return &n
}

// A large write goes through the mapping, at an offset that is not a page
// start and with a length that is no multiple of a piece; the file holds
// exactly the bytes written, and the running hash is the file's.
func TestMappedWrite(t *testing.T) {
	for i, dir := range []string{t.TempDir(), tmpfs(t, "64m"), tmpfs(t, "64m")} {
		tree := i != 2 // the segment hash, and xxh64 once
		pieces := mappedPieces(t, -1)
		f, err := os.CreateTemp(dir, "blob-*")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		head := content("head", 4096+100)
		data := content("data", mapWriteMin+3*mapPiece+12345)
		var filling atomic.Int64
		filling.Store(1)
		hw := &hashingWriter{f: f, d: newHasher(tree), filling: &filling}
		if _, err := hw.Write(head); err != nil {
			t.Fatal(err)
		}
		if n, err := hw.Write(data); err != nil || n != len(data) {
			t.Fatalf("write: %d, %v", n, err)
		}
		if pieces.Load() == 0 || hw.noMap {
			t.Fatalf("%s: the large write was not mapped (%d pieces, noMap %v)", dir, pieces.Load(), hw.noMap)
		}
		got, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if want := append(append([]byte{}, head...), data...); !bytes.Equal(got, want) {
			t.Fatalf("%s: file of %d bytes differs from the %d written", dir, len(got), len(want))
		}
		size := int64(len(head) + len(data))
		if hw.broken || hw.next != size {
			t.Fatalf("%s: the running hash covers %d of %d bytes (broken %v): the sum would read the file again", dir, hw.next, size, hw.broken)
		}
		sum, err := hw.sum(size)
		if err != nil {
			t.Fatal(err)
		}
		if want := sumOf(got, tree); sum != want {
			t.Fatalf("%s: running hash %+v, file's %+v", dir, sum, want)
		}
	}
}

// A blob filled through the mapping (on tmpfs) is served and kept like any other;
// one whose copy faults fails its fill, and nothing of it stays.
func TestMappedWriteBlob(t *testing.T) {
	dir := filepath.Join(tmpfs(t, "64m"), "cache")
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	data := content("big", mapWriteMin+mapPiece/2)
	fill := func(ctx context.Context, f Writer) error {
		_, err := f.WriteAt(data, 0)
		return err
	}

	pieces := mappedPieces(t, 2)
	k := BlobKey{Layout: "L", Path: "t/0000.npy"}
	if _, _, err := c.GetBlob(context.Background(), k, int64(len(data)), fill, nil); err == nil || !errors.Is(err, syscall.EIO) && !bytes.Contains([]byte(err.Error()), []byte("injected fault")) {
		t.Fatalf("fill with a faulting copy: %v", err)
	}
	if pieces.Load() == 0 {
		t.Fatal("the fill's write was not mapped")
	}
	if c.HasBlob(k) {
		t.Fatal("a blob whose write failed is in the cache")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*", "blob-*")); len(left) > 0 {
		t.Fatalf("temp files left: %v", left)
	}

	mappedPieces(t, -1)
	h, _, err := c.GetBlob(context.Background(), k, int64(len(data)), fill, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got := readAll(t, h); !bytes.Equal(got, data) {
		t.Fatal("mapped blob: wrong contents")
	}
	if !c.HasBlob(k) {
		t.Fatal("mapped blob not kept")
	}
}

// On a full filesystem the reservation fails with ENOSPC before anything is
// mapped, so the fill evicts and writes again as a plain write would.
func TestMappedWriteFull(t *testing.T) {
	fsDir := tmpfs(t, "40m")
	c := mustOpen(t, Options{Dir: filepath.Join(fsDir, "cache")})
	defer c.Close()
	pieces := mappedPieces(t, -1)
	size := mapWriteMin + mapPiece
	for i := range 6 { // 6 × 10 MiB on a 40 MiB filesystem: evictions
		data := content(key(i), size)
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: key(i)}, int64(size), func(ctx context.Context, f Writer) error {
			_, err := f.WriteAt(data, 0)
			return err
		}, nil)
		if err != nil {
			t.Fatalf("blob %d: %v", i, err)
		}
		if got := readAll(t, h); !bytes.Equal(got, data) {
			t.Fatalf("blob %d: wrong contents", i)
		}
		h.Close()
		if i == 2 {
			// Something else takes the room the cache has not used.
			fillUp(t, filepath.Join(fsDir, "junk"))
		}
	}
	if pieces.Load() == 0 {
		t.Fatal("no write was mapped")
	}
}

// While many fills run, a large write takes write(2), which costs the
// machine less CPU than the mapping.
func TestMappedWriteOnlyWhenFewFills(t *testing.T) {
	pieces := mappedPieces(t, -1)
	f, err := os.CreateTemp(t.TempDir(), "blob-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var filling atomic.Int64
	filling.Store(int64(max(2, runtime.NumCPU()/8+1)))
	hw := &hashingWriter{f: f, d: newHasher(true), filling: &filling}
	data := content("busy", mapWriteMin)
	if _, err := hw.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if pieces.Load() != 0 {
		t.Fatalf("%d fills in flight: the write was mapped", filling.Load())
	}
	if sum, err := hw.sum(int64(len(data))); err != nil || sum != sumOf(data, true) {
		t.Fatalf("sum %+v, %v", sum, err)
	}
}
