package integration

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// directView is a 4-channel view over the example store, for the
// direct-mode tests.
const directView = `views:
  - name: train
    channels:
      - var: t
        select: {level: all}
      - var: u10
`

func writeView(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "train.yaml")
	if err := os.WriteFile(p, []byte(directView), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// referenceBlobs warms src into a cache of its own and returns its blobs:
// what every mount of src must serve.
func referenceBlobs(t testing.TB, src string) map[string][]byte {
	t.Helper()
	ref := t.TempDir()
	warm(t, src, ref)
	return blobFiles(t, ref)
}

// npyFiles lists the .npy paths of a mount (relative), without resolving
// anything: lstat only.
func npyFiles(t testing.TB, mnt string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(mnt, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, ".npy") {
			rel, _ := filepath.Rel(mnt, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A direct mount lists the same files as a plain one, each a symbolic
// link; listing, lstat and readlink (ls -l) fill nothing; resolving a link
// ends at a regular file under the cache holding exactly the bytes the
// plain mount serves, and numpy reads it.
func TestDirectMode(t *testing.T) {
	requirePython(t)
	ex := zarrtest.Example{Times: 6, Levels: 3, Lat: 19, Lon: 36, TimeChunk: 2}
	src := exampleStore(t, ex)
	view := writeView(t)
	plain := mount(t, src, "--view", view)
	direct := mount(t, src, "--view", view, "--direct")

	files := npyFiles(t, plain.mnt)
	if got := npyFiles(t, direct.mnt); !slices.Equal(got, files) {
		t.Fatalf("direct mount lists %v, plain %v", got, files)
	}
	if len(files) < 3*ex.Times {
		t.Fatalf("only %d files", len(files))
	}
	for _, f := range files {
		p := filepath.Join(direct.mnt, f)
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("%s: mode %v, want a symbolic link", f, st.Mode())
		}
		target, err := os.Readlink(p)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.IsAbs(target) || int64(len(target)) != st.Size() {
			t.Errorf("%s -> %s (lstat size %d): want a relative target of that length", f, target, st.Size())
		}
	}
	ents, _ := os.ReadDir(filepath.Join(direct.mnt))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("the mount lists %s", e.Name())
		}
	}
	if n := countNPY(filepath.Join(direct.cache, "blobs")); n != 0 {
		t.Fatalf("listing, lstat and readlink filled %d blobs", n)
	}

	blobRoot, _ := filepath.EvalSymlinks(filepath.Join(direct.cache, "blobs"))
	for _, f := range files {
		want, err := os.ReadFile(filepath.Join(plain.mnt, f))
		if err != nil {
			t.Fatal(err)
		}
		real, err := filepath.EvalSymlinks(filepath.Join(direct.mnt, f))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !strings.HasPrefix(real, blobRoot+"/") || !strings.HasSuffix(real, "/"+f) {
			t.Errorf("%s resolves to %s, want a file under %s", f, real, blobRoot)
		}
		st, err := os.Lstat(real)
		if err != nil || !st.Mode().IsRegular() {
			t.Fatalf("%s: target %s is not a regular file: %v", f, real, err)
		}
		got, err := os.ReadFile(real)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the cache file differs from the plain mount's file", f)
		}
	}
	out := python(t, `
import sys, numpy as np
m = sys.argv[1]
for f in sys.argv[2:]:
    a = np.load(m + '/' + f)
    b = np.load(m + '/' + f, mmap_mode='r')
    assert a.tobytes() == np.asarray(b).tobytes(), f
print(len(sys.argv) - 2)
`, append([]string{direct.mnt}, files...)...)
	if strings.TrimSpace(out) != fmt.Sprint(len(files)) {
		t.Errorf("numpy read %s files, want %d", out, len(files))
	}
}

// A cold link resolves to a complete blob: many readers resolving the
// same cold links at once all read the right bytes, and the first stat of
// a link already sees the blob's full size.
func TestDirectColdResolution(t *testing.T) {
	requireMountTools(t)
	ex := zarrtest.Example{Times: 8, Levels: 4, Lat: 91, Lon: 180, TimeChunk: 4}
	src := exampleStore(t, ex)
	want := referenceBlobs(t, src)
	d := mount(t, src, "--direct", "--readahead", "0")
	var wg sync.WaitGroup
	var bad atomic.Int64
	for r := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ex.Times {
				f := fmt.Sprintf("t/%d.npy", (i+r)%ex.Times)
				st, err := os.Stat(filepath.Join(d.mnt, f))
				if err != nil || st.Size() != int64(len(want[f])) {
					t.Errorf("stat %s: %v (size %v), want %d bytes", f, err, st, len(want[f]))
					bad.Add(1)
					continue
				}
				got, err := os.ReadFile(filepath.Join(d.mnt, f))
				if err != nil || !bytes.Equal(got, want[f]) {
					t.Errorf("%s: %v or wrong bytes", f, err)
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if bad.Load() > 0 {
		t.Logf("daemon log:\n%s", d.stderr)
	}
}

// Per-rank directories list exactly what `zarrfs warm` fills for the
// same rank, for both shard modes, in arrays and views; a rank reading
// all its files from a cache warmed for it fills nothing more.
func TestDirectRankDirectories(t *testing.T) {
	requireMountTools(t)
	ex := zarrtest.Example{Times: 10, Levels: 2, Lat: 9, Lon: 16, TimeChunk: 3}
	src := exampleStore(t, ex)
	view := writeView(t)
	const world = 3
	for _, mode := range []string{"contiguous", "interleaved"} {
		t.Run(mode, func(t *testing.T) {
			seen := map[string]int{}
			for rank := range world {
				cacheDir := t.TempDir()
				args := []string{"--view", view, "--rank", itoa(rank), "--world", itoa(world), "--shard", mode}
				warm(t, src, cacheDir, args...)
				warmed := blobFiles(t, cacheDir)
				d := mountAt(t, src, t.TempDir(), cacheDir, append(args, "--direct")...)
				listed := npyFiles(t, d.mnt)
				var wantList []string
				for p := range warmed {
					wantList = append(wantList, p)
				}
				slices.Sort(wantList)
				slices.Sort(listed)
				if !slices.Equal(listed, wantList) {
					t.Errorf("rank %d lists %v, warm filled %v", rank, listed, wantList)
				}
				share := layout.Shard{Rank: rank, World: world, Interleaved: mode == "interleaved"}.Of(0, int64(ex.Times))
				for _, p := range listed {
					if strings.Contains(p, "/") {
						if !share.Contains(int64(sampleIndex(p))) {
							t.Errorf("rank %d lists %s, outside its share %+v", rank, p, share)
						}
						seen[p]++
					}
					b, err := os.ReadFile(filepath.Join(d.mnt, p))
					if err != nil || !bytes.Equal(b, warmed[p]) {
						t.Errorf("rank %d: %s: %v or bytes differ from the warmed blob", rank, p, err)
					}
				}
				if got := len(blobFiles(t, cacheDir)); got != len(warmed) {
					t.Errorf("rank %d: reading its share changed the cache from %d to %d blobs", rank, len(warmed), got)
				}
				for _, dir := range []string{"t", "train"} {
					if _, err := os.Lstat(filepath.Join(d.mnt, dir, sampleName(share.At(share.Count), ex.Times))); share.At(share.Count) < int64(ex.Times) && !errors.Is(err, os.ErrNotExist) {
						t.Errorf("rank %d: a sample outside its share is reachable in %s: %v", rank, dir, err)
					}
				}
				d.stop(t)
			}
			for _, dir := range []string{"t", "z", "u10", "train"} {
				for i := range ex.Times {
					if p := dir + "/" + sampleName(int64(i), ex.Times); seen[p] != 1 {
						t.Errorf("%s listed by %d ranks, want 1", p, seen[p])
					}
				}
			}
		})
	}
}

func sampleName(i int64, n int) string {
	return fmt.Sprintf("%0*d.npy", len(fmt.Sprint(n-1)), i)
}

// Under a cache budget far smaller than the data, with readers resolving
// and reading links concurrently, no reader ever sees ENOENT or a wrong
// byte: a resolved blob is leased, and an evicted one is filled again when
// its link is resolved.
func TestDirectEvictionWithinLease(t *testing.T) {
	requireMountTools(t)
	ex := zarrtest.Example{Times: 24, Levels: 2, Lat: 61, Lon: 120, TimeChunk: 1}
	src := exampleStore(t, ex)
	want := referenceBlobs(t, src)
	var names []string
	var total int64
	for p, b := range want {
		if strings.Contains(p, "/") {
			names = append(names, p)
			total += int64(len(b))
		}
	}
	slices.Sort(names)
	budget := total / 8
	d := mount(t, src, "--direct", "--cache-size", itoa64(budget), "--lease", "300ms", "--readahead", "0")
	// The readers move through the files in windows (an epoch's batches):
	// leases of a window they left run out and its blobs become evictable.
	const windows, phase = 6, 600 * time.Millisecond
	start := time.Now()
	deadline := start.Add(windows * phase)
	var reads, failures atomic.Int64
	var wg sync.WaitGroup
	for r := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			w := len(names) / windows
			for time.Now().Before(deadline) {
				k := min(int(time.Since(start)/phase), windows-1)
				if k == windows-1 {
					k = 0 // back to blobs evicted meanwhile: their links refill them
				}
				f := names[k*w+rng.IntN(w)]
				got, err := os.ReadFile(filepath.Join(d.mnt, f))
				reads.Add(1)
				if err != nil || !bytes.Equal(got, want[f]) {
					if failures.Add(1) <= 5 {
						t.Errorf("%s: %v or wrong bytes", f, err)
					}
				}
			}
		}()
	}
	maxPresent := 0
	for time.Now().Before(deadline) {
		maxPresent = max(maxPresent, countNPY(filepath.Join(d.cache, "blobs")))
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("%d reads, %d failures; at most %d of %d blobs present at a time", reads.Load(), failures.Load(), maxPresent, len(names))
	if reads.Load() < int64(4*len(names)) {
		t.Errorf("only %d reads", reads.Load())
	}
	// Eviction really happened while the readers ran (every blob was read,
	// never all at once present), so the refill path was exercised.
	if maxPresent >= len(names) {
		t.Errorf("all %d blobs were present at once: nothing was evicted", maxPresent)
	}
}

// A link whose fill fails resolves to EIO, for that file only; the
// failure is logged once with array, chunk and cause; nothing partial
// lands in the cache; other links keep working.
func TestDirectFillError(t *testing.T) {
	requireMountTools(t)
	fx := fixturesDir(t)
	store := filepath.Join(t.TempDir(), "a.zarr")
	copyTree(t, filepath.Join(fx, "public_a.zarr"), store)
	// t has chunks (4, 2, 8, 16): chunk 0/0/0/0 holds samples 0..3.
	if err := os.WriteFile(filepath.Join(store, "t", "c", "0", "0", "0", "0"), bytes.Repeat([]byte("garbage!"), 64), 0o644); err != nil {
		t.Fatal(err)
	}
	d := mount(t, store, "--direct")
	for i := range 12 {
		_, err := os.Stat(filepath.Join(d.mnt, "t", fmt.Sprintf("%02d.npy", i)))
		if i < 4 && !errors.Is(err, syscall.EIO) {
			t.Errorf("t/%02d.npy: %v, want EIO", i, err)
		}
		if i >= 4 && err != nil {
			t.Errorf("t/%02d.npy: %v", i, err)
		}
	}
	if _, err := os.ReadFile(filepath.Join(d.mnt, "z", "00.npy")); err != nil {
		t.Errorf("z/00.npy: %v", err)
	}
	d.stop(t) // count the lines once the log is whole
	logs := d.stderr.String()
	if strings.Count(logs, "cannot fill file") != 1 || !strings.Contains(logs, "chunk=t/c/0/0/0/0") {
		t.Errorf("want one log line naming chunk t/c/0/0/0/0:\n%s", logs)
	}
	if n := countNPY(filepath.Join(d.cache, "blobs", "x")); n != 0 {
		t.Errorf("%d partial files", n)
	}
	filepath.WalkDir(filepath.Join(d.cache, "blobs"), func(p string, e os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, filepath.Join("t", "00.npy")) {
			t.Errorf("failed blob visible in the cache: %s", p)
		}
		return nil
	})
}

// O_DIRECT opens of plain mount files (DALI's use_o_direct, cuFile)
// succeed and read the same bytes, with and without FUSE passthrough.
func TestODirectReads(t *testing.T) {
	requireMountTools(t)
	ex := zarrtest.Example{Times: 4, Levels: 2, Lat: 33, Lon: 64, TimeChunk: 1}
	src := exampleStore(t, ex)
	want := referenceBlobs(t, src)
	for _, mode := range []string{"passthrough", "no-passthrough"} {
		t.Run(mode, func(t *testing.T) {
			var args []string
			if mode == "no-passthrough" {
				args = append(args, "--no-passthrough")
			}
			d := mount(t, src, args...)
			buf := alignedBuffer(t, 1<<20)
			for p, w := range want {
				fd, err := syscall.Open(filepath.Join(d.mnt, p), syscall.O_RDONLY|syscall.O_DIRECT, 0)
				if err != nil {
					t.Fatalf("open %s O_DIRECT: %v", p, err)
				}
				var got []byte
				for off := int64(0); ; {
					n, err := syscall.Pread(fd, buf, off)
					if err != nil {
						t.Fatalf("pread %s at %d: %v", p, off, err)
					}
					if n == 0 {
						break
					}
					got = append(got, buf[:n]...)
					off += int64(n)
				}
				syscall.Close(fd)
				if !bytes.Equal(got, w) {
					t.Errorf("%s: O_DIRECT read %d bytes differing from the blob (%d)", p, len(got), len(w))
				}
			}
			// status says how reads are served.
			text, stderr, code := run(t, "status", d.mnt)
			if code != 0 {
				t.Fatalf("status: %d %s", code, stderr)
			}
			if mode == "no-passthrough" && !strings.Contains(text, "plain (reads through the daemon)") {
				t.Errorf("status of a mount without passthrough:\n%s", text)
			}
		})
	}
}

// alignedBuffer returns n bytes aligned to 4096, as O_DIRECT wants.
func alignedBuffer(t testing.TB, n int) []byte {
	b := make([]byte, n+4096)
	off := (4096 - int(uintptr(unsafe.Pointer(&b[0]))%4096)) % 4096
	return b[off : off+n]
}

// DALI's numpy reader (CPU) reads a direct mount unchanged: every sample
// of a view and of an array, equal to numpy's reading of the plain mount;
// with per-rank direct mounts, two ranks together read every sample once.
func TestDirectDALI(t *testing.T) {
	requirePython(t)
	requireDALI(t)
	ex := zarrtest.Example{Times: 6, Levels: 2, Lat: 19, Lon: 36, TimeChunk: 2}
	src := exampleStore(t, ex)
	view := writeView(t)
	plain := mount(t, src, "--view", view)
	direct := mount(t, src, "--view", view, "--direct")
	const daliCheck = `
import json, os, sys
import numpy as np
from nvidia.dali import pipeline_def, fn
plain, roots = sys.argv[1], sys.argv[2:]
seen = []
for root in roots:
    files = sorted(f for f in os.listdir(root) if f.endswith('.npy'))
    @pipeline_def(batch_size=1, num_threads=2, device_id=None)
    def pipe():
        data = fn.readers.numpy(device='cpu', file_root=root, file_filter='*.npy', name='r')
        return data, fn.get_property(data, key='source_info')
    p = pipe()
    p.build()
    for _ in range(len(files)):
        data, info = p.run()
        src = bytes(np.array(info[0])).decode()
        name = os.path.basename(src)
        d = os.path.basename(os.path.normpath(root))
        want = np.load(os.path.join(plain, d, name))
        got = np.array(data[0])
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), src
        seen.append(d + '/' + name)
print(json.dumps(seen))
`
	for _, dir := range []string{"train", "t"} {
		out := python(t, daliCheck, plain.mnt, filepath.Join(direct.mnt, dir))
		if n := strings.Count(out, ".npy"); n != ex.Times {
			t.Errorf("DALI read %d samples of %s, want %d: %s", n, dir, ex.Times, out)
		}
	}
	var roots []string
	for rank := range 2 {
		d := mount(t, src, "--view", view, "--direct", "--rank", itoa(rank), "--world", "2")
		roots = append(roots, filepath.Join(d.mnt, "train"))
	}
	out := python(t, daliCheck, append([]string{plain.mnt}, roots...)...)
	for i := range ex.Times {
		if n := strings.Count(out, fmt.Sprintf(`"train/%d.npy"`, i)); n != 1 {
			t.Errorf("train/%d.npy read %d times by two ranks, want 1: %s", i, n, out)
		}
	}
}

func requireDALI(t testing.TB) {
	t.Helper()
	if err := exec.Command("python3", "-c", "import nvidia.dali").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI is set and DALI is missing (make pydeps installs it): %v", err)
		}
		t.Skip("DALI (nvidia-dali-cuda130) is needed: make pydeps installs it")
	}
}

// A blob larger than the whole cache budget has no file to link to: its
// link fails with EIO and a line saying why; smaller ones still resolve.
func TestDirectBlobOverBudget(t *testing.T) {
	requireMountTools(t)
	ex := zarrtest.Example{Times: 2, Levels: 2, Lat: 91, Lon: 180, TimeChunk: 1}
	src := exampleStore(t, ex)
	d := mount(t, src, "--direct", "--cache-size", "100KiB", "--readahead", "0")
	if _, err := os.Stat(filepath.Join(d.mnt, "t", "0.npy")); !errors.Is(err, syscall.EIO) {
		t.Errorf("t/0.npy (131 KiB, budget 100 KiB): %v, want EIO", err)
	}
	if _, err := os.ReadFile(filepath.Join(d.mnt, "latitude.npy")); err != nil {
		t.Errorf("latitude.npy: %v", err)
	}
	if !strings.Contains(d.logs("larger than the cache budget"), "larger than the cache budget") {
		t.Errorf("no line says why:\n%s", d.stderr)
	}
	// Refused before it was filled: nothing decoded it to throw it away.
	d.stop(t)
	if strings.Contains(d.stderr.String(), "served without caching") {
		t.Errorf("the refused blob was filled:\n%s", d.stderr)
	}
}
