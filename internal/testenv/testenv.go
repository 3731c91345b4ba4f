// Package testenv decides what a test does when a tool it needs is missing
// (python3 and its modules, FUSE, MinIO, the writer of the fixture stores): on a
// developer's machine it skips, saying what is missing; under continuous
// integration ($CI true, as CI services set it) it fails, because there
// every tool must be present and a skip would hide an untested feature.
// GPU tests are the one exception: CI machines have no GPU, so those skip
// everywhere (package gpu), and `make test-gpu` runs them on a GPU machine.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
)

// CI reports whether the tests run under continuous integration: $CI is a
// true boolean ("true", "1", ...).
func CI() bool {
	ci, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && ci
}

// Missing skips t, or fails it under CI, with the message; it does not
// return.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("missing under CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// recorder stands in for a test, recording whether it skipped or failed.
type recorder struct {
	testing.TB
	outcome string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Logf(string, ...any)       {}
func (r *recorder) Skip(args ...any)          { r.Skipf("%s", fmt.Sprint(args...)) }
func (r *recorder) Fatal(args ...any)         { r.Fatalf("%s", fmt.Sprint(args...)) }
func (r *recorder) Errorf(f string, a ...any) { r.outcome = "fail: " + fmt.Sprintf(f, a...) }
func (r *recorder) Skipf(format string, args ...any) {
	r.outcome = "skip: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.outcome = "fail: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// Outcome runs f as a test body and reports "skip: MESSAGE", "fail:
// MESSAGE" or "pass": tests of the require helpers use it to see what a
// missing tool does. f may call Helper, Logf, Errorf, Skip(f) and
// Fatal(f) on its t, nothing else.
func Outcome(f func(t testing.TB)) string {
	r := &recorder{outcome: "pass"}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.outcome
}

// Python skips t (or fails it under CI) when python3 or one of the modules
// is missing.
func Python(t testing.TB, modules ...string) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		Missing(t, "python3 not found")
	}
	for _, m := range modules {
		if err := exec.Command("python3", "-c", "import "+m).Run(); err != nil {
			Missing(t, "python module %s not installed (make pydeps)", m)
		}
	}
}
