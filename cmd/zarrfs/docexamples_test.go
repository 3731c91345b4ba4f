package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// The examples of docs/cli.md run, in the order they appear, against the
// example store (zarrtest.DefaultExample) at /data/era5.zarr, with
// /data, /mnt and /nvme made in a temporary folder:
//
//   - a ```console block holds commands ("$ zarrfs ...") each followed by
//     what it prints: its output and its error line, not its log. A
//     command ending in "&" runs until the test ends (a mount), and its
//     first line is what it prints; "# exit N" after a command expects
//     exit status N (else 0).
//   - a ```yaml block whose info string names a path (```yaml
//     /data/tz.yaml) is written there first.
//
// Durations, rates and 32-digit hashes may differ from what the doc shows.
func TestCLIDocExamples(t *testing.T) {
	requireFUSE(t)
	root := t.TempDir()
	for _, d := range []string{"data", "mnt/era5", "nvme"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := zarrtest.DefaultExample.Write(filepath.Join(root, "data", "era5.zarr")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", filepath.Join(root, "xdg"))
	place := strings.NewReplacer("/data/", root+"/data/", "/mnt/", root+"/mnt/", "/nvme/", root+"/nvme/")
	blocks := docBlocks(t, "docs/cli.md")
	ran := 0
	for _, b := range blocks {
		switch {
		case b.info == "console":
			for _, c := range consoleCommands(b) {
				runDocCommand(t, c, root, place)
				ran++
			}
		case strings.HasPrefix(b.info, "yaml /"):
			p := place.Replace(strings.TrimPrefix(b.info, "yaml "))
			if err := os.WriteFile(p, []byte(b.text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ran < 10 {
		t.Errorf("docs/cli.md has %d examples to run; want every command shown", ran)
	}
}

// mainEnv makes the test binary zarrfs itself (TestMain), for commands
// that must run in a process of their own: a mount that zarrfs unmount
// signals and waits for.
const mainEnv = "ZARRFS_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// startCLI runs zarrfs with args in a process of its own until the test
// ends, and returns the first line it prints.
func startCLI(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var errs syncBuilder
	cmd.Stderr = &errs
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("zarrfs %s still running 30s after SIGTERM", strings.Join(args, " "))
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(exited)
	}()
	select {
	case l := <-lines:
		return l
	case <-exited:
		t.Fatalf("zarrfs %s exited %v: %s", strings.Join(args, " "), cmd.ProcessState, errs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("zarrfs %s printed nothing in 30s: %s", strings.Join(args, " "), errs.String())
	}
	return ""
}

// requireFUSE skips a test that mounts where FUSE is missing (fails it
// under CI).
func requireFUSE(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "no /dev/fuse: the test mounts")
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			testenv.Missing(t, "not root and no fusermount3: the test mounts")
		}
	}
}

// docBlock is a fenced code block of a doc.
type docBlock struct {
	info string // after the opening ```
	text string
	line int // of the opening fence
}

func docBlocks(t *testing.T, rel string) []docBlock {
	t.Helper()
	b, err := os.ReadFile("../../" + rel)
	if err != nil {
		t.Fatal(err)
	}
	var out []docBlock
	var cur *docBlock
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &docBlock{info: strings.TrimSpace(l[3:]), line: i + 1}
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		}
	}
	return out
}

// docCommand is one command of a console block and what it prints.
type docCommand struct {
	args       []string
	background bool
	code       int
	want       []string
	line       int
}

func consoleCommands(b docBlock) []docCommand {
	var out []docCommand
	for i, l := range strings.Split(strings.TrimRight(b.text, "\n"), "\n") {
		cmd, isCmd := strings.CutPrefix(l, "$ ")
		if !isCmd {
			if len(out) > 0 {
				out[len(out)-1].want = append(out[len(out)-1].want, l)
			}
			continue
		}
		c := docCommand{line: b.line + 1 + i}
		if cmd, comment, ok := strings.Cut(cmd, "# exit "); ok {
			c.code, _ = strconv.Atoi(strings.TrimSpace(comment))
			l = cmd
		} else {
			l = cmd
		}
		l = strings.TrimSpace(l)
		if s, ok := strings.CutSuffix(l, "&"); ok {
			c.background, l = true, strings.TrimSpace(s)
		}
		c.args = strings.Fields(l)
		out = append(out, c)
	}
	return out
}

// runDocCommand runs one command and compares what it printed.
func runDocCommand(t *testing.T, c docCommand, root string, place *strings.Replacer) {
	t.Helper()
	where := fmt.Sprintf("docs/cli.md:%d: %s", c.line, strings.Join(c.args, " "))
	if len(c.args) == 0 || c.args[0] != "zarrfs" {
		t.Errorf("%s: not a zarrfs command", where)
		return
	}
	args := make([]string, len(c.args)-1)
	for i, a := range c.args[1:] {
		args[i] = place.Replace(a)
	}
	var got []string
	if c.background {
		got = []string{strings.ReplaceAll(startCLI(t, args...), root, "")}
	} else {
		var out, errs strings.Builder
		code := run(context.Background(), args, &out, &errs)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d\nstderr: %s", where, code, c.code, errs.String())
		}
		for _, l := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
			if l != "" {
				got = append(got, l)
			}
		}
		for _, l := range strings.Split(errs.String(), "\n") {
			if strings.HasPrefix(l, "zarrfs") {
				got = append(got, l)
			}
		}
		for i := range got {
			got[i] = strings.ReplaceAll(got[i], root, "")
		}
	}
	want := c.want
	for len(want) > 0 && want[len(want)-1] == "" {
		want = want[:len(want)-1]
	}
	if len(got) != len(want) {
		t.Errorf("%s printed %d lines, the doc shows %d:\n%s\nwant\n%s", where, len(got), len(want), strings.Join(got, "\n"), strings.Join(want, "\n"))
		return
	}
	for i := range got {
		if normalize(got[i]) != normalize(want[i]) {
			t.Errorf("%s, line %d:\n got %s\nwant %s", where, i+1, got[i], want[i])
		}
	}
}

var (
	durationRE = regexp.MustCompile(`\b[0-9]+(\.[0-9]+)?(ns|µs|ms|s|m|h)\b`)
	rateRE     = regexp.MustCompile(`[0-9]+(\.[0-9]+)? [KMGT]?i?B/s`)
	hashRE     = regexp.MustCompile(`\b[0-9a-f]{32}\b`)
)

// normalize makes what may differ from run to run the same: durations,
// rates and hashes.
func normalize(s string) string {
	s = hashRE.ReplaceAllString(s, "HASH")
	s = rateRE.ReplaceAllString(s, "RATE")
	return durationRE.ReplaceAllString(s, "DURATION")
}

// optionalOnly matches what a heading may add to a command's usage:
// optional parts, in brackets.
var optionalOnly = regexp.MustCompile(`^( \[[^\]]+\])*$`)

// docs/cli.md has a section for every command, headed by the command's
// usage as --help gives it: nothing the command takes as optional (such as
// --cache) is shown as required.
func TestCLIDocHeadings(t *testing.T) {
	var headings []string
	for _, b := range strings.Split(readDoc(t, "docs/cli.md"), "## `")[1:] {
		h, _, _ := strings.Cut(b, "`")
		headings = append(headings, h)
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.Runnable() || c.HasSubCommands() || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		use := strings.TrimSuffix(c.UseLine(), " [flags]")
		for _, h := range headings {
			if rest, ok := strings.CutPrefix(h, use); ok && optionalOnly.MatchString(rest) {
				return
			}
		}
		t.Errorf("docs/cli.md has no section headed %q (the usage of %s)", use, c.CommandPath())
	}
	walk(newRootCmd(&profiles{}))
}
