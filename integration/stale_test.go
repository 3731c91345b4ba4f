package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore/webtest"
)

// restoreMtime sets p's modification time back to mtime, as touch -d, cp -p,
// tar x or rsync -t leave a file they rewrote.
func restoreMtime(t testing.TB, p string, mtime time.Time) {
	t.Helper()
	if err := os.Chtimes(p, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// A chunk rewritten in place with other bytes of the same length, its
// modification time then restored, is a rewrite: a mount serves the new
// bytes after --metadata-ttl, and so does a new mount on the same cache
// after another such rewrite, never the old sample. Size, modification
// time and inode are all unchanged; only the change time tells.
func TestRewriteWithMtimeRestored(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	src := filepath.Join(t.TempDir(), "grow.zarr")
	growStore(t, "create", src, 8)
	chunk := filepath.Join(src, "raw", "c", "0", "0", "0")
	st, err := os.Stat(chunk)
	if err != nil {
		t.Fatal(err)
	}
	mtime := st.ModTime()
	cacheDir := t.TempDir()
	d := mountAt(t, src, t.TempDir(), cacheDir, "--metadata-ttl", "1s")
	file := filepath.Join(d.mnt, "raw", "5.npy")
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	rewriteSample(t, src, 5, 0.25)
	restoreMtime(t, chunk, mtime)
	if now, _ := os.Stat(chunk); now.Size() != st.Size() || !now.ModTime().Equal(mtime) {
		t.Fatalf("the rewrite changed the size or the modification time: the test proves nothing")
	}
	// The next refresh starts within the TTL; two leave room for a loaded
	// machine.
	time.Sleep(2 * time.Second)
	after, err := os.ReadFile(file)
	if err != nil || bytes.Equal(after, before) {
		t.Fatalf("raw/5.npy two TTLs after a same-size rewrite with its mtime restored: %v, old bytes served %v", err, bytes.Equal(after, before))
	}
	if n := checkGrowMount(t, d.mnt, src); n != 3*8+1 {
		t.Errorf("checked %d files after the rewrite", n)
	}
	d.stop(t)

	// Again with the mount down: a new mount on the same cache reads anew.
	rewriteSample(t, src, 5, 0.25)
	restoreMtime(t, chunk, mtime)
	d = mountAt(t, src, t.TempDir(), cacheDir)
	again, err := os.ReadFile(filepath.Join(d.mnt, "raw", "5.npy"))
	if err != nil || bytes.Equal(again, after) {
		t.Fatalf("raw/5.npy after a remount on the same cache: %v, old bytes served %v", err, bytes.Equal(again, after))
	}
	if n := checkGrowMount(t, d.mnt, src); n != 3*8+1 {
		t.Errorf("checked %d files after the remount", n)
	}
}

// httpStorePy writes (create) or rewrites (rewrite) a consolidated v3 store
// whose array t is float32 (8, 16, 16) in chunks of one time step, zstd:
// element [i, y, x] = i*1000 + y*16 + x + base. A rewrite of step 3 with
// another base compresses to another size.
const httpStorePy = `
import sys
import numpy as np
import zarr
op, path = sys.argv[1], sys.argv[2]
def values(i, base):
    y = np.arange(16, dtype=np.float32)[:, None]
    x = np.arange(16, dtype=np.float32)[None, :]
    return (i * 1000 + y * 16 + x + base).astype(np.float32)
if op == 'create':
    g = zarr.open_group(path, mode='w', zarr_format=3)
    a = g.create_array('t', shape=(8, 16, 16), chunks=(1, 16, 16), dtype='f4', dimension_names=('time', 'y', 'x'))
    a[:] = np.stack([values(i, 0.5) for i in range(8)])
    zarr.consolidate_metadata(path)
else:
    a = zarr.open_group(path, mode='r+')['t']
    a[3] = np.random.default_rng(7).random((16, 16), dtype=np.float32)
`

// A web server that sends Last-Modified and no ETag names a chunk rewritten
// within the second it was read by the same Last-Modified: a mount over
// HTTP serves the rewrite after --metadata-ttl because the chunk's size
// changed, never the old sample. The server is Go's file server, whose
// Last-Modified is the file's modification time, set back to the second
// it had.
func TestHTTPRewriteWithinTheSecond(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "s.zarr")
	python(t, httpStorePy, "create", store)
	chunk := filepath.Join(store, "t", "c", "3", "0", "0")
	st, err := os.Stat(chunk)
	if err != nil {
		t.Fatal(err)
	}
	web := webtest.Start(t, dir)
	d := mount(t, web.Join("s.zarr"), "--metadata-ttl", "1s")
	file := filepath.Join(d.mnt, "t", "3.npy")
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	python(t, httpStorePy, "rewrite", store)
	restoreMtime(t, chunk, st.ModTime())
	now, err := os.Stat(chunk)
	if err != nil || now.Size() == st.Size() || now.ModTime().Unix() != st.ModTime().Unix() {
		t.Fatalf("the rewrite kept the size (%d) or moved the second: the test proves nothing", st.Size())
	}
	time.Sleep(2 * time.Second)
	after, err := os.ReadFile(file)
	if err != nil || bytes.Equal(after, before) {
		t.Fatalf("t/3.npy two TTLs after a rewrite within its Last-Modified second: %v, old bytes served %v", err, bytes.Equal(after, before))
	}
	want := python(t, `
import sys, zarr, numpy as np
sys.stdout.write(np.ascontiguousarray(zarr.open_group(sys.argv[1], mode='r')['t'][3]).tobytes().hex())
`, store)
	if got := fmt.Sprintf("%x", after[4096:]); got != want {
		t.Errorf("t/3.npy after the rewrite differs from zarr-python's reading")
	}
}
