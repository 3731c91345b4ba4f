package integration

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cacheFS returns a directory on a tmpfs of the given size for a cache
// (root only; otherwise a plain temporary directory).
func cacheFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if os.Geteuid() != 0 {
		return dir
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Logf("no tmpfs (%v): cache on the temporary directory's filesystem", err)
		return dir
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// readErrno opens and reads a file, returning the errno (0 on success) and
// how long it took.
func readErrno(p string) (syscall.Errno, time.Duration) {
	start := time.Now()
	_, err := os.ReadFile(p)
	var en syscall.Errno
	if err != nil && !errors.As(err, &en) {
		en = syscall.EINVAL
	}
	return en, time.Since(start)
}

// rssBytes is the resident memory of a process.
func rssBytes(pid int) int64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n << 10
			}
		}
	}
	return 0
}

func alive(d *daemon) bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

// Shapes and chunks a store may declare cannot crash the daemon: t
// reshaped to [30, 3, 100000, 100000] (a 120 GB sample, each chunk row of
// it 80 GB) and an array whose one chunk needs more memory than --memory
// allows. Reading them fails with EIO and one log line each, quickly;
// every other file reads; the daemon stays within its memory budget.
func TestAbsurdShapes(t *testing.T) {
	requireMountTools(t)
	fx := fixturesDir(t)
	store := filepath.Join(t.TempDir(), "a.zarr")
	copyTree(t, filepath.Join(fx, "public_a.zarr"), store)
	meta := filepath.Join(store, "t", "zarr.json")
	b, _ := os.ReadFile(meta)
	b = bytes.Replace(b, []byte(`"shape":[12,3,16,24]`), []byte(`"shape":[30,3,100000,100000]`), 1)
	os.WriteFile(meta, b, 0o644)
	os.MkdirAll(filepath.Join(store, "big"), 0o755)
	os.WriteFile(filepath.Join(store, "big", "zarr.json"), []byte(`{"zarr_format":3,"node_type":"array","shape":[2,4096,4096],"data_type":"float32",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,4096,4096]}},"chunk_key_encoding":{"name":"default"},
"codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1}}],
"fill_value":0,"dimension_names":["time","latitude","longitude"],"attributes":{}}`), 0o644)

	d := mountAt(t, store, t.TempDir(), cacheFS(t, "96m"), "--memory", "256MiB")
	if st, err := os.Stat(filepath.Join(d.mnt, "t", "00.npy")); err != nil || st.Size() != 4096+3*100000*100000*4 {
		t.Fatalf("t/00.npy: %v", err)
	}
	for _, p := range []string{"t/00.npy", "t/29.npy", "big/0.npy"} {
		en, took := readErrno(filepath.Join(d.mnt, p))
		if en != syscall.EIO || took > 20*time.Second {
			t.Errorf("%s: errno %v after %v, want EIO quickly", p, en, took)
		}
	}
	if !alive(d) {
		t.Fatalf("daemon died: %v\n%s", d.err, d.stderr)
	}
	for _, p := range []string{"z/00.npy", "q/11.npy", "lsm.npy", "time.npy"} {
		if en, _ := readErrno(filepath.Join(d.mnt, p)); en != 0 {
			t.Errorf("%s: %v after the absurd arrays failed", p, en)
		}
	}
	logs := d.stderr.String()
	if n := strings.Count(logs, "cannot fill file"); n != 3 {
		t.Errorf("%d fault lines, want one per failed file:\n%s", n, logs)
	}
	if !strings.Contains(logs, "memory budget") || !strings.Contains(logs, "do not fit") {
		t.Errorf("causes not logged:\n%s", logs)
	}
	t.Logf("daemon log:\n%s", logs)
	if rss := rssBytes(d.cmd.Process.Pid); rss > 256<<20 {
		t.Errorf("daemon RSS %d MiB, budget 256 MiB", rss>>20)
	}
}

// A second mount on a live zarrfs mountpoint is refused (it would hide the
// first mount's tree); the first keeps serving.
func TestMountTwiceRefused(t *testing.T) {
	requireMountTools(t)
	fx := fixturesDir(t)
	d := mount(t, filepath.Join(fx, "public_a.zarr"))
	_, stderr, code := run(t, "mount", filepath.Join(fx, "public_b.zarr"), d.mnt, "--cache", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "already a zarrfs mount") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("second mount: exit %d, %q", code, stderr)
	}
	if en, _ := readErrno(filepath.Join(d.mnt, "t", "00.npy")); en != 0 {
		t.Errorf("first mount after the refused second: %v", en)
	}
}
