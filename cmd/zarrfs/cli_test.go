package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// runCLI runs the command line args in this process, as main does, and
// returns what it printed and its exit status. The default cache
// ($XDG_CACHE_HOME/zarrfs) is a fresh temporary directory.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	t.Setenv("XDG_CACHE_HOME", filepath.Join(t.TempDir(), "xdg"))
	var out, errs strings.Builder
	code = run(context.Background(), args, &out, &errs)
	return out.String(), errs.String(), code
}

// exampleStore writes the example store (8 time steps of t, u and v, and
// lsm) into a temporary directory and returns its path.
func exampleStore(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "era5.zarr")
	if err := zarrtest.DefaultExample.Write(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// cliCase is a command line and the one error line and status it must
// end with.
type cliCase struct {
	name string
	args []string
	want string // the last line of stderr, exactly, or a regexp when it starts with ^
	code int
}

// matches reports whether line is want (see cliCase.want).
func matches(line, want string) bool {
	if strings.HasPrefix(want, "^") {
		return regexp.MustCompile(want).MatchString(line)
	}
	return line == want
}

// checkCLI runs each case and compares its last line of stderr and its
// exit status.
func checkCLI(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, code := runCLI(t, c.args...)
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if last := lines[len(lines)-1]; !matches(last, c.want) || code != c.code {
				t.Errorf("zarrfs %s:\n got %q, exit %d\nwant %q, exit %d\nstderr:\n%s",
					strings.Join(c.args, " "), last, code, c.want, c.code, stderr)
			}
		})
	}
}

// Usage mistakes are error lines of the one form, "zarrfs: " and the
// object, here the command, once ("zarrfs: mount: ...", neither
// "zarrfs mount: ..." nor "zarrfs: zarrfs mount: ..."), say where to
// look, exit status 2.
func TestCLIUsageLines(t *testing.T) {
	checkCLI(t, []cliCase{
		{"unknown flag", []string{"mount", "--bogus"}, "zarrfs: mount: unknown flag: --bogus (see zarrfs mount --help)", 2},
		{"missing args", []string{"mount", "x"}, "zarrfs: mount: expected SOURCE and MOUNTPOINT, got 1 argument(s)", 2},
		{"cache gc flag", []string{"cache", "gc", "--nope"}, "zarrfs: cache gc: unknown flag: --nope (see zarrfs cache gc --help)", 2},
		{"status args", []string{"status", "a", "b"}, "zarrfs: status: expected at most one MOUNTPOINT, got 2 argument(s)", 2},
		{"root flag", []string{"--bogus"}, "zarrfs: unknown flag: --bogus (see zarrfs --help)", 2},
		{"unknown command", []string{"mout"}, `zarrfs: unknown command "mout" for "zarrfs"; did you mean mount? (see zarrfs --help)`, 2},
		{"unknown subcommand", []string{"cache", "bogus"}, `zarrfs: unknown command "bogus" for "zarrfs cache" (see zarrfs cache --help)`, 2},
	})
}

// A default that a flag the user gave makes invalid follows it: a short
// --source-timeout alone shortens the stall too, and a refusal names only
// flags the user gave or says which value is a default.
func TestCLISourceDeadlines(t *testing.T) {
	store := exampleStore(t)
	if _, stderr, code := runCLI(t, "inspect", store, "--source-timeout", "3s"); code != 0 {
		t.Errorf("inspect --source-timeout 3s: exit %d: %s", code, stderr)
	}
	checkCLI(t, []cliCase{
		{"stall past default timeout", []string{"inspect", store, "--source-stall", "40s"},
			"zarrfs: --source-stall 40s: want a positive duration up to --source-timeout (30s, its default)", 2},
		{"both given", []string{"inspect", store, "--source-timeout", "3s", "--source-stall", "10s"},
			"zarrfs: --source-stall 10s: want a positive duration up to --source-timeout (3s, given)", 2},
	})
}

// A starting command waits for a source that does not answer up to
// --source-timeout, as docs/cli.md says, and then says why it gave up
// (the cause, not only a WARN line) and what it waited for.
func TestCLISourceNotAnswering(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	start := time.Now()
	checkCLI(t, []cliCase{
		{"refused", []string{"inspect", "http://" + addr + "/s.zarr", "--source-timeout", "2s"},
			`^zarrfs: http://` + regexp.QuoteMeta(addr) + `/s\.zarr/zarr\.json: get: source not answering for [0-9.]+m?s \(connection refused\); gave up after [0-9.]+m?s \(--source-timeout 2s, [0-9]+ tries\)$`, 1},
	})
	if el := time.Since(start); el < time.Second {
		t.Errorf("gave up after %v, before a second try (the budget is 2s)", el)
	}
}

// writeFile writes text to name in a temporary directory and returns its
// absolute path.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const goodView = `views:
  - name: tz
    dtype: float32
    channels:
      - var: t
        select: {level: all}
      - var: z
        select: {level: [0]}
      - var: lsm
`

// inspect --view checks a view file against the store as a mount binds
// it, and lists each view's files, shape, dtype and bytes.
func TestCLIInspectView(t *testing.T) {
	store := exampleStore(t)
	view := writeFile(t, "v.yaml", goodView)
	stdout, stderr, code := runCLI(t, "inspect", store, "--view", view)
	want := "1 view\ntz/ (" + view + ")\n" +
		"  8 files  shape [5 73 144]  dims [channel, latitude, longitude]  dtype <f4\n" +
		"  209 KiB a file, 1.6 MiB in all\n"
	if code != 0 || !strings.HasSuffix(stdout, want) {
		t.Errorf("inspect --view: exit %d, output ends\n%s\nwant\n%s\nstderr: %s", code, stdout[max(0, len(stdout)-len(want)):], want, stderr)
	}
	stdout, _, code = runCLI(t, "inspect", store, "--view", view, "--json")
	var doc struct {
		Arrays []inspectEntry
		Views  []viewEntry
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil || code != 0 {
		t.Fatalf("inspect --view --json: exit %d, %v:\n%s", code, err, stdout)
	}
	wantView := viewEntry{Name: "tz", File: view, Mount: "tz/", Files: 8, Shape: []int64{5, 73, 144},
		Dims: []string{"channel", "latitude", "longitude"}, DType: "<f4", FileBytes: 4096 + 5*73*144*4, Bytes: 8 * (4096 + 5*73*144*4)}
	if len(doc.Arrays) != 8 || len(doc.Views) != 1 || !reflect.DeepEqual(doc.Views[0], wantView) {
		t.Errorf("inspect --view --json: %d arrays, views %+v; want 8 arrays and %+v", len(doc.Arrays), doc.Views, wantView)
	}
}

// A view file is judged alike by mount, warm and inspect: one rule for
// bad input files (missing, unreadable or not a view file: a usage error,
// exit 2; a view that does not fit the store: exit 1, the same file fits
// another store), each named by its absolute path, a YAML error at the
// line it is on. A mount that fails so leaves no cache directory behind.
func TestCLIViewErrors(t *testing.T) {
	store := exampleStore(t)
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	syntax := writeFile(t, "bad.yaml", "views:\n  - name: a\n channels: []\n")
	key := writeFile(t, "key.yaml", "views:\n  - name: a\n    chanels: []\n")
	unfit := writeFile(t, "unfit.yaml", "views:\n  - name: x\n    channels:\n      - var: nope\n")
	cases := []struct {
		file, want string
		code       int
	}{
		{missing, "zarrfs: --view " + missing + ": no such file", 2},
		{t.TempDir(), "", 2},
		{syntax, "zarrfs: " + syntax + ":3: bad YAML: did not find expected key", 2},
		{key, "zarrfs: " + key + `:3: view "a": unknown key "chanels" (known: name, sample_dim, samples, dtype, channels)`, 2},
		{unfit, "zarrfs: " + unfit + `:4: view "x": channels[0].var: array "nope" not found in the store`, 1},
	}
	cases[1].want = "zarrfs: --view " + cases[1].file + ": a directory, not a view file"
	for _, c := range cases {
		for _, cmd := range [][]string{
			{"mount", store, t.TempDir()},
			{"warm", store, "--cache", filepath.Join(t.TempDir(), "c")},
			{"inspect", store},
		} {
			args := append(cmd, "--view", c.file)
			checkCLI(t, []cliCase{{filepath.Base(c.file) + " " + cmd[0], args, c.want, c.code}})
		}
	}
	// The default cache directory, for a mount that fails at binding.
	xdg := filepath.Join(t.TempDir(), "xdg")
	t.Setenv("XDG_CACHE_HOME", xdg)
	var out, errs strings.Builder
	if code := run(context.Background(), []string{"mount", store, t.TempDir(), "--view", unfit}, &out, &errs); code != 1 {
		t.Fatalf("mount with a view that does not fit: exit %d: %s", code, errs.String())
	}
	if _, err := os.Stat(xdg); !os.IsNotExist(err) {
		t.Errorf("a failed mount left %s behind (%v)", xdg, err)
	}
}

// Errors name the object by its absolute path, say what is wrong with
// it in the words the others use, and exit with the documented status.
func TestCLIMessages(t *testing.T) {
	store := exampleStore(t)
	dir := t.TempDir()
	t.Chdir(dir)
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	cache := filepath.Join(t.TempDir(), "c")
	checkCLI(t, []cliCase{
		{"status missing cache", []string{"status", "--cache", "nope"}, "zarrfs: " + abs("nope") + ": no such directory", 1},
		{"missing store", []string{"inspect", "nope.zarr"}, "zarrfs: " + abs("nope.zarr") + ": no such directory", 1},
		{"missing reference file", []string{"inspect", "/x/nosuch.json"}, "zarrfs: /x/nosuch.json: no such file", 1},
		{"missing mountpoint", []string{"mount", store, "none"}, "zarrfs: " + abs("none") + ": no such directory", 1},
		{"credentials", []string{"inspect", "https://u:secret@example.com/s.zarr"},
			"zarrfs: an http URL must not hold credentials; give the bearer token in ZARRFS_HTTP_BEARER_TOKEN instead", 2},
		{"world without rank", []string{"warm", store, "--cache", cache, "--world", "2"}, "zarrfs: --world 2 without --rank: give this node's rank, 0 to 1", 2},
		{"mount world without rank", []string{"mount", store, t.TempDir(), "--world", "4"}, "zarrfs: --world 4 without --rank: give this node's rank, 0 to 3", 2},
		{"rank without world", []string{"warm", store, "--cache", cache, "--rank", "0"}, "zarrfs: --rank 0 without --world: give the number of ranks too", 2},
		{"shard without world", []string{"mount", store, t.TempDir(), "--shard", "interleaved"},
			"zarrfs: --shard interleaved without --world: it splits samples among ranks only with --rank and --world", 2},
		{"samples backwards", []string{"warm", store, "--cache", cache, "--samples", "5:2"},
			`zarrfs: --samples "5:2": STOP 2 is before START 5 (START:STOP takes samples START to STOP-1)`, 2},
		{"samples not a number", []string{"warm", store, "--cache", cache, "--samples", "a:2"}, `zarrfs: --samples "a:2": START "a" is not a whole number`, 2},
		{"unmount plain folder", []string{"unmount", "."}, "zarrfs: " + dir + ": not mounted", 1},
		{"unmount missing", []string{"unmount", "gone"}, "zarrfs: " + abs("gone") + ": no such directory", 1},
		{"unmount another filesystem", []string{"unmount", "/proc"}, "zarrfs: /proc: mounted as proc (proc), not zarrfs; zarrfs unmount leaves it alone (use umount)", 1},
		{"status another filesystem", []string{"status", "/proc"}, "zarrfs: /proc: mounted as proc (proc), not zarrfs", 1},
	})
	if _, err := os.Stat(cache); !os.IsNotExist(err) {
		t.Errorf("refused commands made the cache %s (%v)", cache, err)
	}
}

// mountCLI runs zarrfs mount with args in this process until the test
// ends, and returns its mountpoint once the mount is live and the line
// it printed.
func mountCLI(t *testing.T, store, mnt string, args ...string) string {
	t.Helper()
	// zarrfs unmount signals the daemon, this process: SIGTERM ends the
	// mount, as it does zarrfs's main, not the test.
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	out, errs := &syncBuilder{}, &syncBuilder{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"mount", store, mnt}, args...), out, errs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("mount exited %d: %s", code, errs.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("mount still running 30s after it was told to stop")
		}
	})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(out.String(), "\n") {
			return strings.TrimSpace(out.String())
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("mount exited %d: %s", code, errs.String())
		default:
		}
	}
	t.Fatalf("mount not live after 30s: %s", errs.String())
	return ""
}

// syncBuilder is a strings.Builder safe for a writer and a reader.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The mount's line names the mountpoint by its absolute path, and
// unmount of a folder inside a mount says which mount to unmount.
func TestCLIMountLines(t *testing.T) {
	requireFUSE(t)
	store := exampleStore(t)
	dir := t.TempDir()
	t.Chdir(dir)
	os.Mkdir("mnt", 0o755)
	mnt := filepath.Join(dir, "mnt")
	line := mountCLI(t, store, "mnt", "--cache", filepath.Join(t.TempDir(), "c"))
	if want := "zarrfs: mounted file://" + store + " at " + mnt + " (8 arrays, "; !strings.HasPrefix(line, want) {
		t.Errorf("mount printed %q, want it to start %q", line, want)
	}
	checkCLI(t, []cliCase{
		{"inside a mount", []string{"unmount", "mnt/t"},
			"zarrfs: " + mnt + "/t: not a mount point: it is inside the zarrfs mount at " + mnt + " (zarrfs unmount " + mnt + ")", 1},
	})
}

// With --direct, a write through a link (root ignores the blob's
// read-only mode) is never served: the next resolution of the link finds
// the blob's size or modification time changed and fills it again, even
// within its lease, for a write that keeps the size too.
func TestCLIDirectWriteThroughLink(t *testing.T) {
	requireFUSE(t)
	store := exampleStore(t)
	mnt := t.TempDir()
	mountCLI(t, store, mnt, "--direct", "--cache", filepath.Join(t.TempDir(), "c"))
	for _, tc := range []struct {
		file  string
		write func(p string) error
	}{
		{"t/5.npy", func(p string) error { return os.WriteFile(p, []byte("x\n"), 0o644) }},
		{"t/6.npy", func(p string) error {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("broken"), 4096)
			return err
		}},
	} {
		p := filepath.Join(mnt, tc.file)
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		blob, err := filepath.EvalSymlinks(p)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // a later tick of the file times
		// As root does, whatever the mode: the test may run as another user.
		if err := os.Chmod(blob, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := tc.write(p); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s after a write through its link: %d bytes (%v), equal to before: %v", tc.file, len(got), err, bytes.Equal(got, want))
		}
	}
}

// cache gc and warm --prune keep the files of names the command's layout
// does not serve (another mount's views, arrays gone from the store), and
// say so: how many, where, and why.
func TestCLIPruneSaysWhatItKept(t *testing.T) {
	store := exampleStore(t)
	view := writeFile(t, "v.yaml", goodView)
	cache := filepath.Join(t.TempDir(), "c")
	if _, stderr, code := runCLI(t, "warm", store, "--cache", cache, "--view", view, "--only", "tz"); code != 0 {
		t.Fatalf("warm: exit %d: %s", code, stderr)
	}
	kept := "zarrfs: kept 8 files (1.6 MiB) under tz/, which this command does not serve: another mount's views (give their --view to prune them too) or arrays gone from the store (remove those folders by hand)"
	removed := regexp.MustCompile(`^zarrfs: removed 0 stale files \(0 B\) from ` + regexp.QuoteMeta(cache) + `/blobs/[0-9a-f]+$`)
	for _, args := range [][]string{
		{"cache", "gc", store, "--cache", cache},
		{"warm", store, "--cache", cache, "--only", "lsm.npy", "--prune"},
	} {
		stdout, stderr, code := runCLI(t, args...)
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if n := len(lines); code != 0 || n < 2 || !removed.MatchString(lines[n-2]) || lines[n-1] != kept {
			t.Errorf("zarrfs %s: exit %d, printed\n%s\nwant its last lines to be\n%s\n%s\nstderr: %s", strings.Join(args, " "), code, stdout, removed, kept, stderr)
		}
	}
	stdout, _, code := runCLI(t, "cache", "gc", store, "--cache", cache, "--view", view)
	if code != 0 || strings.Contains(stdout, "kept") {
		t.Errorf("cache gc with the view: exit %d, printed\n%s", code, stdout)
	}
}

// A flag that would do nothing for the source given is refused (exit 2),
// naming the flag and what it applies to: the GCS flags off gs://, as the
// S3 flags off s3://, and the virtual store flags on a plain store.
func TestCLIFlagsThatWouldDoNothing(t *testing.T) {
	store := exampleStore(t)
	checkCLI(t, []cliCase{
		{"gcs", []string{"inspect", store, "--gcs-anonymous"},
			"zarrfs: --gcs-anonymous: " + store + " is not on GCS (gs://); GCS flags apply to gs://BUCKET/PREFIX, or to a reference set's targets in a bucket --ref-allow names", 2},
		{"s3", []string{"warm", store, "--s3-region", "x"},
			"zarrfs: --s3-region: " + store + " is not on S3 (s3://); S3 flags apply to s3://BUCKET/PREFIX, or to a reference set's targets in a bucket --ref-allow names", 2},
		{"ref", []string{"inspect", store, "--ref", "main"},
			"zarrfs: --ref: " + store + " is a plain Zarr store, not a kerchunk reference set or an Icechunk repository, which --ref applies to", 2},
		{"ref-base", []string{"mount", store, t.TempDir(), "--ref-base", t.TempDir()},
			"zarrfs: --ref-base: " + store + " is a plain Zarr store, not a kerchunk reference set or an Icechunk repository, which --ref-base applies to", 2},
	})
	// --ref-allow naming a bucket makes the S3 flags mean something.
	if _, stderr, code := runCLI(t, "inspect", store, "--s3-anonymous", "--ref-allow", "s3://b/"); !strings.Contains(stderr, "--ref-allow: "+store+" is a plain Zarr store") || code != 2 {
		t.Errorf("--s3-anonymous --ref-allow s3://b/ on a plain store: exit %d: %s", code, stderr)
	}
}

// A source of a scheme zarrfs does not read is named as such, not looked
// for as a local directory; a range of samples the store does not have is
// a runtime error (the same range fits a longer store).
func TestCLISourceSchemes(t *testing.T) {
	store := exampleStore(t)
	checkCLI(t, []cliCase{
		{"unknown scheme", []string{"inspect", "ftp://host/x.zarr"},
			"zarrfs: ftp://host/x.zarr: zarrfs reads local paths and file://, s3://, gs://, http://, https:// and reference:// URLs, not ftp://", 2},
		{"alias", []string{"inspect", "s3a://b/x.zarr"}, "zarrfs: s3a://b/x.zarr: a store's URL is s3://, not s3a:// (which reference sets' targets may use)", 2},
		{"samples past the end", []string{"warm", store, "--cache", filepath.Join(t.TempDir(), "c"), "--samples", "20:30"},
			"zarrfs: --samples 20:30: no sample directory has samples in that range (t/ has 8, u10/ has 8, z/ has 8)", 1},
	})
}
