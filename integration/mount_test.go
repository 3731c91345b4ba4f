// Package integration runs zarrfs end to end: the real binary mounts real
// stores with FUSE, and real clients (numpy in python3, the shell) read them.
package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/internal/fixtures"
	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/internal/testenv"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// repoRoot is the module root (the directory holding go.mod).
func repoRoot(t testing.TB) string {
	t.Helper()
	d, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		p := filepath.Dir(d)
		if p == d {
			t.Fatal("go.mod not found above the test directory")
		}
		d = p
	}
}

// zarrfsBin builds the binary once per test run ($ZARRFS_BIN names a
// prebuilt one, for machines without Go).
func zarrfsBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("ZARRFS_BIN"); p != "" {
		return p
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "zarrfs-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "zarrfs")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/zarrfs")
		cmd.Dir = repoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func requireMountTools(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "no /dev/fuse: FUSE tests need it")
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			testenv.Missing(t, "not root and no fusermount3")
		}
	}
}

func requirePython(t testing.TB) {
	t.Helper()
	requireMountTools(t)
	if err := exec.Command("python3", "-c", "import numpy").Run(); err != nil {
		testenv.Missing(t, "python3 with numpy is needed (make pydeps)")
	}
}

// fixturesDir is the folder of the stores tensorstore wrote
// (internal/fixtures), made first if needed.
func fixturesDir(t testing.TB) string {
	t.Helper()
	return fixtures.Tensorstore(t)
}

// daemon is a running `zarrfs mount`.
type daemon struct {
	t      testing.TB
	cmd    *exec.Cmd
	mnt    string
	cache  string
	line   string // the "mounted" line
	stderr *syncbuf.Buffer
	done   chan struct{}
	err    error // exit error, after done
}

// mount starts zarrfs on src and waits for its "mounted" line. Cleanup
// stops it with SIGTERM and checks that it exits 0 and unmounts.
func mount(t testing.TB, src string, args ...string) *daemon {
	t.Helper()
	return mountAt(t, src, t.TempDir(), t.TempDir(), args...)
}

func mountAt(t testing.TB, src, mnt, cacheDir string, args ...string) *daemon {
	t.Helper()
	return mountUnder(t, nil, src, mnt, cacheDir, args...)
}

// mountUnder is mountAt with the daemon started through the command
// wrapper (setpriv dropping a capability, say); nil: none.
func mountUnder(t testing.TB, wrapper []string, src, mnt, cacheDir string, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, mnt: mnt, cache: cacheDir, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	argv := append(append(slices.Clone(wrapper), zarrfsBin(t), "mount", src, mnt, "--cache", cacheDir), args...)
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stderr = d.stderr
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	select {
	case l, ok := <-lines:
		if !ok {
			<-d.done
			t.Fatalf("zarrfs mount exited before mounting: %v\n%s", d.err, d.stderr)
		}
		d.line = l
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		t.Fatalf("zarrfs mount: no mounted line within 60s\n%s", d.stderr)
	}
	t.Cleanup(func() { d.stop(t) })
	return d
}

// logs returns the daemon's stderr once it holds every one of want, or
// after a few seconds: it reaches the test through a pipe, a little after
// the daemon writes it.
func (d *daemon) logs(want ...string) string {
	eventually(func() bool {
		l := d.stderr.String()
		for _, w := range want {
			if !strings.Contains(l, w) {
				return false
			}
		}
		return true
	})
	return d.stderr.String()
}

// stop sends SIGTERM and checks a clean exit and unmount (once).
func (d *daemon) stop(t testing.TB) {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		t.Errorf("zarrfs did not exit within 20s of SIGTERM\n%s", d.stderr)
	}
	if d.err != nil {
		t.Errorf("zarrfs exited with %v after SIGTERM\n%s", d.err, d.stderr)
	}
	if isMounted(d.mnt) {
		t.Errorf("%s still mounted after zarrfs exited", d.mnt)
		exec.Command("fusermount3", "-uz", d.mnt).Run()
		syscall.Unmount(d.mnt, syscall.MNT_DETACH)
	}
}

// isMounted reports whether p is a mountpoint, from /proc/self/mountinfo.
func isMounted(p string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}

// python runs a script with arguments and returns stdout; stderr goes to
// the error.
func python(t testing.TB, script string, args ...string) string {
	t.Helper()
	cmd := exec.Command("python3", append([]string{"-c", script}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v\n%s\n%s", err, out, stderr.String())
	}
	return string(out)
}

// checkTensorstore compares every file of a mounted fixture store with the
// reference: sha256 of each sample (or the whole array) and the .ref.npy values.
const checkTensorstore = `
import hashlib, json, os, sys
import numpy as np
mnt, fixtures, store = sys.argv[1:4]
ref = json.load(open(os.path.join(fixtures, 'reference.json')))[store]
bad, n = [], 0
for path, r in sorted(ref.items()):
    full = np.load(os.path.join(fixtures, store + '__' + path.replace('/', '_') + '.ref.npy'))
    side = json.load(open(os.path.join(mnt, path + '.json')))
    for k in ('shape', 'dtype', 'dims'):
        if side[k] != r[k]:
            bad.append(f'{path}.json {k}={side[k]!r}, want {r[k]!r}')
    if len(r['shape']) >= 2 and 'time' in r['dims']:
        ax = r['dims'].index('time')
        count = r['shape'][ax]
        width = len(str(count - 1))
        names = sorted(os.listdir(os.path.join(mnt, path)))
        want_names = [str(i).zfill(width) + '.npy' for i in range(count)]
        if names != want_names:
            bad.append(f'{path}/ lists {names[:3]}..., want {want_names[:3]}...')
        for i in range(count):
            f = os.path.join(mnt, path, want_names[i])
            a = np.load(f)
            n += 1
            want = np.take(full, i, axis=ax)
            if a.dtype.str != r['dtype'] or a.shape != want.shape or a.tobytes() != want.tobytes():
                bad.append(f'{f}: {a.dtype.str} {a.shape} differs from reference')
            if 'samples' in r and hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() != r['samples'][i]:
                bad.append(f'{f}: sha256 differs from reference.json')
            if os.path.getsize(f) != 4096 + a.nbytes:
                bad.append(f'{f}: size {os.path.getsize(f)}')
    else:
        f = os.path.join(mnt, path + '.npy')
        a = np.load(f)
        n += 1
        if a.dtype.str != r['dtype'] or a.shape != full.shape or a.tobytes() != full.tobytes():
            bad.append(f'{f}: differs from reference')
        if 'whole' in r and hashlib.sha256(a.tobytes()).hexdigest() != r['whole']:
            bad.append(f'{f}: sha256 differs from reference.json')
print(json.dumps({'files': n, 'bad': bad}))
`

type checkResult struct {
	Files int      `json:"files"`
	Bad   []string `json:"bad"`
}

func runCheck(t *testing.T, script string, args ...string) checkResult {
	t.Helper()
	var r checkResult
	out := python(t, script, args...)
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("checker output %q: %v", out, err)
	}
	for _, b := range r.Bad {
		t.Error(b)
	}
	return r
}

func TestTensorstoreFixtures(t *testing.T) {
	requirePython(t)
	fx := fixturesDir(t)
	for _, store := range []string{"public_a.zarr", "public_b.zarr"} {
		t.Run(store, func(t *testing.T) {
			d := mount(t, filepath.Join(fx, store))
			if !strings.HasPrefix(d.line, "zarrfs: mounted file://") || !strings.Contains(d.line, " at "+d.mnt+" (") || !strings.Contains(d.line, "files)") {
				t.Errorf("mounted line %q", d.line)
			}
			r := runCheck(t, checkTensorstore, d.mnt, fx, store)
			if r.Files < 10 {
				t.Errorf("checked only %d files", r.Files)
			}
		})
	}
}

// checkZarrPython compares a mounted zarr-python store with its references.
const checkZarrPython = `
import json, os, sys
import numpy as np
mnt, outdir, store = sys.argv[1:4]
man = json.load(open(os.path.join(outdir, 'manifest.json')))['arrays']
bad, n = [], 0
base = store[:-5] if store.endswith('.zarr') else store
for e in man:
    if e['store'] != store:
        continue
    path = e['path'] or base
    if e['unsupported']:
        for p in (path, path + '.npy', path + '.json'):
            if os.path.exists(os.path.join(mnt, p)):
                bad.append(f'{store}/{p}: unsupported array is mounted')
        continue
    full = np.load(os.path.join(outdir, e['ref']))
    dims = e.get('dims') or []
    if len(e['shape']) >= 2 and 'time' in dims:
        ax = dims.index('time')
        count = e['shape'][ax]
        width = len(str(count - 1)) if count > 1 else 1
        for i in range(count):
            f = os.path.join(mnt, path, str(i).zfill(width) + '.npy')
            a = np.load(f)
            n += 1
            want = np.ascontiguousarray(np.take(full, i, axis=ax))
            if a.dtype.str != full.dtype.str or a.shape != want.shape or a.tobytes() != want.tobytes():
                bad.append(f'{store}/{path}/{i}: differs from zarr-python')
    else:
        f = os.path.join(mnt, path + '.npy')
        try:
            a = np.load(f)
        except Exception as ex:
            bad.append(f'{store}/{path}.npy: {ex!r}')
            continue
        n += 1
        if a.dtype.str != full.dtype.str or a.shape != full.shape or a.tobytes() != np.ascontiguousarray(full).tobytes():
            bad.append(f'{store}/{path}.npy: differs from zarr-python ({a.dtype.str} {a.shape} vs {full.dtype.str} {full.shape})')
print(json.dumps({'files': n, 'bad': bad}))
`

func TestZarrPythonStores(t *testing.T) {
	requirePython(t)
	script := filepath.Join(repoRoot(t), "integration", "zarrpy", "make_stores.py")
	if _, err := os.Stat(script); err != nil {
		testenv.Missing(t, "integration/zarrpy/make_stores.py not present")
	}
	if err := exec.Command("python3", "-c", "import zarr, numcodecs").Run(); err != nil {
		testenv.Missing(t, "zarr-python and numcodecs are needed (make pydeps)")
	}
	out := t.TempDir()
	if b, err := exec.Command("python3", script, out).CombinedOutput(); err != nil {
		t.Fatalf("make_stores.py: %v\n%s", err, b)
	}
	ents, _ := os.ReadDir(out)
	stores := 0
	for _, e := range ents {
		if !e.IsDir() || !strings.HasSuffix(e.Name(), ".zarr") {
			continue
		}
		stores++
		t.Run(e.Name(), func(t *testing.T) {
			d := mount(t, filepath.Join(out, e.Name()))
			runCheck(t, checkZarrPython, d.mnt, out, e.Name())
			if e.Name() == "v3_mixed.zarr" {
				if logs := d.logs("array left out", "array=bitround"); !strings.Contains(logs, "array left out") || !strings.Contains(logs, "array=bitround") {
					t.Errorf("no warning for unsupported arrays:\n%s", logs)
				}
			}
		})
	}
	if stores == 0 {
		t.Fatal("make_stores.py wrote no stores")
	}
}

// copyTree copies a directory (small fixtures only).
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStatAndListNeverFill(t *testing.T) {
	requireMountTools(t)
	fx := fixturesDir(t)
	d := mount(t, filepath.Join(fx, "public_a.zarr"))
	out, err := exec.Command("ls", "-lR", d.mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("ls -lR: %v\n%s", err, out)
	}
	// t is (12, 3, 16, 24) float32: each sample is 4096 + 3*16*24*4 bytes.
	st, err := os.Stat(filepath.Join(d.mnt, "t", "11.npy"))
	if err != nil || st.Size() != 4096+3*16*24*4 {
		t.Errorf("t/11.npy: %v size %d", err, st.Size())
	}
	if !strings.Contains(string(out), " 8704 ") {
		t.Errorf("ls -l shows no 8704-byte sample:\n%s", out)
	}
	blobs := filepath.Join(d.cache, "blobs")
	var files []string
	filepath.WalkDir(blobs, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 0 {
		t.Errorf("ls -lR filled %d blobs: %v", len(files), files)
	}
}

func TestWritesFailEROFS(t *testing.T) {
	requirePython(t)
	fx := fixturesDir(t)
	d := mount(t, filepath.Join(fx, "public_a.zarr"))
	out := python(t, `
import errno, os, sys
m = sys.argv[1]
res = []
for name, op in [
    ('open w', lambda: open(os.path.join(m, 't', '00.npy'), 'r+b')),
    ('create', lambda: open(os.path.join(m, 'new.npy'), 'wb')),
    ('mkdir', lambda: os.mkdir(os.path.join(m, 'd'))),
    ('unlink', lambda: os.unlink(os.path.join(m, 'lsm.npy'))),
    ('rename', lambda: os.rename(os.path.join(m, 'lsm.npy'), os.path.join(m, 'x.npy'))),
    ('truncate', lambda: os.truncate(os.path.join(m, 'lsm.json'), 0)),
]:
    try:
        op()
        res.append(name + ': succeeded')
    except OSError as e:
        if e.errno != errno.EROFS:
            res.append(f'{name}: {e!r}')
print('\n'.join(res))
`, d.mnt)
	if s := strings.TrimSpace(out); s != "" {
		t.Errorf("writes not refused with EROFS:\n%s", s)
	}
}

func TestConcurrentReaders(t *testing.T) {
	requirePython(t)
	fx := fixturesDir(t)
	d := mount(t, filepath.Join(fx, "public_a.zarr"))
	out := python(t, `
import os, random, sys, threading
import numpy as np
m, fx = sys.argv[1:3]
refs = {v: np.load(os.path.join(fx, 'public_a.zarr__' + v + '.ref.npy')) for v in ('t', 'z', 'q', 'u10')}
errs = []
def reader(seed):
    rnd = random.Random(seed)
    for _ in range(40):
        v = rnd.choice(list(refs))
        i = rnd.randrange(refs[v].shape[0])
        a = np.load(os.path.join(m, v, '%02d.npy' % i))
        if a.tobytes() != np.ascontiguousarray(refs[v][i]).tobytes():
            errs.append(f'{v}/{i}')
ts = [threading.Thread(target=reader, args=(s,)) for s in range(16)]
[t.start() for t in ts]
[t.join() for t in ts]
print(len(errs), ' '.join(errs[:5]))
`, d.mnt, fx)
	if !strings.HasPrefix(out, "0 ") {
		t.Errorf("16 readers: mismatches %s", out)
	}
}

func TestSIGTERMWhileReading(t *testing.T) {
	requirePython(t)
	fx := fixturesDir(t)
	d := mount(t, filepath.Join(fx, "public_a.zarr"))
	// A reader that holds a file open and keeps reading until killed.
	reader := exec.Command("python3", "-c", `
import os, sys, time
m = sys.argv[1]
f = open(os.path.join(m, 't', '00.npy'), 'rb')
print('open', flush=True)
while True:
    for i in range(12):
        try:
            with open(os.path.join(m, 't', '%02d.npy' % i), 'rb') as g:
                g.read()
        except OSError:
            pass
    f.seek(0); f.read()
`, d.mnt)
	stdout, _ := reader.StdoutPipe()
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { reader.Process.Kill(); reader.Wait() }()
	if l, _ := bufio.NewReader(stdout).ReadString('\n'); l != "open\n" {
		t.Fatalf("reader said %q", l)
	}
	time.Sleep(200 * time.Millisecond)
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		t.Fatalf("no exit within 20s of SIGTERM with a reader active\n%s", d.stderr)
	}
	if d.err != nil {
		t.Errorf("exit status %v, want 0\n%s", d.err, d.stderr)
	}
	if isMounted(d.mnt) {
		t.Errorf("%s still mounted", d.mnt)
	}
}

func TestCorruptChunk(t *testing.T) {
	requirePython(t)
	fx := fixturesDir(t)
	store := filepath.Join(t.TempDir(), "a.zarr")
	copyTree(t, filepath.Join(fx, "public_a.zarr"), store)
	// t has chunks (4, 2, 8, 16): chunk 0/0/0/0 holds samples 0..3.
	if err := os.WriteFile(filepath.Join(store, "t", "c", "0", "0", "0", "0"), bytes.Repeat([]byte("garbage!"), 64), 0o644); err != nil {
		t.Fatal(err)
	}
	d := mount(t, store)
	out := python(t, `
import os, sys
import numpy as np
m = sys.argv[1]
res = []
for i in range(12):
    try:
        np.load(os.path.join(m, 't', '%02d.npy' % i))
        res.append('ok')
    except OSError as e:
        res.append('errno%d' % e.errno)
print(' '.join(res))
`, d.mnt)
	want := "errno5 errno5 errno5 errno5 ok ok ok ok ok ok ok ok"
	if strings.TrimSpace(out) != want {
		t.Errorf("t samples: %s, want %s", strings.TrimSpace(out), want)
	}
	// Other arrays and the daemon are fine.
	python(t, `import numpy as np, sys; np.load(sys.argv[1] + '/z/00.npy'); np.load(sys.argv[1] + '/lsm.npy')`, d.mnt)
	logs := d.logs("array=t", "chunk=t/c/0/0/0/0")
	if !strings.Contains(logs, "array=t") || !strings.Contains(logs, "chunk=t/c/0/0/0/0") {
		t.Errorf("no log line naming array t and chunk t/c/0/0/0/0:\n%s", logs)
	}
	if n := strings.Count(logs, "cannot fill file"); n != 1 {
		t.Errorf("%d fault lines, want 1 per chunk:\n%s", n, logs)
	}
	select {
	case <-d.done:
		t.Fatalf("daemon exited: %v", d.err)
	default:
	}
	// Nothing partial landed in the cache.
	filepath.WalkDir(filepath.Join(d.cache, "blobs"), func(p string, e fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, filepath.Join("t", "00.npy")) {
			t.Errorf("failed blob visible in the cache: %s", p)
		}
		return nil
	})
}

func TestUnsupportedArrayAbsent(t *testing.T) {
	requirePython(t)
	fx := fixturesDir(t)
	store := filepath.Join(t.TempDir(), "a.zarr")
	copyTree(t, filepath.Join(fx, "public_a.zarr"), store)
	meta := filepath.Join(store, "u10", "zarr.json")
	b, _ := os.ReadFile(meta)
	b = bytes.Replace(b, []byte(`"blosc"`), []byte(`"bitround"`), 1)
	if !bytes.Contains(b, []byte("bitround")) {
		t.Fatalf("u10 metadata has no blosc codec to replace: %s", b)
	}
	os.WriteFile(meta, b, 0o644)
	d := mount(t, store)
	for _, p := range []string{"u10", "u10.json"} {
		if _, err := os.Stat(filepath.Join(d.mnt, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want absent", p, err)
		}
	}
	python(t, `import numpy as np, sys; np.load(sys.argv[1] + '/t/05.npy'); np.load(sys.argv[1] + '/time.npy')`, d.mnt)
	if logs := d.logs("array=u10", "bitround"); !strings.Contains(logs, "array=u10") || !strings.Contains(logs, "bitround") {
		t.Errorf("no warning naming u10 and its codec:\n%s", logs)
	}
}

func TestStaleMountCleared(t *testing.T) {
	requirePython(t)
	fx := fixturesDir(t)
	mnt, cacheDir := t.TempDir(), t.TempDir()
	d := mountAt(t, filepath.Join(fx, "public_a.zarr"), mnt, cacheDir)
	d.cmd.Process.Kill()
	<-d.done
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(mnt, &sfs); !errors.Is(err, syscall.ENOTCONN) {
		t.Skipf("killing the daemon left %v, not a stale mount", err)
	}
	d2 := mountAt(t, filepath.Join(fx, "public_a.zarr"), mnt, cacheDir)
	if !strings.Contains(d2.logs("stale mount"), "stale mount") {
		t.Errorf("no message about the stale mount:\n%s", d2.stderr)
	}
	python(t, `import numpy as np, sys; np.load(sys.argv[1] + '/t/05.npy')`, mnt)
}

func TestUsageErrors(t *testing.T) {
	bin := zarrfsBin(t)
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"mount", "only-one-arg"}, 2, "expected"},
		{[]string{"mount", "/nonexistent/store.zarr", t.TempDir(), "--cache", t.TempDir()}, 1, "/nonexistent/store.zarr"},
		{[]string{"mount", "x", t.TempDir(), "--align", "100"}, 2, "--align"},
		{[]string{"mount", "x", t.TempDir(), "--cache-size", "lots"}, 2, "--cache-size"},
	} {
		cmd := exec.Command(bin, tt.args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != tt.code {
			t.Errorf("%v: %v, want exit %d", tt.args, err, tt.code)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if len(lines) != 1 || !errorLine.MatchString(lines[0]) || !strings.Contains(lines[0], tt.msg) {
			t.Errorf("%v: stderr %q", tt.args, stderr.String())
		}
	}
}

// Without python3 the tests that need it skip, or fail under CI: a CI
// machine must have every tool, so a skip there would hide a feature
// nobody tested.
func TestMissingToolsFailUnderCI(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no python3, no fusermount3
	for ci, want := range map[string]string{"": "skip: ", "true": "fail: "} {
		t.Setenv("CI", ci)
		if got := testenv.Outcome(requirePython); !strings.HasPrefix(got, want) {
			t.Errorf("CI=%q: requirePython without python3: %s, want %s...", ci, got, want)
		}
	}
}
