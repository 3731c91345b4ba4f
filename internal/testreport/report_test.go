package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// run feeds go test -json of a small module holding src to a report.
func run(t *testing.T, src string) (*report, string, string) {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{
		"go.mod":    "module example.com/m\n\ngo 1.24\n",
		"m_test.go": src,
		"ok/ok.go":  "package ok\n",
	} {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-json", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	in, _ := cmd.CombinedOutput() // fails when a test does
	var out bytes.Buffer
	r := newReport(&out)
	if err := r.read(bytes.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	line := r.finish()
	return r, out.String(), line
}

func TestReport(t *testing.T) {
	r, out, line := run(t, `package m
import "testing"
func TestPass(t *testing.T) { t.Log("quiet") }
func TestSkips(t *testing.T) {
	t.Run("root", func(t *testing.T) { t.Log("first"); t.Skip("needs root\nto chown") })
	t.Run("fine", func(t *testing.T) {})
}
func TestFail(t *testing.T) { t.Log("context"); t.Error("wrong value") }
`)
	if want := "go: 3 passed, 1 failed, 1 skipped (1 packages failed)"; line != want {
		t.Errorf("totals %q, want %q", line, want)
	}
	if r.ok() {
		t.Error("a run with a failure reported ok")
	}
	for _, want := range []string{
		"--- FAIL: example.com/m TestFail\n",
		"m_test.go:8: wrong value\n",
		"m_test.go:8: context\n",
		"FAIL\texample.com/m\t",
		"(3 passed, 1 failed, 1 skipped)",
		"?   \texample.com/m/ok\t[no tests]\n",
		"skipped tests (1):\n  example.com/m TestSkips/root: needs root / to chown (m_test.go:5)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "quiet") || strings.Contains(out, "first") {
		t.Errorf("output of tests that passed or of earlier log lines shown:\n%s", out)
	}
}

func TestReportAllPass(t *testing.T) {
	r, out, line := run(t, "package m\nimport \"testing\"\nfunc TestA(t *testing.T) {}\n")
	if line != "go: 1 passed, 0 failed, 0 skipped" || !r.ok() {
		t.Errorf("totals %q, ok %v:\n%s", line, r.ok(), out)
	}
	if !strings.Contains(out, "ok  \texample.com/m\t") {
		t.Errorf("no ok line:\n%s", out)
	}
}

// A cached result says so, with the cached run's counts.
func TestReportCached(t *testing.T) {
	var out bytes.Buffer
	r := newReport(&out)
	r.read(strings.NewReader(`{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Output":"ok  \tp\t(cached)\n"}
{"Action":"pass","Package":"p","Elapsed":0}
`))
	r.finish()
	if !strings.Contains(out.String(), "ok  \tp\t(cached)\t(1 passed)\n") || !r.ok() {
		t.Errorf("ok %v:\n%s", r.ok(), out.String())
	}
}

// A package that does not build fails the run and shows the compiler's
// message; one that panics shows the panic and the test it was in.
func TestReportBrokenPackages(t *testing.T) {
	r, out, _ := run(t, "package m\nimport \"testing\"\nfunc TestA(t *testing.T) { undefinedName() }\n")
	if r.ok() || !strings.Contains(out, "undefined: undefinedName") || !strings.Contains(out, "[build failed]") {
		t.Errorf("ok %v:\n%s", r.ok(), out)
	}
	r, out, _ = run(t, "package m\nimport \"testing\"\nfunc TestA(t *testing.T) { t.Log(\"before\"); var m map[int]int; m[1] = 1 }\n")
	if r.ok() || !strings.Contains(out, "assignment to entry in nil map") {
		t.Errorf("ok %v:\n%s", r.ok(), out)
	}
}

func TestReportNoTests(t *testing.T) {
	r := newReport(&bytes.Buffer{})
	r.read(strings.NewReader("go: downloading something\n"))
	r.finish()
	if r.ok() {
		t.Error("a run of no test reported ok")
	}
}
