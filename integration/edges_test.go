package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// tmpfsAt mounts a small tmpfs at dir (root only) until the test ends.
func tmpfsAt(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "mounting a tmpfs needs root")
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		testenv.Missing(t, "cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
}

// A mountpoint a mount would make a mess of is refused before the source
// is opened, with one line saying what is there: files it would hide,
// another filesystem it would hide, a live zarrfs mount (and the command
// that stops it).
func TestMountpointRefused(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})

	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "notes.txt"), []byte("mine"), 0o644)
	live := mount(t, src)
	other := t.TempDir()
	tmpfsAt(t, other)
	for _, tt := range []struct {
		mnt, want string
	}{
		{full, full + `: not empty (holds "` + filepath.Join(full, "notes.txt") + `"): a mount would hide its files; choose an empty directory`},
		{other, other + ": already a mount point (tmpfs tmpfs): a mount there would hide it; choose another directory"},
		{live.mnt, live.mnt + ": already a zarrfs mount (of file://" + src + "); unmount it first (zarrfs unmount " + live.mnt + ") or choose another directory"},
	} {
		_, stderr, code := run(t, "mount", src, tt.mnt, "--cache", t.TempDir())
		if code != 1 || strings.TrimSpace(stderr) != "zarrfs: "+tt.want {
			t.Errorf("mount on %s: exit %d, %q\nwant exit 1 and %q", tt.mnt, code, stderr, tt.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(full, "notes.txt")); err != nil || string(b) != "mine" {
		t.Errorf("the refused mount touched the folder's file: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(live.mnt, "t", "0.npy")); err != nil {
		t.Errorf("the live mount stopped serving: %v", err)
	}
}

// After the daemon is killed the kernel keeps a dead mount: status says it
// is stale (exit 1), unmount detaches it and says it did, and a second
// unmount says there is nothing mounted.
func TestStaleMountStatusUnmount(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	d := mount(t, src)
	d.cmd.Process.Kill()
	<-d.done
	t.Cleanup(func() { syscall.Unmount(d.mnt, syscall.MNT_DETACH) })
	if !eventually(func() bool { _, err := os.ReadDir(d.mnt); return errors.Is(err, syscall.ENOTCONN) }) {
		t.Fatal("after SIGKILL the mount is not stale (ENOTCONN)")
	}
	_, stderr, code := run(t, "status", d.mnt)
	if code != 1 || !strings.Contains(stderr, d.mnt+": a stale mount: its daemon died") || !strings.Contains(stderr, "zarrfs unmount "+d.mnt) {
		t.Errorf("status of a stale mount: exit %d, %q", code, stderr)
	}
	out, stderr, code := run(t, "unmount", d.mnt)
	if code != 0 || !strings.Contains(out, d.mnt+": a stale mount (its daemon had died") || !strings.Contains(out, "detached") {
		t.Errorf("unmount of a stale mount: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if isMounted(d.mnt) {
		t.Error("still mounted after unmount")
	}
	if _, stderr, code := run(t, "unmount", d.mnt); code != 1 || !strings.Contains(stderr, "not mounted") {
		t.Errorf("second unmount: exit %d, %q", code, stderr)
	}
	if _, stderr, code := run(t, "status", d.mnt); code != 1 || !strings.Contains(stderr, "not a mount point") {
		t.Errorf("status of a plain folder: exit %d, %q", code, stderr)
	}
}

// zarrfs unmount on another filesystem's mount leaves it mounted and says
// what it is; status says it is not zarrfs.
func TestUnmountLeavesOtherFilesystems(t *testing.T) {
	dir := t.TempDir()
	tmpfsAt(t, dir)
	_, stderr, code := run(t, "unmount", dir)
	if code != 1 || !strings.Contains(stderr, "mounted as tmpfs (tmpfs), not zarrfs; zarrfs unmount leaves it alone") {
		t.Errorf("unmount of a tmpfs: exit %d, %q", code, stderr)
	}
	if !isMounted(dir) {
		t.Error("zarrfs unmount unmounted a tmpfs")
	}
	if _, stderr, code := run(t, "status", dir); code != 1 || !strings.Contains(stderr, "mounted as tmpfs (tmpfs), not zarrfs") {
		t.Errorf("status of a tmpfs: exit %d, %q", code, stderr)
	}
}

// A --metrics port already taken fails before anything is mounted (exit 1,
// one line), instead of a mount that goes live and then goes away.
func TestMetricsPortTakenBeforeMount(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	mnt := t.TempDir()
	_, stderr, code := run(t, "mount", src, mnt, "--cache", t.TempDir(), "--metrics", ln.Addr().String())
	if code != 1 || !strings.Contains(stderr, "--metrics "+ln.Addr().String()) || !strings.Contains(stderr, "address already in use") ||
		strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("mount with a taken metrics port: exit %d, %q", code, stderr)
	}
	if isMounted(mnt) {
		t.Error("a mount was left behind")
	}
}

// docMetrics returns the metric names docs/operations.md's metrics table
// lists.
func docMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## Metrics")
	if i < 0 {
		t.Fatal("docs/operations.md has no Metrics section")
	}
	s = s[i:]
	if j := strings.Index(s[3:], "\n## "); j >= 0 {
		s = s[:j+3]
	}
	set := map[string]bool{}
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(line, "| `zarrfs_") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, m := range regexp.MustCompile("`(zarrfs_[a-z_]+)").FindAllStringSubmatch(first, -1) {
			set[m[1]] = true
		}
	}
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// The metrics a mount serves are the ones docs/operations.md documents,
// no more and no fewer (the Go runtime's and the process's aside).
func TestMetricsServedAreDocumented(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 4, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 2})
	d := mount(t, src, "--metrics", "127.0.0.1:0", "--readahead", "0")
	// One fill and one failed open, so the labelled families have a value.
	if _, err := os.ReadFile(filepath.Join(d.mnt, "t", "0.npy")); err != nil {
		t.Fatal(err)
	}
	var served []string
	for name := range scrape(t, metricsURL(t, d)) {
		if strings.HasPrefix(name, "zarrfs_") {
			served = append(served, name)
		}
	}
	sort.Strings(served)
	doc := docMetrics(t)
	// Families with no sample yet (no GPU, no failed open) are absent from
	// a scrape: they must still be documented, and nothing else may be.
	for _, name := range served {
		if !slices.Contains(doc, name) {
			t.Errorf("%s is served but not in docs/operations.md", name)
		}
	}
	unscraped := map[string]bool{"zarrfs_open_errors_total": true}
	for _, name := range doc {
		if !slices.Contains(served, name) && !unscraped[name] {
			t.Errorf("%s is documented but not served", name)
		}
	}
	if len(served) < 20 {
		t.Errorf("only %d zarrfs metrics served: %v", len(served), served)
	}
}

// A daemon whose stderr is a file (mount(8) and fstab start it so) names
// that file in status, text and JSON.
func TestStatusNamesLogFile(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	mnt := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "daemon.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	cmd := exec.Command(zarrfsBin(t), "mount", src, mnt, "--cache", t.TempDir())
	cmd.Stderr = lf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
		}
	})
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.Contains(sc.Text(), "mounted") {
		t.Fatalf("no mounted line: %q", sc.Text())
	}
	go func() {
		for sc.Scan() {
		}
	}()
	stdout, stderr, code := run(t, "status", mnt, "--json")
	var st struct {
		LogFile string `json:"log_file"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &st) != nil || st.LogFile != logPath {
		t.Errorf("status --json: exit %d, log_file %q, want %q\n%s%s", code, st.LogFile, logPath, stdout, stderr)
	}
	if text, _, _ := run(t, "status", mnt); !regexp.MustCompile(`(?m)^log\s+` + regexp.QuoteMeta(logPath) + `$`).MatchString(text) {
		t.Errorf("status text names no log file:\n%s", text)
	}
	// A daemon logging to a pipe has none.
	d := mount(t, src)
	stdout, _, _ = run(t, "status", d.mnt, "--json")
	st.LogFile = "unset"
	if json.Unmarshal([]byte(stdout), &st); st.LogFile != "" {
		t.Errorf("status of a daemon logging to a pipe: log_file %q", st.LogFile)
	}
}

// The soak summary of a passing run reads as one: no "errors 0 ()", no
// "failed" for what the faults are meant to cause.
func TestSoakSummaryWording(t *testing.T) {
	var c soakCounts
	c.reads.Store(100)
	c.ok.Store(28)
	c.restartErrs.Store(72)
	s := c.String()
	for _, bad := range []string{"()", "failed", "errors 0"} {
		if strings.Contains(s, bad) {
			t.Errorf("summary %q contains %q", s, bad)
		}
	}
	if !strings.Contains(s, "reads 100: 28 correct, 0 with wrong bytes; 0 answered with an error and 72 cut off by a daemon kill (both allowed)") {
		t.Errorf("summary %q", s)
	}
	n := &atomic.Int64{}
	n.Store(3)
	c.errnos.Store(syscall.EIO.Error(), n)
	c.errs.Store(3)
	if s := c.String(); !strings.Contains(s, "3 (input/output error=3) answered with an error") {
		t.Errorf("summary with errors %q", s)
	}
}

// On a terminal warm's progress bar counts bytes in the units of its
// summary line (MiB, not MB), and its file count agrees in number.
func TestWarmProgressUnits(t *testing.T) {
	requirePython(t)
	src := exampleStore(t, zarrtest.Example{Times: 40, Levels: 2, Lat: 91, Lon: 180, TimeChunk: 1})
	// warm with stderr on a pseudo-terminal, as a user at a shell runs it.
	out := python(t, `
import os, pty, subprocess, sys
master, slave = pty.openpty()
p = subprocess.Popen(sys.argv[1:], stdin=slave, stdout=subprocess.PIPE, stderr=slave)
os.close(slave)
tty = b""
while True:
    try:
        b = os.read(master, 65536)
    except OSError:
        break
    if not b:
        break
    tty += b
stdout = p.stdout.read()
p.wait()
sys.stdout.write("STDOUT " + stdout.decode() + "\nTTY " + tty.decode(errors="replace"))
`, zarrfsBin(t), "warm", src, "--cache", t.TempDir(), "--jobs", "1")
	i := strings.Index(out, "\nTTY ")
	if i < 0 {
		t.Fatalf("no terminal output:\n%s", out)
	}
	summary, bar := out[:i], out[i:]
	if !strings.Contains(summary, "MiB") || !strings.Contains(summary, "warmed ") {
		t.Fatalf("summary: %s", summary)
	}
	if !strings.Contains(bar, "warming ") || !strings.Contains(bar, "iB") {
		t.Fatalf("no progress bar with byte counts on the terminal:\n%q", bar)
	}
	if m := regexp.MustCompile(`[0-9] (kB|MB|GB)\b`).FindString(bar); m != "" {
		t.Errorf("the progress bar counts decimal units (%q) where the summary counts MiB:\n%q", m, bar)
	}
}
