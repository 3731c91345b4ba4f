package integration

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/miniotest"
)

// growPy writes and grows a store with zarr-python, as a daily-growing
// ERA5 copy does: t1 chunked 1 along time, t24 chunked 24 (an append
// rewrites its last, partial chunk), raw chunked 24 without compression
// (so a chunk rewritten in place keeps its size), and the time coordinate.
// Element [t, y, x] is t*1000 + y*16 + x + 0.5.
const growPy = `
import sys
import numpy as np
import zarr
op, path, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
Y, X = 8, 16
def values(t0, t1):
    t = np.arange(t0, t1, dtype=np.float32)[:, None, None]
    y = np.arange(Y, dtype=np.float32)[None, :, None]
    x = np.arange(X, dtype=np.float32)[None, None, :]
    return (t * 1000 + y * 16 + x + 0.5).astype(np.float32)
if op == 'create':
    g = zarr.open_group(path, mode='w', zarr_format=3)
    for name, chunk, comp in (('t1', 1, 'auto'), ('t24', 24, 'auto'), ('raw', 24, None)):
        a = g.create_array(name, shape=(k, Y, X), chunks=(chunk, Y, X), dtype='f4',
                           dimension_names=('time', 'y', 'x'), compressors=comp)
        a[:] = values(0, k)
    tm = g.create_array('time', shape=(k,), chunks=(1000,), dtype='i8', dimension_names=('time',))
    tm[:] = np.arange(k)
else:
    g = zarr.open_group(path, mode='r+')
    for name in ('t1', 't24', 'raw'):
        a = g[name]
        n = a.shape[0]
        a.append(values(n, n + k), axis=0)
    tm = g['time']
    n = tm.shape[0]
    tm.append(np.arange(n, n + k), axis=0)
`

// checkGrow compares every file of a mounted grow store with zarr-python's
// reading of the store, and checks the sidecars' shapes.
const checkGrow = `
import json, os, sys
import numpy as np
import zarr
mnt, store = sys.argv[1:3]
g = zarr.open_group(store, mode='r')
bad, n = [], 0
for name in ('t1', 't24', 'raw'):
    full = g[name][:]
    count = full.shape[0]
    width = len(str(count - 1)) if count > 1 else 1
    names = sorted(f for f in os.listdir(os.path.join(mnt, name)))
    if len(names) != count:
        bad.append(f'{name}: lists {len(names)} files, want {count}')
    side = json.load(open(os.path.join(mnt, name + '.json')))
    if side['shape'][0] != count or side['files'] != count:
        bad.append(f'{name}.json: shape {side["shape"]} files {side["files"]}, want {count}')
    for i in range(count):
        a = np.load(os.path.join(mnt, name, str(i).zfill(width) + '.npy'))
        n += 1
        if a.tobytes() != np.ascontiguousarray(full[i]).tobytes():
            bad.append(f'{name}/{i}: differs from zarr-python')
t = np.load(os.path.join(mnt, 'time.npy'))
n += 1
if t.tobytes() != g['time'][:].tobytes():
    bad.append(f'time.npy: {t.shape} differs from zarr-python {g["time"].shape}')
print(json.dumps({'files': n, 'bad': bad}))
`

func growStore(t testing.TB, op, dir string, k int) {
	t.Helper()
	python(t, growPy, op, dir, strconv.Itoa(k))
}

// checkGrowMount checks a mount of a grow store against zarr-python and
// returns the number of files it compared.
func checkGrowMount(t testing.TB, mnt, store string) int {
	t.Helper()
	var r checkResult
	if err := json.Unmarshal([]byte(python(t, checkGrow, mnt, store)), &r); err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Bad {
		t.Error(b)
	}
	return r.Files
}

// warmWork runs a warm with debug logging and returns the files it warmed
// and the chunks it decoded.
func warmWork(t testing.TB, src, cacheDir string, args ...string) (files, decoded int) {
	t.Helper()
	cmd := exec.Command(zarrfsBin(t), append([]string{"warm", src, "--cache", cacheDir, "--log-level", "debug"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("zarrfs warm: %v\n%s\n%s", err, out, stderr.String())
	}
	if m := regexp.MustCompile(`warmed (\d+) files`).FindSubmatch(out); m != nil {
		files, _ = strconv.Atoi(string(m[1]))
	} else if !bytes.Contains(out, []byte("nothing to do")) {
		t.Fatalf("no summary:\n%s", out)
	}
	m := regexp.MustCompile(`msg="warm work" chunks_decoded=(\d+)`).FindSubmatch(stderr.Bytes())
	if m == nil {
		t.Fatalf("no work line:\n%s", stderr.String())
	}
	decoded, _ = strconv.Atoi(string(m[1]))
	return files, decoded
}

// rewriteSample rewrites, in place and at the same size, the part of raw's
// uncompressed chunk 0 that holds sample k, adding delta to every value.
func rewriteSample(t testing.TB, store string, k int, delta float32) {
	t.Helper()
	p := filepath.Join(store, "raw", "c", "0", "0", "0")
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const per = 8 * 16 * 4
	b := make([]byte, per)
	if _, err := f.ReadAt(b, int64(k*per)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < per; i += 4 {
		v := math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))
		binary.LittleEndian.PutUint32(b[i:], math.Float32bits(v+delta))
	}
	if _, err := f.WriteAt(b, int64(k*per)); err != nil {
		t.Fatal(err)
	}
}

// Appending time steps keeps every blob whose chunks did not change: a warm
// after the append fills only the new samples and those of t24's last
// chunk, which the append rewrote; a chunk rewritten in place with the
// same size and metadata gets its samples filled again; every file of a
// mount then matches zarr-python.
func TestGrowWarm(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	src := filepath.Join(t.TempDir(), "grow.zarr")
	growStore(t, "create", src, 30)
	cacheDir := t.TempDir()
	files, _ := warmWork(t, src, cacheDir)
	if files != 3*30+1 {
		t.Fatalf("first warm: %d files, want %d", files, 3*30+1)
	}
	if files, decoded := warmWork(t, src, cacheDir); files != 0 || decoded != 0 {
		t.Fatalf("second warm: %d files, %d chunks decoded, want none", files, decoded)
	}

	growStore(t, "append", src, 10)
	// New: 10 samples of each array and time.npy; changed: samples 24..29
	// of t24 and raw, in the chunk the append rewrote.
	files, decoded := warmWork(t, src, cacheDir)
	if want := 3*10 + 2*6 + 1; files != want {
		t.Errorf("warm after the append filled %d files, want %d", files, want)
	}
	// Chunks decompressed: 10 of t1, t24's last one (once for its 16
	// samples when the decoded-chunk cache carries it, at most once per
	// sample), time's; raw's are not compressed.
	if decoded < 12 || decoded > 10+16+1 {
		t.Errorf("warm after the append decoded %d chunks, want 12 (at most %d)", decoded, 10+16+1)
	}

	rewriteSample(t, src, 5, 0.25)
	files, _ = warmWork(t, src, cacheDir)
	if files != 24 {
		t.Errorf("warm after rewriting raw's chunk 0 filled %d files, want its 24 samples", files)
	}
	d := mountAt(t, src, t.TempDir(), cacheDir)
	if n := checkGrowMount(t, d.mnt, src); n != 3*40+1 {
		t.Errorf("checked %d files, want %d", n, 3*40+1)
	}
	if files, _ := warmWork(t, src, cacheDir); files != 0 {
		t.Errorf("warm after the mount filled %d files", files)
	}
}

// A running mount with --metadata-ttl 1s shows appended samples (the names
// widen from one digit to two) and updated sidecars, and after a chunk is
// rewritten in place with the same size its samples read the new bytes,
// never the old; every file then matches zarr-python.
func TestGrowMount(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	src := filepath.Join(t.TempDir(), "grow.zarr")
	growStore(t, "create", src, 8)
	d := mount(t, src, "--metadata-ttl", "1s")
	if n := checkGrowMount(t, d.mnt, src); n != 3*8+1 {
		t.Fatalf("checked %d files", n)
	}
	// Looked up before it exists: the kernel may cache the failure.
	if _, err := os.Stat(filepath.Join(d.mnt, "t24", "10.npy")); err == nil {
		t.Fatal("t24/10.npy exists before the append")
	}
	growStore(t, "append", src, 22)
	// The next refresh starts within the TTL and takes milliseconds; two
	// TTLs leave room for a loaded machine.
	time.Sleep(2 * time.Second)
	if _, err := os.Stat(filepath.Join(d.mnt, "t24", "10.npy")); err != nil {
		t.Fatalf("t24/10.npy two TTLs after the append: %v", err)
	}
	if n := checkGrowMount(t, d.mnt, src); n != 3*30+1 {
		t.Errorf("checked %d files after the append, want %d", n, 3*30+1)
	}

	before, err := os.ReadFile(filepath.Join(d.mnt, "raw", "05.npy"))
	if err != nil {
		t.Fatal(err)
	}
	rewriteSample(t, src, 5, 0.25)
	time.Sleep(2 * time.Second)
	if after, err := os.ReadFile(filepath.Join(d.mnt, "raw", "05.npy")); err != nil || bytes.Equal(after, before) {
		t.Fatalf("raw/05.npy two TTLs after its chunk was rewritten: %v, old bytes served %v", err, bytes.Equal(after, before))
	}
	if n := checkGrowMount(t, d.mnt, src); n != 3*30+1 {
		t.Errorf("checked %d files after the rewrite", n)
	}
}

// A store that grows past ten time steps renames every sample (0.npy
// becomes 00.npy): a warm links the unchanged samples to their new names
// instead of decoding them again, and `zarrfs cache gc` then removes the
// old names, leaving a cache every file of which a mount serves.
func TestGrowGC(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	src := filepath.Join(t.TempDir(), "grow.zarr")
	growStore(t, "create", src, 8)
	cacheDir := t.TempDir()
	warmWork(t, src, cacheDir)
	growStore(t, "append", src, 4)
	_, decoded := warmWork(t, src, cacheDir)
	// t1: 4 new chunks; t24 (its one chunk rewritten) and time: one each,
	// at most once per sample. raw is not compressed.
	t.Logf("warm after the names widened: %d chunks decoded", decoded)
	if decoded > 4+12+1 {
		t.Errorf("warm after the names widened decoded %d chunks, want at most %d", decoded, 4+12+1)
	}
	// The unchanged samples are links to the old names' files.
	for _, name := range []string{"t1", "t24"} {
		blobs, _ := filepath.Glob(filepath.Join(cacheDir, "blobs", "*", name))
		if len(blobs) != 1 {
			t.Fatalf("%s: %v", name, blobs)
		}
		a, err1 := os.Stat(filepath.Join(blobs[0], "3.npy"))
		b, err2 := os.Stat(filepath.Join(blobs[0], "03.npy"))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if same := os.SameFile(a, b); same != (name == "t1") {
			t.Errorf("%s/03.npy and %s/3.npy are one file: %v, want %v (t24's chunk was rewritten)", name, name, same, name == "t1")
		}
	}
	out, stderr, code := run(t, "cache", "gc", src, "--cache", cacheDir)
	if code != 0 || !strings.Contains(out, "removed 24 stale files") {
		t.Fatalf("cache gc: exit %d\n%s%s", code, out, stderr)
	}
	for p := range blobFiles(t, cacheDir) {
		if name := filepath.Base(p); len(name) == len("0.npy") {
			t.Errorf("old name %s left after gc", p)
		}
	}
	if out, _, _ := run(t, "cache", "gc", src, "--cache", cacheDir); !strings.Contains(out, "removed 0 stale files") {
		t.Errorf("second gc: %s", out)
	}
	d := mountAt(t, src, t.TempDir(), cacheDir)
	if n := checkGrowMount(t, d.mnt, src); n != 3*12+1 {
		t.Errorf("checked %d files", n)
	}
}

// The same on S3 (MinIO), where a chunk's version is its ETag: a warm
// after an append fills only new and changed samples, and a mount with
// --metadata-ttl 1s shows the append and, after a chunk is rewritten in
// place with the same size, serves its new bytes.
func TestGrowS3(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	srv := miniotest.Start(t)
	bucket := srv.NewBucket(t)
	s3Env(t, srv)
	local := filepath.Join(t.TempDir(), "grow.zarr")
	// Uploading the whole store each time is what a sync does: unchanged
	// objects keep their bytes, hence their ETag.
	upload := func() { srv.UploadDir(t, bucket, "grow.zarr", local) }
	checkGrowRemote(t, "s3://"+bucket+"/grow.zarr", local, upload, "--s3-endpoint", srv.Endpoint)
}

// Direct mode follows the store too: after a chunk is rewritten in place
// and the TTL has passed, resolving a sample's link fills and names its
// new version, while a reader that opened the old cache file keeps it.
func TestGrowMountDirect(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	src := filepath.Join(t.TempDir(), "grow.zarr")
	growStore(t, "create", src, 12)
	d := mount(t, src, "--direct", "--metadata-ttl", "1s")
	p := filepath.Join(d.mnt, "raw", "05.npy")
	before, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(p) // the cache file itself, through the links
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	rewriteSample(t, src, 5, 0.25)
	time.Sleep(2 * time.Second)
	after, err := os.ReadFile(p)
	if err != nil || bytes.Equal(after, before) {
		t.Fatalf("raw/05.npy through its link two TTLs after the rewrite: %v, old bytes %v", err, bytes.Equal(after, before))
	}
	old := make([]byte, len(before))
	if _, err := held.ReadAt(old, 0); err != nil || !bytes.Equal(old, before) {
		t.Errorf("a reader of the old version lost it: %v", err)
	}
	if n := checkGrowMount(t, d.mnt, src); n != 3*12+1 {
		t.Errorf("checked %d files", n)
	}
}
