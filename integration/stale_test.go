package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/zarrfs/zarrfs/integration/miniotest"
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

// shrinkPy writes (create) a v3 store whose array t is float32 (12, 4, 4)
// in chunks of one step, element [i, y, x] = i*100 + y*4 + x + 1, but step
// 2, all zeros, which zarr-python does not store (the fill value 0); or
// shrinks (shrink) t to 4 steps with zarr-python's resize, which deletes
// the chunks past the new shape and rewrites zarr.json.
const shrinkPy = `
import sys
import numpy as np
import zarr
op, path = sys.argv[1], sys.argv[2]
if op == 'create':
    g = zarr.open_group(path, mode='w', zarr_format=3)
    t = g.create_array('t', shape=(12, 4, 4), chunks=(1, 4, 4), dtype='f4', fill_value=0, dimension_names=('time', 'y', 'x'))
    v = np.arange(12 * 16, dtype=np.float32).reshape(12, 4, 4) + 1
    v[2] = 0
    t[:] = v
else:
    zarr.open_group(path, mode='r+')['t'].resize((4, 4, 4))
`

// readNever reads a mounted file whose chunk was deleted: it fails with
// EIO or is gone (ENOENT), never the fill value as data; with old, the
// bytes it served before (a cached sample, within --metadata-ttl) are
// allowed too.
func readNever(t *testing.T, p string, old []byte) error {
	t.Helper()
	b, err := os.ReadFile(p)
	if err == nil {
		if old != nil && bytes.Equal(b, old) {
			return nil
		}
		zeros := len(b) > 4096 && bytes.Count(b[4096:], []byte{0}) == len(b)-4096
		t.Errorf("%s read %d bytes after its chunk was deleted (all zeros: %v), want EIO or ENOENT", p, len(b), zeros)
		return nil
	}
	if !errors.Is(err, syscall.EIO) && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after its chunk was deleted: %v, want EIO or ENOENT", p, err)
	}
	return err
}

// checkShrunk reads a mount of a shrink store after the shrink: the
// samples past the new shape fail (EIO, with a log line naming the chunk)
// or are gone, never served as zeros (t/10.npy, cached before, may keep
// its bytes within --metadata-ttl, as a chunk rewritten does); the mount then re-reads the metadata
// at once, whatever --metadata-ttl, and lists the new shape; the sample
// never written still reads as the fill value, the others their values.
func checkShrunk(t *testing.T, d *daemon, cached []byte) {
	t.Helper()
	readNever(t, filepath.Join(d.mnt, "t", "10.npy"), cached)
	if err := readNever(t, filepath.Join(d.mnt, "t", "09.npy"), nil); errors.Is(err, syscall.EIO) {
		d.logs(`msg="cannot fill file"`, "chunk=t/c/9/0/0", "metadata changed")
	}
	if !eventually(func() bool {
		ents, _ := os.ReadDir(filepath.Join(d.mnt, "t"))
		return len(ents) == 4
	}) {
		ents, _ := os.ReadDir(filepath.Join(d.mnt, "t"))
		t.Errorf("t/ lists %d files, want the 4 of the new shape without waiting for --metadata-ttl", len(ents))
	}
	for k, want := range map[string]float32{"2.npy": 0, "3.npy": 3*16 + 1} {
		b, err := os.ReadFile(filepath.Join(d.mnt, "t", k))
		if err != nil || len(b) != 4096+64 || math.Float32frombits(binary.LittleEndian.Uint32(b[4096:])) != want {
			t.Errorf("t/%s after the shrink: %v, want first value %v", k, err, want)
		}
	}
}

// An array shrunk under a mount (zarr-python's resize deletes the chunks
// past the new shape) never serves those samples as the fill value: a
// sample cached before and one never read fail or vanish, and the mount
// lists the new shape at once, though --metadata-ttl is an hour. A chunk
// that was never written still reads as the fill value.
func TestShrunkArrayNeverServesFill(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	src := filepath.Join(t.TempDir(), "s.zarr")
	python(t, shrinkPy, "create", src)
	d := mount(t, src, "--metadata-ttl", "1h")
	var cached []byte
	for _, k := range []string{"02.npy", "10.npy"} {
		b, err := os.ReadFile(filepath.Join(d.mnt, "t", k))
		if err != nil {
			t.Fatal(err)
		}
		cached = b
	}
	python(t, shrinkPy, "shrink", src)
	checkShrunk(t, d, cached)
}

// The same on S3 (MinIO): chunk objects deleted and zarr.json shrunk
// under a mount whose --metadata-ttl is an hour.
func TestShrunkS3ArrayNeverServesFill(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	srv := miniotest.Start(t)
	bucket := srv.NewBucket(t)
	s3Env(t, srv)
	local := filepath.Join(t.TempDir(), "s.zarr")
	python(t, shrinkPy, "create", local)
	srv.UploadDir(t, bucket, "s.zarr", local)
	d := mount(t, "s3://"+bucket+"/s.zarr", "--s3-endpoint", srv.Endpoint, "--metadata-ttl", "1h")
	var cached []byte
	for _, k := range []string{"02.npy", "10.npy"} {
		b, err := os.ReadFile(filepath.Join(d.mnt, "t", k))
		if err != nil {
			t.Fatal(err)
		}
		cached = b
	}
	python(t, shrinkPy, "shrink", local)
	// A sync: the deleted chunks' objects go, zarr.json is uploaded anew.
	for i := 4; i < 12; i++ {
		if err := srv.Client.RemoveObject(context.Background(), bucket, fmt.Sprintf("s.zarr/t/c/%d/0/0", i), minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	srv.UploadDir(t, bucket, "s.zarr", local)
	checkShrunk(t, d, cached)
}
