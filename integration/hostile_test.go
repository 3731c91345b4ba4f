package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// cacheFS returns a directory on a tmpfs of the given size for a cache.
// Where no tmpfs can be mounted (not root) it returns a plain temporary
// directory, unless required: then the test cannot run.
func cacheFS(t *testing.T, size string, required bool) string {
	t.Helper()
	dir := t.TempDir()
	var err error = syscall.EPERM
	if os.Geteuid() == 0 {
		err = syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size)
	}
	if err != nil {
		if required {
			testenv.Missing(t, "a tmpfs of %s for the cache: %v", size, err)
		}
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
	// A chunk of two 64 MiB samples: decoded beside the sample it fills,
	// past what fills get of --memory 256MiB.
	os.WriteFile(filepath.Join(store, "big", "zarr.json"), []byte(`{"zarr_format":3,"node_type":"array","shape":[2,4096,4096],"data_type":"float32",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2,4096,4096]}},"chunk_key_encoding":{"name":"default"},
"codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1}}],
"fill_value":0,"dimension_names":["time","latitude","longitude"],"attributes":{}}`), 0o644)

	d := mountAt(t, store, t.TempDir(), cacheFS(t, "96m", false), "--memory", "256MiB")
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
	eventually(func() bool { return strings.Count(d.stderr.String(), "cannot fill file") >= 3 })
	logs := d.logs("memory budget", "do not fit")
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

// Symbolic links and odd metadata: an array directory linked outside the
// store, a zarr.json without node_type and a zarr.json that is a FIFO are
// each left out with a warning and an unsupported entry, the rest mounts; a
// chunk linked outside the store is EIO by default and reads with
// --follow-symlinks, as does the linked array (git-annex and DVC layouts).
func TestSymlinksAndOddMetadata(t *testing.T) {
	requireMountTools(t)
	fx := fixturesDir(t)
	store := filepath.Join(t.TempDir(), "a.zarr")
	copyTree(t, filepath.Join(fx, "public_a.zarr"), store)
	annex := t.TempDir()
	// u10 lives outside, linked in.
	if err := os.Rename(filepath.Join(store, "u10"), filepath.Join(annex, "u10")); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(annex, "u10"), filepath.Join(store, "u10"))
	// One chunk of t is a link into the annex.
	chunk := filepath.Join(store, "t", "c", "0", "0", "0", "0")
	os.Rename(chunk, filepath.Join(annex, "t-chunk"))
	os.Symlink(filepath.Join(annex, "t-chunk"), chunk)
	// z's zarr.json has no node_type; lsm's is a FIFO.
	zj := filepath.Join(store, "z", "zarr.json")
	b, _ := os.ReadFile(zj)
	os.WriteFile(zj, bytes.Replace(b, []byte(`"node_type":"array",`), nil, 1), 0o644)
	os.Remove(filepath.Join(store, "lsm", "zarr.json"))
	if err := syscall.Mkfifo(filepath.Join(store, "lsm", "zarr.json"), 0o644); err != nil {
		t.Fatal(err)
	}

	out, stderr, code := run(t, "inspect", "--json", store)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	for arr, reason := range map[string]string{"u10": "symbolic link leaves the store", "z": "node_type", "lsm": "not a regular file"} {
		if !strings.Contains(out, `"path":"`+arr+`"`) && !strings.Contains(out, `"path": "`+arr+`"`) {
			t.Errorf("inspect lists no %s:\n%s", arr, out)
		}
		if !strings.Contains(out, reason) {
			t.Errorf("inspect gives no reason %q for %s:\n%s", reason, arr, out)
		}
	}

	ref := t.TempDir()
	warm(t, filepath.Join(fx, "public_a.zarr"), ref, "--only", "t/00.npy", "--only", "u10/03.npy")
	want := blobFiles(t, ref)

	d := mount(t, store)
	for _, p := range []string{"u10", "z", "lsm.npy"} {
		if _, err := os.Stat(filepath.Join(d.mnt, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want absent", p, err)
		}
	}
	logs := d.logs("array=u10", "array=z", "array=lsm")
	for _, arr := range []string{"array=u10", "array=z", "array=lsm"} {
		if !strings.Contains(logs, arr) {
			t.Errorf("no warning for %s:\n%s", arr, logs)
		}
	}
	if en, _ := readErrno(filepath.Join(d.mnt, "t", "00.npy")); en != syscall.EIO {
		t.Errorf("t/00.npy through a chunk linked outside: %v, want EIO", en)
	}
	if en, _ := readErrno(filepath.Join(d.mnt, "t", "04.npy")); en != 0 {
		t.Errorf("t/04.npy: %v", en)
	}

	f := mount(t, store, "--follow-symlinks")
	for _, p := range []string{"t/00.npy", "u10/03.npy"} {
		got, err := os.ReadFile(filepath.Join(f.mnt, p))
		if err != nil || !bytes.Equal(got, want[p]) {
			t.Errorf("%s with --follow-symlinks: %v (%d bytes, want %d)", p, err, len(got), len(want[p]))
		}
	}
}

// `zarrfs path` finds a mount whose --cache was relative, from another
// working directory and with another XDG_RUNTIME_DIR than the daemon's.
func TestPathFromElsewhere(t *testing.T) {
	requireMountTools(t)
	fx := fixturesDir(t)
	work, mnt := t.TempDir(), t.TempDir()
	cmd := exec.Command(zarrfsBin(t), "mount", filepath.Join(fx, "public_a.zarr"), mnt, "--cache", "rel-cache")
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+t.TempDir())
	d := startDaemon(t, cmd, mnt)
	want, err := os.ReadFile(filepath.Join(d.mnt, "t", "03.npy"))
	if err != nil {
		t.Fatal(err)
	}
	p := exec.Command(zarrfsBin(t), "path", filepath.Join(d.mnt, "t", "03.npy"))
	p.Dir = t.TempDir()
	p.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+t.TempDir())
	out, err := p.CombinedOutput()
	backing := strings.TrimSpace(string(out))
	if err != nil || !filepath.IsAbs(backing) || !strings.HasPrefix(backing, filepath.Join(work, "rel-cache")) {
		t.Fatalf("zarrfs path: %v: %q", err, out)
	}
	if got, err := os.ReadFile(backing); err != nil || !bytes.Equal(got, want) {
		t.Errorf("backing file %s: %v", backing, err)
	}
}

// startDaemon starts a prepared `zarrfs mount` command and waits for its
// mounted line; Cleanup stops it as mountAt's daemons are stopped.
func startDaemon(t *testing.T, cmd *exec.Cmd, mnt string) *daemon {
	t.Helper()
	d := &daemon{t: t, cmd: cmd, mnt: mnt, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = d.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		for sc.Scan() {
		}
	}()
	go func() { d.err = cmd.Wait(); close(d.done) }()
	select {
	case l, ok := <-line:
		if !ok {
			<-d.done
			t.Fatalf("zarrfs mount exited before mounting: %v\n%s", d.err, d.stderr)
		}
		d.line = l
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("zarrfs mount: no mounted line within 60s\n%s", d.stderr)
	}
	t.Cleanup(func() { d.stop(t) })
	return d
}

// A failure that repeats for every file writes a few lines and a count:
// with --cache-size 1KiB every blob is too large to keep.
func TestLogFloodsSummarised(t *testing.T) {
	requireMountTools(t)
	fx := fixturesDir(t)
	d := mount(t, filepath.Join(fx, "public_a.zarr"), "--cache-size", "1KiB", "--readahead", "0")
	n := 0
	filepath.WalkDir(d.mnt, func(p string, e os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".npy") {
			// Files too large to keep are served without caching.
			for range 2 {
				if _, err := os.ReadFile(p); err != nil {
					t.Errorf("%s: %v", p, err)
				}
			}
			n++
		}
		return nil
	})
	if n < 50 {
		t.Fatalf("read only %d files", n)
	}
	d.stop(t) // the log is whole once the daemon has exited
	if lines := strings.Count(d.stderr.String(), "larger than the cache budget"); lines < 1 || lines > 11 {
		t.Errorf("%d lines for %d files too large to keep, want 1 to 10 and a summary", lines, n)
	}
}

// A cache on a 1 MiB filesystem, without --cache-size: every file reads
// (the cache evicts to what the filesystem holds); after a kill, with the
// filesystem then filled by something else, mount and warm still start
// and serve.
func TestCacheOnFullFilesystem(t *testing.T) {
	requireMountTools(t)
	// About 2.5 MiB of blobs.
	src := exampleStore(t, zarrtest.Example{Times: 48, Levels: 2, Lat: 33, Lon: 64, TimeChunk: 4})
	fsDir := cacheFS(t, "1m", true)
	cacheDir := filepath.Join(fsDir, "cache")
	readAll := func(mnt string) (ok, failed int) {
		filepath.WalkDir(mnt, func(p string, e os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".npy") {
				if _, err := os.ReadFile(p); err != nil {
					failed++
					t.Errorf("%s: %v", p, err)
				} else {
					ok++
				}
			}
			return nil
		})
		return
	}
	mnt := t.TempDir()
	d := mountAt(t, src, mnt, cacheDir, "--readahead", "0")
	for range 2 {
		if ok, failed := readAll(d.mnt); failed > 0 || ok < 100 {
			t.Fatalf("%d files read, %d failed on a 1 MiB cache", ok, failed)
		}
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
	// Something else takes the rest of the filesystem.
	junk, err := os.Create(filepath.Join(fsDir, "junk"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := junk.Write(buf); err != nil {
			break
		}
	}
	junk.Close()
	out := warm(t, src, cacheDir, "--only", "t", "--samples", "0:2")
	if !strings.Contains(out, "zarrfs: ") {
		t.Errorf("warm on a full filesystem: %s", out)
	}
	d = mountAt(t, src, mnt, cacheDir, "--readahead", "0") // clears the stale mount
	if ok, failed := readAll(d.mnt); failed > 0 || ok < 100 {
		t.Fatalf("after a kill on a full filesystem: %d files read, %d failed", ok, failed)
	}
}

// zarrPythonVerdicts opens every array directory under root with
// zarr-python (format fmt) and reads it whole: the error of each that
// zarr-python refuses, "" for each it reads.
const zarrPythonVerdicts = `
import json, os, sys, warnings
warnings.filterwarnings('ignore')
import zarr
root, fmt = sys.argv[1], int(sys.argv[2])
out = {}
for name in sorted(os.listdir(root)):
    p = os.path.join(root, name)
    if not os.path.isdir(p):
        continue
    try:
        a = zarr.open_array(p, mode='r', zarr_format=fmt)
        a[...]
        out[name] = ''
    except Exception as e:
        out[name] = (type(e).__name__ + ': ' + str(e))[:200]
print(json.dumps(out))
`

// Metadata zarr-python refuses, zarrfs refuses (the array left out, with
// its reason), and metadata zarr-python reads, zarrfs reads: trailing
// data after the JSON, zarr_format, dimension names, blosc settings and
// fill values out of their dtype's range, each checked against zarr-python
// itself.
func TestStrictMetadataLikeZarrPython(t *testing.T) {
	requirePython(t)
	if err := exec.Command("python3", "-c", "import zarr").Run(); err != nil {
		testenv.Missing(t, "zarr-python is needed (make pydeps)")
	}
	v3 := func(dtype, fill string, extra ...string) string {
		endian := `{"name":"bytes","configuration":{"endian":"little"}}`
		codecs := endian
		dims := ""
		format := `3`
		for _, e := range extra {
			switch {
			case strings.HasPrefix(e, "codec:"):
				codecs = endian + "," + strings.TrimPrefix(e, "codec:")
			case strings.HasPrefix(e, "dims:"):
				dims = `"dimension_names":` + strings.TrimPrefix(e, "dims:") + `,`
			case strings.HasPrefix(e, "format:"):
				format = strings.TrimPrefix(e, "format:")
			}
		}
		zf := `"zarr_format":` + format + `,`
		if format == "" {
			zf = ""
		}
		return `{` + zf + `"node_type":"array","shape":[4],"data_type":"` + dtype + `",` +
			`"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2]}},"chunk_key_encoding":{"name":"default"},` +
			`"codecs":[` + codecs + `],` + dims + `"fill_value":` + fill + `,"attributes":{}}`
	}
	v2 := func(dtype, fill, format, compressor string) string {
		zf := `"zarr_format":` + format + `,`
		if format == "" {
			zf = ""
		}
		return `{` + zf + `"shape":[4],"chunks":[2],"dtype":"` + dtype + `","compressor":` + compressor +
			`,"fill_value":` + fill + `,"order":"C","filters":null}`
	}
	blosc := func(cfg string) string { return `codec:{"name":"blosc","configuration":` + cfg + `}` }
	stores := map[int]map[string]string{
		3: {
			"plain":            v3("uint8", "0"),
			"trailing_garbage": v3("uint8", "0") + " garbage",
			"trailing_object":  v3("uint8", "0") + "{}",
			"trailing_space":   v3("uint8", "0") + " \n",
			"format_2":         v3("uint8", "0", "format:2"),
			"format_string":    v3("uint8", "0", `format:"3"`),
			"format_missing":   v3("uint8", "0", "format:"),
			"dims_int":         v3("uint8", "0", "dims:[1]"),
			"dims_null":        v3("uint8", "0", "dims:[null]"),
			"blosc_cname":      v3("uint8", "0", blosc(`{"cname":"bogus","clevel":5,"shuffle":"shuffle","typesize":1,"blocksize":0}`)),
			"blosc_shuffle":    v3("uint8", "0", blosc(`{"cname":"lz4","clevel":5,"shuffle":"bogus","typesize":1,"blocksize":0}`)),
			"blosc_int":        v3("uint8", "0", blosc(`{"cname":"lz4","clevel":5,"shuffle":1,"typesize":1,"blocksize":0}`)),
			"blosc_defaults":   v3("uint8", "0", blosc(`{}`)),
			"u8_300":           v3("uint8", "300"),
			"u8_minus1":        v3("uint8", "-1"),
			"u8_255":           v3("uint8", "255"),
			"u8_2point0":       v3("uint8", "2.0"),
			"i8_200":           v3("int8", "200"),
			"i8_minus128":      v3("int8", "-128"),
			"i64_1e30":         v3("int64", "1e30"),
			"i64_1point5":      v3("int64", "1.5"),
			"u64_max":          v3("uint64", "18446744073709551615"),
			"u64_minus1":       v3("uint64", "-1"),
			"i16_1000point0":   v3("int16", "1000.0"),
			"i32_hex":          v3("int32", `"0x10"`),
			"i8_nan":           v3("int8", `"NaN"`),
			"f32_1e300":        v3("float32", "1e300"),
			"f32_hex":          v3("float32", `"0x3f800000"`),
			"bool_2":           v3("bool", "2"),
		},
		2: {
			"plain":          v2("<i4", "0", "2", "null"),
			"trailing":       v2("<i4", "0", "2", "null") + " x",
			"format_3":       v2("<i4", "0", "3", "null"),
			"format_string":  v2("<i4", "0", `"2"`, "null"),
			"format_missing": v2("<i4", "0", "", "null"),
			"u1_300":         v2("|u1", "300", "2", "null"),
			"u1_minus1":      v2("|u1", "-1", "2", "null"),
			"i1_200":         v2("|i1", "200", "2", "null"),
			"i8_1e30":        v2("<i8", "1e30", "2", "null"),
			"u1_nan":         v2("|u1", `"NaN"`, "2", "null"),
			"f4_nan":         v2("<f4", `"NaN"`, "2", "null"),
			"blosc_cname":    v2("<i4", "0", "2", `{"id":"blosc","cname":"bogus","clevel":5,"shuffle":1,"blocksize":0}`),
		},
	}
	for format, arrays := range stores {
		t.Run(fmt.Sprintf("v%d", format), func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "s.zarr")
			meta, group := "zarr.json", `{"zarr_format":3,"node_type":"group","attributes":{}}`
			if format == 2 {
				meta, group = ".zarray", `{"zarr_format":2}`
				os.MkdirAll(root, 0o755)
				os.WriteFile(filepath.Join(root, ".zgroup"), []byte(group), 0o644)
			} else {
				os.MkdirAll(root, 0o755)
				os.WriteFile(filepath.Join(root, "zarr.json"), []byte(group), 0o644)
			}
			for name, doc := range arrays {
				os.MkdirAll(filepath.Join(root, name), 0o755)
				os.WriteFile(filepath.Join(root, name, meta), []byte(doc), 0o644)
			}
			var zp map[string]string
			if err := json.Unmarshal([]byte(python(t, zarrPythonVerdicts, root, strconv.Itoa(format))), &zp); err != nil {
				t.Fatal(err)
			}
			out, stderr, code := run(t, "inspect", "--json", root)
			if code != 0 {
				t.Fatalf("inspect: exit %d: %s", code, stderr)
			}
			var entries []struct {
				Path        string  `json:"path"`
				Unsupported *string `json:"unsupported"`
			}
			if err := json.Unmarshal([]byte(out), &entries); err != nil {
				t.Fatal(err)
			}
			ours := map[string]string{}
			for _, e := range entries {
				ours[e.Path] = ""
				if e.Unsupported != nil {
					ours[e.Path] = *e.Unsupported
				}
			}
			refused := 0
			for name := range arrays {
				theirs, ok := zp[name]
				if !ok {
					t.Fatalf("zarr-python gave no verdict on %s", name)
				}
				mine, listed := ours[name]
				if !listed {
					t.Errorf("%s: not listed by inspect (zarr-python: %q)", name, theirs)
					continue
				}
				if (theirs != "") != (mine != "") {
					t.Errorf("%s: zarrfs %q, zarr-python %q", name, mine, theirs)
				}
				if theirs != "" {
					refused++
				}
			}
			t.Logf("%d arrays, %d refused by both", len(arrays), refused)
		})
	}
}

// v3Array is a small uint8 array document, with dimension names (time
// first, so that the mount gives it a sample directory) and the given
// codecs after bytes and attributes (JSON members).
func v3Array(codecs, attrs string) string {
	if codecs != "" {
		codecs = "," + codecs
	}
	return `{"zarr_format":3,"node_type":"array","shape":[2,4],"data_type":"uint8",` +
		`"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,4]}},"chunk_key_encoding":{"name":"default"},` +
		`"codecs":[{"name":"bytes"}` + codecs + `],"fill_value":7,"dimension_names":["time","x"],"attributes":{` + attrs + `}}`
}

func writeDoc(t testing.TB, path, doc string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeIntList writes a zarr.json whose attributes hold one list of n
// zeros (2n bytes of JSON): the cheapest text for the most values.
func writeIntList(t testing.TB, path, head string, n int) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString(head + `"attributes":{"big":[0`)
	for range n - 1 {
		w.WriteString(",0")
	}
	w.WriteString(`]}}`)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// peakRSS is a process's peak resident memory (VmHWM) while it runs.
func peakRSS(pid int) int64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n << 10
			}
		}
	}
	return 0
}

// Metadata cannot make the daemon allocate without bound: a 120 MB
// zarr.json (attributes of 60 million integers, which would take gigabytes
// parsed) leaves its array out with one line naming the file and the
// limit, refused before it is read, and the mount stays within its
// memory; the same document at the root fails the mount with one line;
// past the limits on the tree's total and node count the mount fails with
// one line too; attributes larger than the per-array limit are named in
// the sidecar, not copied into it.
func TestMetadataLimits(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 4, Levels: 2, Lat: 8, Lon: 16, TimeChunk: 1})
	head := `{"zarr_format":3,"node_type":"array","shape":[2,4],"data_type":"uint8",` +
		`"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,4]}},"chunk_key_encoding":{"name":"default"},` +
		`"codecs":[{"name":"bytes"}],"fill_value":7,"dimension_names":["time","x"],`
	writeIntList(t, filepath.Join(src, "huge", "zarr.json"), head, 60_000_000)
	// 1.2 MB of attributes: within the document limit, past the
	// attributes one array keeps.
	writeDoc(t, filepath.Join(src, "wide", "zarr.json"), v3Array("", `"units":"K","table":[`+strings.Repeat("1,", 600_000)+`1]`))

	d := mount(t, src, "--memory", "256MiB", "--readahead", "0")
	logs := d.logs("array=huge")
	if n := strings.Count(logs, "array=huge"); n != 1 || !strings.Contains(logs, "huge/zarr.json is larger than the metadata limit of 4.0 MiB per document") {
		t.Errorf("%d lines for huge, want one naming the file and the limit:\n%s", n, logs)
	}
	if _, err := os.Stat(filepath.Join(d.mnt, "huge")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("huge: %v, want absent", err)
	}
	if en, _ := readErrno(filepath.Join(d.mnt, "t", "0.npy")); en != 0 {
		t.Errorf("t/0.npy: %v", en)
	}
	var side struct {
		Attributes map[string]any `json:"attributes"`
		LeftOut    []string       `json:"attributes_left_out"`
	}
	b, err := os.ReadFile(filepath.Join(d.mnt, "wide.json"))
	if err != nil || json.Unmarshal(b, &side) != nil {
		t.Fatalf("wide.json: %v\n%s", err, b)
	}
	if side.Attributes["units"] != "K" || side.Attributes["table"] != nil || len(side.LeftOut) != 1 || side.LeftOut[0] != "table" || len(b) > 64<<10 {
		t.Errorf("wide.json (%d bytes): attributes %v, left out %v; want units kept and table named", len(b), side.Attributes, side.LeftOut)
	}
	peak := peakRSS(d.cmd.Process.Pid)
	t.Logf("mount with a 120 MB zarr.json: peak RSS %d MiB", peak>>20)
	if peak > 300<<20 {
		t.Errorf("peak RSS %d MiB, want at most 300 MiB", peak>>20)
	}

	out, _, code := run(t, "inspect", "--json", src)
	if code != 0 || !strings.Contains(out, "larger than the metadata limit") {
		t.Errorf("inspect: exit %d, no limit named:\n%s", code, out)
	}

	// The same document at the root; then limits on the whole tree.
	root := filepath.Join(t.TempDir(), "r.zarr")
	writeIntList(t, filepath.Join(root, "zarr.json"), `{"zarr_format":3,"node_type":"group",`, 60_000_000)
	for _, c := range []struct {
		src  string
		args []string
		want string
	}{
		{root, nil, "r.zarr/zarr.json is larger than the metadata limit of 4.0 MiB per document"},
		{src, []string{"--metadata-limit", "nodes=5"}, "more than 5 arrays and groups"},
		{src, []string{"--metadata-limit", "total=1KiB,document=1KiB"}, "past the limit of 1.0 KiB in all"},
		{src, []string{"--metadata-limit", "depth=-1"}, "--metadata-limit depth=-1: want a positive number"},
		{src, []string{"--metadata-limit", "files=3"}, "--metadata-limit files: unknown"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, zarrfsBin(t), append([]string{"mount", c.src, t.TempDir(), "--cache", t.TempDir(), "--memory", "256MiB"}, c.args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		last := lines[len(lines)-1]
		if err == nil || !strings.Contains(last, c.want) || !strings.HasPrefix(last, "zarrfs: ") {
			t.Errorf("mount %v: %v, last line %q, want one naming %q", c.args, err, last, c.want)
		}
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && c.src == root {
			t.Logf("mount of a 120 MB root zarr.json: refused, peak RSS %d MiB", ru.Maxrss>>10)
			if ru.Maxrss<<10 > 300<<20 {
				t.Errorf("peak RSS %d MiB refusing the root document", ru.Maxrss>>10)
			}
		}
	}
}

// Every array left out is named, in the log and in inspect, however many
// there are (the log's flood limit holds back none), an empty zarr.json
// included; groups nested deeper than the limit are named with it, and
// below it nesting is no reason to leave an array out (zarr-python reads
// an array 45 groups down; so does the mount).
func TestArraysLeftOutNamed(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 4, Levels: 2, Lat: 8, Lon: 16, TimeChunk: 1})
	for i := range 15 {
		writeDoc(t, filepath.Join(src, fmt.Sprintf("lz%02d", i), "zarr.json"), v3Array(`{"name":"numcodecs.lzma","configuration":{}}`, ""))
	}
	writeDoc(t, filepath.Join(src, "empty", "zarr.json"), "")
	group := `{"zarr_format":3,"node_type":"group","attributes":{}}`
	deep := func(levels int) string {
		p := src
		for i := range levels {
			p = filepath.Join(p, fmt.Sprintf("d%d", i))
			writeDoc(t, filepath.Join(p, "zarr.json"), group)
		}
		writeDoc(t, filepath.Join(p, "leaf", "zarr.json"), v3Array("", ""))
		rel, _ := filepath.Rel(src, filepath.Join(p, "leaf"))
		return filepath.ToSlash(rel)
	}
	leaf45 := deep(45)
	// A second chain, 70 levels: the group 65 levels down is past the limit.
	p := filepath.Join(src, "e0")
	writeDoc(t, filepath.Join(p, "zarr.json"), group)
	for i := 1; i < 70; i++ {
		p = filepath.Join(p, fmt.Sprintf("e%d", i))
		writeDoc(t, filepath.Join(p, "zarr.json"), group)
	}
	tooDeep := "e0"
	for i := 1; i < 65; i++ {
		tooDeep += fmt.Sprintf("/e%d", i)
	}

	d := mount(t, src)
	logs := d.logs("array=empty", "array="+tooDeep)
	for i := range 15 {
		if n := strings.Count(logs, fmt.Sprintf("array=lz%02d ", i)); n != 1 {
			t.Errorf("lz%02d named %d times in the log, want once", i, n)
		}
	}
	if strings.Contains(logs, "held back") {
		t.Errorf("warnings about arrays left out were held back:\n%s", logs)
	}
	if !strings.Contains(logs, "levels below the root, past the metadata limit of 64") {
		t.Errorf("the depth limit is not said:\n%s", logs)
	}
	if _, err := os.Stat(filepath.Join(d.mnt, leaf45, "0.npy")); err != nil {
		t.Errorf("the array 45 groups down: %v", err)
	}

	out, _, code := run(t, "inspect", "--json", src)
	var entries []struct {
		Path        string  `json:"path"`
		Unsupported *string `json:"unsupported"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &entries) != nil {
		t.Fatalf("inspect: exit %d\n%s", code, out)
	}
	got := map[string]string{}
	for _, e := range entries {
		if e.Unsupported != nil {
			got[e.Path] = *e.Unsupported
		} else {
			got[e.Path] = ""
		}
	}
	for i := range 15 {
		if r := got[fmt.Sprintf("lz%02d", i)]; !strings.Contains(r, "numcodecs.lzma") {
			t.Errorf("inspect: lz%02d %q", i, r)
		}
	}
	if r, ok := got["empty"]; !ok || !strings.Contains(r, "invalid JSON") {
		t.Errorf("inspect: empty zarr.json %q (listed %v)", r, ok)
	}
	if r := got[tooDeep]; !strings.Contains(r, "past the metadata limit") {
		t.Errorf("inspect: the group past the depth limit %q", r)
	}
	if r, ok := got[leaf45]; !ok || r != "" {
		t.Errorf("inspect: the array 45 groups down: %q (listed %v)", r, ok)
	}
	if err := exec.Command("python3", "-c", "import zarr").Run(); err == nil {
		py := python(t, "import sys, zarr; print(zarr.open_array(sys.argv[1], mode='r').shape)", filepath.Join(src, leaf45))
		if strings.TrimSpace(py) != "(2, 4)" {
			t.Errorf("zarr-python reads the deep array as %q", py)
		}
	}
}

// catErr reads p with cat in a process of its own, so that a read that
// hangs cannot hang the test: its error (nil on success) and how long it
// took. A cat still blocked after limit is killed and left (a read blocked
// on FUSE may not die at once).
func catErr(p string, limit time.Duration) (error, string, time.Duration) {
	start := time.Now()
	cmd := exec.Command("cat", p)
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err, "", 0
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err, stderr.String(), time.Since(start)
	case <-time.After(limit):
		cmd.Process.Kill()
		return fmt.Errorf("still blocked after %v", limit), stderr.String(), time.Since(start)
	}
}

// A local filesystem that stops answering (here a FUSE filesystem whose
// daemon is stopped, as an NFS or Lustre server can be; a chunk is a link
// into it, read with --follow-symlinks) fails the sample that needs it
// with EIO within --source-timeout and one log line, rather than hanging
// its reader for as long as the filesystem does; other samples keep
// reading; the daemon stays killable; the filesystem answering again, the
// sample reads.
func TestHungLocalSource(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 4, Levels: 2, Lat: 16, Lon: 32, TimeChunk: 1})
	annex := t.TempDir()
	chunk := filepath.Join(src, "t", "c", "0", "0", "0", "0")
	if err := os.Rename(chunk, filepath.Join(annex, "t-chunk")); err != nil {
		t.Fatal(err)
	}
	hung := startHungFS(t, annex)
	if err := os.Symlink(filepath.Join(hung.mnt, "t-chunk"), chunk); err != nil {
		t.Fatal(err)
	}
	ref := t.TempDir()
	want := readFileOrFatal(t, src, ref, "t/0.npy")

	const timeout = 4 * time.Second
	d := mount(t, src, "--follow-symlinks", "--source-timeout", timeout.String(), "--source-stall", "1s", "--readahead", "0")
	// Runs before the daemon is stopped: a test that fails must not leave
	// it waiting on the stopped filesystem.
	t.Cleanup(func() { hung.cmd.Process.Signal(syscall.SIGCONT) })
	hung.stop(t)
	err, stderr, took := catErr(filepath.Join(d.mnt, "t", "0.npy"), timeout+30*time.Second)
	t.Logf("cat of a sample whose chunk hangs: %v after %v", err, took.Round(time.Millisecond))
	if err == nil || !strings.Contains(stderr, "Input/output error") {
		t.Errorf("cat t/0.npy: %v %q, want EIO", err, stderr)
	}
	if took > timeout+5*time.Second {
		t.Fatalf("EIO after %v, want it within --source-timeout %v", took, timeout)
	}
	if en, _ := readErrno(filepath.Join(d.mnt, "t", "2.npy")); en != 0 {
		t.Errorf("t/2.npy while the other filesystem hangs: %v", en)
	}
	logs := d.logs("cannot fill file")
	if n := strings.Count(logs, "cannot fill file"); n != 1 || !strings.Contains(logs, "no answer within "+timeout.String()) {
		t.Errorf("%d fill failures logged, want one naming the deadline:\n%s", n, logs)
	}
	// Killable while its read of the stopped filesystem is still blocked.
	start := time.Now()
	d.stop(t)
	t.Logf("daemon stopped in %v with a read blocked on the hung filesystem", time.Since(start).Round(time.Millisecond))

	hung.resume(t)
	d = mount(t, src, "--follow-symlinks", "--source-timeout", timeout.String(), "--source-stall", "1s", "--readahead", "0")
	if got, err := os.ReadFile(filepath.Join(d.mnt, "t", "0.npy")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("t/0.npy once the filesystem answers: %v", err)
	}
}

// readFileOrFatal warms one file of src into cacheDir and returns its bytes.
func readFileOrFatal(t *testing.T, src, cacheDir, file string) []byte {
	t.Helper()
	warm(t, src, cacheDir, "--only", file, "--follow-symlinks")
	want := blobFiles(t, cacheDir)[file]
	if want == nil {
		t.Fatalf("warm made no %s", file)
	}
	return want
}

// SIGTERM while the mount starts ends it at once, exit status 0, even
// while reading the metadata waits on a source that does not answer.
func TestSIGTERMDuringStartup(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	annex := t.TempDir()
	meta := filepath.Join(src, "t", "zarr.json")
	if err := os.Rename(meta, filepath.Join(annex, "zarr.json")); err != nil {
		t.Fatal(err)
	}
	hung := startHungFS(t, annex)
	os.Symlink(filepath.Join(hung.mnt, "zarr.json"), meta)
	hung.stop(t)
	mnt := t.TempDir()
	cmd := exec.Command(zarrfsBin(t), "mount", src, mnt, "--cache", t.TempDir(), "--follow-symlinks", "--source-timeout", "5m")
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	time.Sleep(time.Second)
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil || !strings.Contains(stderr.String(), "interrupted before the mount was live") {
			t.Errorf("exit %v after SIGTERM during start-up:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("no exit within 30s of SIGTERM during start-up:\n%s", stderr.String())
	}
	if isMounted(mnt) {
		t.Errorf("%s mounted", mnt)
	}
}

// A cache on a 50 MB tmpfs that something else filled to the brim, 31 MB
// of it blobs: eight readers at once (with readahead) read 800 samples
// that all need room, and every read succeeds, the fills evicting as they
// go, however they race for the room.
func TestFullCacheParallelReaders(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 1000, Levels: 2, Lat: 64, Lon: 128, TimeChunk: 1})
	fsDir := cacheFS(t, "50m", true)
	d := mountAt(t, src, t.TempDir(), filepath.Join(fsDir, "cache"))
	name := func(arr string, i int) string { return filepath.Join(d.mnt, arr, fmt.Sprintf("%03d.npy", i)) }
	for i := range 450 { // 68 KiB each: 31 MB
		if en, _ := readErrno(name("t", i)); en != 0 {
			t.Fatalf("t/%03d.npy: %v", i, en)
		}
	}
	junk, err := os.Create(filepath.Join(fsDir, "junk"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<16)
	for {
		if _, err := junk.Write(buf); err != nil {
			break
		}
	}
	junk.Close()
	// 800 samples no blob holds: t 450-999 and z 0-249, 100 per reader.
	var files []string
	for i := 450; i < 1000; i++ {
		files = append(files, name("t", i))
	}
	for i := range 250 {
		files = append(files, name("z", i))
	}
	var failed atomic.Int64
	var wg sync.WaitGroup
	for r := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range files[r*100 : (r+1)*100] {
				if en, _ := readErrno(p); en != 0 {
					if failed.Add(1) == 1 {
						t.Logf("first failure: %s: %v", p, en)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of 800 reads failed on a full cache filesystem with 31 MB evictable", n)
	}
}

// In direct mode, a store's entry named .zarrfs (the name the mode's
// mirror takes) is left out of the mount with a warning, its sidecar too,
// and the rest mounts and resolves, instead of the whole mount refused.
func TestDirectLeavesOutDotZarrfs(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	writeDoc(t, filepath.Join(src, ".zarrfs", "zarr.json"), v3Array("", ""))
	d := mount(t, src, "--direct")
	logs := d.logs("entry=.zarrfs")
	if n := strings.Count(logs, "store entry left out of the mount"); n != 1 {
		t.Errorf("%d warnings for the .zarrfs entry, want 1:\n%s", n, logs)
	}
	ents, err := os.ReadDir(d.mnt)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".zarrfs") {
			t.Errorf("the root lists %s", e.Name())
		}
	}
	if _, err := os.Lstat(filepath.Join(d.mnt, ".zarrfs.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf(".zarrfs.json: %v, want absent", err)
	}
	if b, err := os.ReadFile(filepath.Join(d.mnt, "t", "0.npy")); err != nil || len(b) != 4096+4*8*4 {
		t.Errorf("t/0.npy through its link: %d bytes, %v", len(b), err)
	}
}

// An array whose name holds a newline and a terminal escape cannot forge
// lines of `zarrfs inspect` nor color its output: the name is escaped, as
// the log escapes it.
func TestInspectEscapesStoreNames(t *testing.T) {
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	writeDoc(t, filepath.Join(src, "x\nlsm\x1b[31m", "zarr.json"), v3Array(`{"name":"numcodecs.lzma","configuration":{}}`, ""))
	out, stderr, code := run(t, "inspect", src)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	if strings.Contains(out, "\x1b") || strings.Contains(out, "\nlsm\x1b") {
		t.Errorf("raw name in the output:\n%q", out)
	}
	if !strings.Contains(out, `"x\nlsm\x1b[31m"`) {
		t.Errorf("the name is not printed escaped:\n%s", out)
	}
}

// waitFor polls cond for up to limit.
func waitFor(limit time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// A store that vanishes under a running mount is followed as an array
// deleted is: at the next refresh the tree empties, with one warning
// (files already open keep reading); the store's metadata back, the tree
// comes back; the store's directory deleted, the tree empties too.
func TestVanishedSource(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 4, Levels: 1, Lat: 8, Lon: 16, TimeChunk: 1})
	backup := filepath.Join(t.TempDir(), "backup")
	copyTree(t, src, backup)
	d := mount(t, src, "--metadata-ttl", "1s", "--readahead", "0")
	want, err := os.ReadFile(filepath.Join(d.mnt, "t", "1.npy"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(d.mnt, "t", "1.npy"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	empty := func() bool {
		ents, err := os.ReadDir(d.mnt)
		_, serr := os.Stat(filepath.Join(d.mnt, "t", "0.npy"))
		return err == nil && len(ents) == 0 && errors.Is(serr, os.ErrNotExist)
	}
	served := func() bool {
		_, err := os.Stat(filepath.Join(d.mnt, "t", "0.npy"))
		return err == nil
	}

	// Emptied (the directory stays).
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		os.RemoveAll(filepath.Join(src, e.Name()))
	}
	if !waitFor(15*time.Second, empty) {
		t.Fatal("the tree still lists the arrays of a store emptied 15s ago")
	}
	if got, err := io.ReadAll(f); err != nil || !bytes.Equal(got, want) {
		t.Errorf("a file open before the store vanished: %v (%d bytes, want %d)", err, len(got), len(want))
	}
	// Back.
	ents, _ = os.ReadDir(backup)
	for _, e := range ents {
		copyTree(t, filepath.Join(backup, e.Name()), filepath.Join(src, e.Name()))
	}
	if !waitFor(15*time.Second, served) {
		t.Fatal("the tree did not come back 15s after the store did")
	}
	if got, err := os.ReadFile(filepath.Join(d.mnt, "t", "1.npy")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("t/1.npy after the store came back: %v", err)
	}
	// Deleted, directory and all.
	if err := os.RemoveAll(src); err != nil {
		t.Fatal(err)
	}
	if !waitFor(15*time.Second, empty) {
		t.Fatal("the tree still lists the arrays of a store deleted 15s ago")
	}
	logs := d.logs("no Zarr metadata any more", "has Zarr metadata again")
	if n := strings.Count(logs, "no Zarr metadata any more"); n != 2 {
		t.Errorf("%d warnings that the store vanished, want one each time:\n%s", n, logs)
	}
}
