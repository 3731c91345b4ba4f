package integration

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// statusJSON is the part of `zarrfs status --json` the tests read.
type statusJSON struct {
	LogFile    string   `json:"log_file"`
	Mountpoint string   `json:"mountpoint"`
	Source     string   `json:"source"`
	PID        int      `json:"pid"`
	Args       []string `json:"args"`
	Uptime     float64  `json:"uptime_seconds"`
	Cache      struct {
		Dir     string `json:"dir"`
		Budget  int64  `json:"budget_bytes"`
		Used    int64  `json:"used_bytes"`
		Files   int    `json:"files"`
		Hits    int64  `json:"blob_hits"`
		Fills   int64  `json:"blob_fills"`
		Filling int64  `json:"fills_in_flight"`
	} `json:"cache"`
	Mount struct {
		Direct      bool  `json:"direct"`
		Passthrough bool  `json:"passthrough"`
		Opens       int64 `json:"opens"`
		OpenFiles   int64 `json:"open_files"`
	} `json:"mount"`
	Decode struct {
		Placement string `json:"placement"`
		Decoded   []struct {
			Codec, Device string
			Chunks, Bytes int64
		} `json:"decoded"`
	} `json:"decode"`
	Errors map[string]int `json:"errors_by_array"`
}

// mount(8) with -t fuse.zarrfs (the helper linked as
// /sbin/mount.fuse.zarrfs, as an fstab entry uses it): the mount is live
// when mount returns 0; `zarrfs status` describes it; `zarrfs unmount`
// stops the daemon and frees the mountpoint; a failing mount returns 32
// with the daemon's error.
func TestFstabMountStatusUnmount(t *testing.T) {
	requireMountTools(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "mount(8) with a helper under /sbin needs root")
	}
	if _, err := exec.LookPath("mount"); err != nil {
		testenv.Missing(t, "no mount(8)")
	}
	const helper = "/sbin/mount.fuse.zarrfs"
	if _, err := os.Lstat(helper); err == nil {
		t.Skipf("%s exists already; not replacing another installation", helper)
	}
	if err := os.Symlink(zarrfsBin(t), helper); err != nil {
		t.Skipf("cannot install the helper: %v", err)
	}
	t.Cleanup(func() { os.Remove(helper) })

	src := exampleStore(t, zarrtest.Example{Times: 6, Levels: 2, Lat: 19, Lon: 36, TimeChunk: 2})
	mnt, cacheDir := t.TempDir(), t.TempDir()
	logFile := filepath.Join(t.TempDir(), "daemon.log")
	out, err := exec.Command("mount", "-t", "fuse.zarrfs", src, mnt, "-o",
		"cache="+cacheDir+",cache_size=64MiB,direct,readahead=2,ro,_netdev,x-systemd.automount,log="+logFile).CombinedOutput()
	if err != nil {
		t.Fatalf("mount -t fuse.zarrfs: %v: %s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	if !isMounted(mnt) {
		t.Fatal("mount returned 0 but nothing is mounted")
	}
	for _, f := range []string{"t/0.npy", "t/1.npy", "z/5.npy"} {
		if _, err := os.ReadFile(filepath.Join(mnt, f)); err != nil {
			t.Fatal(err)
		}
	}
	stdout, stderr, code := run(t, "status", mnt, "--json")
	if code != 0 {
		t.Fatalf("status: %d %s", code, stderr)
	}
	var st statusJSON
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, stdout)
	}
	if st.Mountpoint != mnt || !strings.HasPrefix(st.Source, "file://") || !st.Mount.Direct || st.Cache.Budget != 64<<20 ||
		st.Cache.Dir != cacheDir || st.Mount.Opens < 3 || st.Cache.Fills < 3 || st.Cache.Used <= 0 || st.Cache.Files < 3 ||
		st.PID <= 0 || !strings.Contains(strings.Join(st.Args, " "), "--direct") || !strings.HasPrefix(st.Decode.Placement, "cpu") {
		t.Errorf("status: %+v", st)
	}
	var zstdCPU bool
	for _, d := range st.Decode.Decoded {
		zstdCPU = zstdCPU || (d.Codec == "zstd" && d.Device == "cpu" && d.Chunks > 0 && d.Bytes > 0)
	}
	if !zstdCPU {
		t.Errorf("status names no zstd chunks decoded on the CPU: %+v", st.Decode)
	}
	if text, _, _ := run(t, "status", mnt); !strings.Contains(text, "cache") || !strings.Contains(text, "64 MiB") {
		t.Errorf("status text:\n%s", text)
	}
	if _, stderr, code := run(t, "unmount", mnt); code != 0 {
		t.Fatalf("unmount: %d %s", code, stderr)
	}
	if isMounted(mnt) {
		t.Error("still mounted after zarrfs unmount")
	}
	if !exited(st.PID) {
		t.Errorf("daemon %d still running after zarrfs unmount", st.PID)
	}
	// The daemon told the helper once that the mount was live, and nobody
	// at shutdown: the helper was long gone.
	if log, err := os.ReadFile(logFile); err != nil || strings.Contains(string(log), "notification failed") {
		t.Errorf("daemon log (%v):\n%s", err, log)
	}
	if _, stderr, code := run(t, "unmount", mnt); code == 0 || !strings.Contains(stderr, "not mounted") {
		t.Errorf("second unmount: %d %s", code, stderr)
	}

	// A failing mount: status 32 and the daemon's own error.
	out, err = exec.Command("mount", "-t", "fuse.zarrfs", filepath.Join(t.TempDir(), "missing.zarr"), mnt, "-o", "cache="+cacheDir).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 32 || !strings.Contains(string(out), "missing.zarr") {
		t.Errorf("mount of a missing store: %v: %s", err, out)
	}
	out, err = exec.Command("mount", "-t", "fuse.zarrfs", src, mnt, "-o", "cache="+cacheDir+",bogus=1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `unknown option "bogus"`) {
		t.Errorf("mount with an unknown option: %v: %s", err, out)
	}
	if isMounted(mnt) {
		t.Error("a failed mount left a mount")
	}

	// Without log=, the daemon logs to a file beside its record, which
	// goes when the mount ends, as it does when the mount fails to start
	// (the helper printed the error): nothing is left behind.
	out, err = exec.Command("mount", "-t", "fuse.zarrfs", src, mnt, "-o", "cache="+cacheDir).CombinedOutput()
	if err != nil {
		t.Fatalf("mount -t fuse.zarrfs without log=: %v: %s", err, out)
	}
	stdout, stderr, code = run(t, "status", mnt, "--json")
	st = statusJSON{}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil || code != 0 || st.LogFile == "" {
		t.Fatalf("status: %d %v %s\n%s", code, err, stderr, stdout)
	}
	if _, err := os.Stat(st.LogFile); err != nil {
		t.Errorf("the daemon's log: %v", err)
	}
	if _, stderr, code := run(t, "unmount", mnt); code != 0 {
		t.Fatalf("unmount: %d %s", code, stderr)
	}
	for i := 0; i < 100 && !exited(st.PID); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(st.LogFile); !os.IsNotExist(err) {
		t.Errorf("%s left after the mount ended (%v)", st.LogFile, err)
	}
	failed := filepath.Join(t.TempDir(), "m")
	os.Mkdir(failed, 0o755)
	exec.Command("mount", "-t", "fuse.zarrfs", filepath.Join(t.TempDir(), "missing.zarr"), failed, "-o", "cache="+cacheDir).Run()
	if _, err := os.Stat(strings.Replace(st.LogFile, filepath.Base(st.LogFile), recordBase(failed)+".log", 1)); !os.IsNotExist(err) {
		t.Errorf("a mount that failed to start left its log (%v)", err)
	}
}

// recordBase is the name a mount's record and log have in the registry
// (cmd/zarrfs's recordName without ".json").
func recordBase(mountpoint string) string {
	h := sha256.Sum256([]byte(mountpoint))
	return hex.EncodeToString(h[:8])
}

// unmount --lazy detaches a mount whose files are open, and the daemon
// exits once they are closed... or at once: it unmounts lazily itself.
func TestUnmountLazyWithOpenFile(t *testing.T) {
	requireMountTools(t)
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 9, Lon: 16, TimeChunk: 1})
	d := mount(t, src)
	f, err := os.Open(filepath.Join(d.mnt, "t", "0.npy"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, stderr, code := run(t, "unmount", d.mnt, "--lazy", "--timeout", "20s"); code != 0 {
		t.Fatalf("unmount --lazy: %d %s", code, stderr)
	}
	if isMounted(d.mnt) {
		t.Error("still mounted after unmount --lazy")
	}
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		t.Fatal("daemon still running")
	}
	if d.err != nil {
		t.Errorf("daemon exit: %v", d.err)
	}
}

// The metrics answer "is the cache helping": hits, misses, evictions, fill
// times by array, decoded bytes by codec and device, open files; every
// label's values stay bounded by the store's arrays however many files
// are read.
func TestMetricsAfterManyFiles(t *testing.T) {
	requireMountTools(t)
	ex := zarrtest.Example{Times: 10000, Levels: 1, Lat: 2, Lon: 3, TimeChunk: 500}
	src := exampleStore(t, ex)
	d := mount(t, src, "--metrics", "127.0.0.1:0", "--readahead", "0", "--cache-size", "1MiB", "--log-format", "json")
	url := metricsURL(t, d)
	ents, err := os.ReadDir(filepath.Join(d.mnt, "t"))
	if err != nil || len(ents) != ex.Times {
		t.Fatalf("t/: %d entries, %v", len(ents), err)
	}
	for _, e := range ents {
		if _, err := os.ReadFile(filepath.Join(d.mnt, "t", e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	os.ReadFile(filepath.Join(d.mnt, "t", "0000.npy")) // a hit, unless evicted
	fams := scrape(t, url)
	value := func(name string) float64 {
		f := fams[name]
		if f == nil || len(f.Metric) == 0 {
			t.Errorf("metric %s missing", name)
			return 0
		}
		var sum float64
		for _, m := range f.Metric {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
		return sum
	}
	if got := value("zarrfs_cache_misses_total"); got < float64(ex.Times) {
		t.Errorf("cache misses %v, want at least %d", got, ex.Times)
	}
	if got := value("zarrfs_cache_evictions_total"); got <= 0 {
		t.Errorf("no evictions under a 1 MiB budget")
	}
	if got := value("zarrfs_fill_seconds"); got < float64(ex.Times) {
		t.Errorf("fill histogram holds %v fills, want at least %d", got, ex.Times)
	}
	value("zarrfs_cache_hits_total")
	value("zarrfs_open_files")
	value("zarrfs_cache_bytes")
	if got := value("zarrfs_decoded_bytes_total"); got <= 0 {
		t.Error("no decoded bytes")
	}
	fill := fams["zarrfs_fill_seconds"]
	if fill == nil {
		t.Fatal("no zarrfs_fill_seconds")
	}
	for _, m := range fill.Metric {
		for _, l := range m.Label {
			if l.GetName() == "array" && l.GetValue() != "t" {
				t.Errorf("fill label array=%q, want t", l.GetValue())
			}
		}
	}
	for name, f := range fams {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		if len(f.Metric) > 20 {
			t.Errorf("%s has %d label sets after %d files: unbounded labels", name, len(f.Metric), ex.Times)
		}
	}
	// --log-format json: every line the daemon wrote is one JSON object.
	sc := bufio.NewScanner(strings.NewReader(d.stderr.String()))
	lines := 0
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil || v["msg"] == nil {
			t.Errorf("log line not JSON: %q", sc.Text())
		}
		lines++
	}
	if lines == 0 {
		t.Error("no log lines")
	}
}

var metricsLine = regexp.MustCompile(`"url":"(http://[^"]+/metrics)"|url=(http://\S+/metrics)`)

func metricsURL(t testing.TB, d *daemon) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := metricsLine.FindStringSubmatch(d.stderr.String()); m != nil {
			return m[1] + m[2]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no metrics URL in the log:\n%s", d.stderr)
	return ""
}

func scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	return fams
}

// The systemd units in contrib/ pass `systemd-analyze verify` (with the
// test's binary in place of /usr/local/bin/zarrfs).
func TestSystemdUnitsVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the units are checked where it is")
	}
	dir := t.TempDir()
	units, _ := filepath.Glob(filepath.Join(repoRoot(t), "contrib", "systemd", "*"))
	if len(units) < 3 {
		t.Fatalf("contrib/systemd holds %d units", len(units))
	}
	var args []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("/usr/local/bin/zarrfs"), []byte(zarrfsBin(t)))
		name := filepath.Base(u)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, "@.service") {
			name = strings.Replace(name, "@.", "@0.", 1)
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		args = append(args, filepath.Join(dir, name))
	}
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, args...)...).CombinedOutput()
	// Warnings about this machine (no systemd running, units it lacks)
	// are not the units' fault; anything naming our files or units (a
	// command that is not executable, say) is.
	for _, line := range strings.Split(string(out), "\n") {
		for _, a := range args {
			if strings.Contains(line, dir) || strings.Contains(line, filepath.Base(a)+":") {
				t.Errorf("systemd-analyze verify: %s", line)
				break
			}
		}
	}
	if err != nil && len(out) == 0 {
		t.Errorf("systemd-analyze verify: %v", err)
	}
}

// exited reports whether process pid has ended: gone, or a zombie that its
// parent (here the system's reaper: the helper that started the daemon is
// gone) has not collected yet.
func exited(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && len(b) > i+2 && b[i+2] == 'Z'
}
