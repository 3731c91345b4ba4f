// Command mutate breaks the code on purpose, one behaviour at a time, runs
// the tests that should notice, and reports which mutations the suite
// catches. It never touches the working tree: each mutant is a copy of one
// source file handed to `go test -overlay` (and, for the packages that run
// the zarrfs binary, to the `go build -overlay` of that binary, through
// ZARRFS_BIN).
//
// A mutation of the Python package (a File under python/src) is tried
// the same way without touching the tree: pytest runs the mutation's tests
// against a copy of python/src holding the mutant, put first on
// PYTHONPATH.
//
// Usage (from the repository root, or `make mutate`):
//
//	go run ./integration/mutate [-only REGEXP] [-run REGEXP] [-python PYTHON] [-list] [-v]
//
// A mutation is caught when its tests fail, missed when they pass, stale
// when its original text no longer occurs exactly once in the file (the
// code moved: update the table in mutations.go), and broken when the
// mutant does not compile. The exit status is 1 when any mutation is
// missed, stale or broken, and 2 when the tests fail without any mutation
// (nothing could be concluded then).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/zarrfs/zarrfs/internal/fixtures"
)

func main() {
	only := flag.String("only", "", "run only the mutations whose name matches this regular expression")
	list := flag.Bool("list", false, "list the mutations and exit")
	verbose := flag.Bool("v", false, "print the tests' output of every run")
	run := flag.String("run", "", "run only the tests matching this regular expression (go test -run), instead of each mutation's own")
	python := flag.String("python", "python3", "the Python that runs the mutations of the Python package (with pytest)")
	flag.Parse()
	root, err := fixtures.RepoRoot()
	if err != nil {
		fatal(err)
	}
	re, err := regexp.Compile(*only)
	if err != nil {
		fatal(fmt.Errorf("-only: %w", err))
	}
	var ms []mutation
	for _, m := range mutations {
		if re.MatchString(m.Name) {
			ms = append(ms, m)
		}
	}
	if *list {
		for _, m := range ms {
			fmt.Printf("%-28s %-26s %s\n", m.Name, m.File, m.Breaks)
		}
		return
	}
	if len(ms) == 0 {
		fatal(fmt.Errorf("no mutation matches %q", *only))
	}
	r := &runner{root: root, verbose: *verbose, run: *run, python: *python}
	if err := r.baseline(ms); err != nil {
		fatal(err)
	}
	var missed, stale int
	fmt.Printf("%-28s %-8s %7s  %s\n", "mutation", "result", "seconds", "tests that failed (or why)")
	for _, m := range ms {
		res := r.try(m)
		fmt.Printf("%-28s %-8s %7.1f  %s\n", m.Name, res.verdict, res.secs, res.detail)
		switch res.verdict {
		case "MISSED":
			missed++
		case "STALE", "BROKEN":
			stale++
		}
	}
	fmt.Printf("%d mutations: %d caught, %d missed, %d stale or broken\n", len(ms), len(ms)-missed-stale, missed, stale)
	if missed+stale > 0 {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "mutate: %v\n", err)
	os.Exit(2)
}

type runner struct {
	root    string
	verbose bool
	run     string // overrides every mutation's Run
	python  string // runs pytest
}

type result struct {
	verdict string // caught, MISSED, STALE, BROKEN
	secs    float64
	detail  string
}

// needsBinary reports whether a package's tests run the zarrfs binary.
func needsBinary(pkgs []string) bool {
	return slices.ContainsFunc(pkgs, func(p string) bool { return strings.HasPrefix(p, "./integration") })
}

// baseline runs, unmutated, the tests the mutations will run: a failure
// there would make every mutation look caught. Each package runs once,
// with the union of the -run filters its mutations use (none if one uses
// none).
func (r *runner) baseline(ms []mutation) error {
	filters := map[string][]string{} // package: -run filters, nil for all
	var order []string
	for _, m := range ms {
		run := m.Run
		if r.run != "" {
			run = r.run
		}
		for _, p := range m.Pkgs {
			f, seen := filters[p]
			if !seen {
				order = append(order, p)
			}
			switch {
			case run == "" || (seen && f == nil):
				filters[p] = nil
			case !slices.Contains(f, run):
				filters[p] = append(f, run)
			}
		}
	}
	byRun := map[string][]string{} // -run filter: packages
	var runs []string
	for _, p := range order {
		run := strings.Join(filters[p], "|")
		if _, ok := byRun[run]; !ok {
			runs = append(runs, run)
		}
		byRun[run] = append(byRun[run], p)
	}
	for _, run := range runs {
		pkgs := byRun[run]
		fmt.Printf("baseline: go test -run '%s' %s\n", run, strings.Join(pkgs, " "))
		if out, err := r.goTest("", pkgs, run, ""); err != nil {
			return fmt.Errorf("the tests fail without any mutation:\n%s", out)
		}
	}
	var tests []string
	for _, m := range ms {
		for _, t := range m.Pytest {
			if !slices.Contains(tests, t) {
				tests = append(tests, t)
			}
		}
	}
	if len(tests) > 0 {
		fmt.Printf("baseline: %s -m pytest %s\n", r.python, strings.Join(tests, " "))
		if out, err := r.pytest(filepath.Join(r.root, "python", "src"), tests); err != nil {
			return fmt.Errorf("the Python tests fail without any mutation:\n%s", out)
		}
	}
	return nil
}

// apply returns src, the text of m.File, with m's mutation made. A From
// that does not occur exactly once means the code moved: the mutation is
// stale and would break nothing, or something else.
func (m mutation) apply(src []byte) ([]byte, error) {
	if n := bytes.Count(src, []byte(m.From)); n != 1 {
		return nil, fmt.Errorf("the original text occurs %d times in %s", n, m.File)
	}
	return bytes.Replace(src, []byte(m.From), []byte(m.To), 1), nil
}

func (r *runner) try(m mutation) result {
	t0 := time.Now()
	res := func(v, d string) result { return result{v, time.Since(t0).Seconds(), d} }
	path := filepath.Join(r.root, m.File)
	src, err := os.ReadFile(path)
	if err != nil {
		return res("STALE", err.Error())
	}
	mutated, err := m.apply(src)
	if err != nil {
		return res("STALE", err.Error())
	}
	tmp, err := os.MkdirTemp("", "zarrfs-mutant-")
	if err != nil {
		return res("STALE", err.Error())
	}
	defer os.RemoveAll(tmp)
	if strings.HasSuffix(m.File, ".py") {
		return r.tryPython(m, mutated, tmp, res)
	}
	mutant := filepath.Join(tmp, filepath.Base(m.File))
	overlay := filepath.Join(tmp, "overlay.json")
	js, _ := json.Marshal(map[string]map[string]string{"Replace": {path: mutant}})
	if err := errors.Join(
		os.WriteFile(mutant, mutated, 0o644),
		os.WriteFile(overlay, js, 0o644)); err != nil {
		return res("STALE", err.Error())
	}
	bin := ""
	if needsBinary(m.Pkgs) {
		bin = filepath.Join(tmp, "zarrfs")
		cmd := exec.Command("go", "build", "-overlay", overlay, "-o", bin, "./cmd/zarrfs")
		cmd.Dir = r.root
		if out, err := cmd.CombinedOutput(); err != nil {
			return res("BROKEN", "the mutant does not build: "+firstLine(string(out)))
		}
	}
	run := m.Run
	if r.run != "" {
		run = r.run
	}
	out, err := r.goTest(overlay, m.Pkgs, run, bin)
	if err == nil {
		return res("MISSED", "every test passed")
	}
	if strings.Contains(out, "[build failed]") || strings.Contains(out, "[setup failed]") || strings.Contains(out, "\nvet: ") {
		return res("BROKEN", "the mutant does not build: "+firstLine(out))
	}
	return res("caught", failures(out))
}

// goTest runs the packages' tests (with an overlay and a binary, when
// given) and returns their output.
func (r *runner) goTest(overlay string, pkgs []string, run, bin string) (string, error) {
	args := []string{"test", "-count=1", "-timeout", "10m"}
	if overlay != "" {
		args = append(args, "-overlay", overlay)
	}
	if run != "" {
		args = append(args, "-run", run)
	}
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = r.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if bin != "" {
		cmd.Env = append(cmd.Env, "ZARRFS_BIN="+bin)
	}
	out, err := cmd.CombinedOutput()
	if r.verbose {
		os.Stdout.Write(out)
	}
	return string(out), err
}

// tryPython runs m's pytest tests against a copy of python/src in tmp
// whose m.File is mutated.
func (r *runner) tryPython(m mutation, mutated []byte, tmp string, res func(v, d string) result) result {
	src := filepath.Join(r.root, "python", "src")
	rel, err := filepath.Rel(src, filepath.Join(r.root, m.File))
	if err != nil || strings.HasPrefix(rel, "..") {
		return res("STALE", m.File+" is not under python/src")
	}
	dst := filepath.Join(tmp, "src")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return res("STALE", err.Error())
	}
	if err := os.WriteFile(filepath.Join(dst, rel), mutated, 0o644); err != nil {
		return res("STALE", err.Error())
	}
	out, err := r.pytest(dst, m.Pytest)
	if err == nil {
		return res("MISSED", "every test passed")
	}
	if !strings.Contains(out, " failed") {
		return res("BROKEN", "pytest failed without a failed test: "+firstLine(out))
	}
	return res("caught", pytestFailures(out))
}

// pytest runs the tests (node ids, relative to the root) with the package
// at src first on the import path, and returns their output.
func (r *runner) pytest(src string, tests []string) (string, error) {
	cmd := exec.Command(r.python, append([]string{"-m", "pytest", "-p", "no:cacheprovider", "-q"}, tests...)...)
	cmd.Dir = r.root
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if r.verbose {
		os.Stdout.Write(out)
	}
	return string(out), err
}

// pytestFailures names the failed tests in pytest's -q output.
func pytestFailures(out string) string {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(l), "FAILED "); ok {
			name, _, _ = strings.Cut(name, " - ")
			names = append(names, name[strings.LastIndex(name, "::")+2:])
		}
	}
	if len(names) == 0 {
		return "tests failed: " + firstLine(out)
	}
	return strings.Join(names, ", ")
}

// failures names the failed tests in go test's output, the innermost
// subtests only.
func failures(out string) string {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if name, ok := strings.CutPrefix(l, "--- FAIL: "); ok {
			name, _, _ = strings.Cut(name, " ")
			if len(names) > 0 && strings.HasPrefix(name, names[len(names)-1]+"/") {
				names[len(names)-1] = name
			} else if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, name+"/") }) {
				names = append(names, name)
			}
		}
	}
	if len(names) == 0 {
		return "tests failed: " + firstLine(out)
	}
	if len(names) > 4 {
		names = append(names[:4], fmt.Sprintf("and %d more", len(names)-4))
	}
	return strings.Join(names, ", ")
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return ""
}
