package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

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
	want string // the last line of stderr, exactly
	code int
}

// checkCLI runs each case and compares its last line of stderr and its
// exit status.
func checkCLI(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, code := runCLI(t, c.args...)
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if last := lines[len(lines)-1]; last != c.want || code != c.code {
				t.Errorf("zarrfs %s:\n got %q, exit %d\nwant %q, exit %d\nstderr:\n%s",
					strings.Join(c.args, " "), last, code, c.want, c.code, stderr)
			}
		})
	}
}

// Usage mistakes name the command once ("zarrfs mount: ...", not
// "zarrfs: zarrfs mount: ...") and say where to look, exit status 2.
func TestCLIUsageLines(t *testing.T) {
	checkCLI(t, []cliCase{
		{"unknown flag", []string{"mount", "--bogus"}, "zarrfs mount: unknown flag: --bogus (see zarrfs mount --help)", 2},
		{"missing args", []string{"mount", "x"}, "zarrfs mount: expected SOURCE and MOUNTPOINT, got 1 argument(s)", 2},
		{"cache gc flag", []string{"cache", "gc", "--nope"}, "zarrfs cache gc: unknown flag: --nope (see zarrfs cache gc --help)", 2},
		{"status args", []string{"status", "a", "b"}, "zarrfs status: expected at most one MOUNTPOINT, got 2 argument(s)", 2},
	})
}
