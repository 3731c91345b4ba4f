package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action      string
	Package     string
	ImportPath  string // build-output and build-fail events
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
}

// pkgState is what the report keeps of one package until it finishes.
type pkgState struct {
	output  []string            // lines not inside a test: panics, timeouts, the FAIL line
	tests   map[string][]string // each test's output so far
	passed  int
	failed  int
	skipped int
}

type skip struct{ pkg, test, reason string }

type report struct {
	w        io.Writer
	pkgs     map[string]*pkgState
	builds   map[string][]string // build output by import path, printed if the build fails
	skips    []skip
	passed   int
	failed   int
	skipped  int
	pkgFails int
	tests    int
}

func newReport(w io.Writer) *report {
	return &report{w: w, pkgs: map[string]*pkgState{}, builds: map[string][]string{}}
}

func (r *report) pkg(name string) *pkgState {
	p := r.pkgs[name]
	if p == nil {
		p = &pkgState{tests: map[string][]string{}}
		r.pkgs[name] = p
	}
	return p
}

// read consumes the whole stream.
func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20) // a test may log long lines
	for sc.Scan() {
		line := sc.Text()
		var e event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
			fmt.Fprintln(r.w, line) // the go command's own output
			continue
		}
		r.handle(e)
	}
	return sc.Err()
}

func (r *report) handle(e event) {
	switch e.Action {
	case "build-output":
		r.builds[e.ImportPath] = append(r.builds[e.ImportPath], e.Output)
		return
	case "build-fail":
		fmt.Fprint(r.w, strings.Join(r.builds[e.ImportPath], ""))
		return
	}
	p := r.pkg(e.Package)
	if e.Test == "" {
		switch e.Action {
		case "output":
			p.output = append(p.output, e.Output)
		case "pass", "fail", "skip":
			r.endPackage(e, p)
		}
		return
	}
	switch e.Action {
	case "output":
		p.tests[e.Test] = append(p.tests[e.Test], e.Output)
	case "pass":
		p.passed++
		delete(p.tests, e.Test)
	case "fail":
		p.failed++
		fmt.Fprintf(r.w, "--- FAIL: %s %s\n", short(e.Package), e.Test)
		for _, l := range p.tests[e.Test] {
			if !strings.HasPrefix(l, "=== ") {
				fmt.Fprint(r.w, l)
			}
		}
		delete(p.tests, e.Test)
	case "skip":
		p.skipped++
		r.skips = append(r.skips, skip{e.Package, e.Test, reason(p.tests[e.Test])})
		delete(p.tests, e.Test)
	}
}

// endPackage prints the package's line, and what it printed outside its
// tests when it failed (a panic, a timeout, a failed build).
func (r *report) endPackage(e event, p *pkgState) {
	r.passed += p.passed
	r.failed += p.failed
	r.skipped += p.skipped
	n := p.passed + p.failed + p.skipped
	r.tests += n
	counts := fmt.Sprintf("(%d passed", p.passed)
	if p.failed > 0 {
		counts += fmt.Sprintf(", %d failed", p.failed)
	}
	if p.skipped > 0 {
		counts += fmt.Sprintf(", %d skipped", p.skipped)
	}
	counts += ")"
	elapsed := (time.Duration(e.Elapsed * float64(time.Second))).Round(10 * time.Millisecond)
	switch {
	case e.Action == "skip" || (e.Action == "pass" && n == 0):
		fmt.Fprintf(r.w, "?   \t%s\t[no tests]\n", e.Package)
	case e.Action == "pass":
		when := elapsed.String()
		for _, l := range p.output {
			if strings.HasPrefix(l, "ok") && strings.Contains(l, "(cached)") {
				when = "(cached)" // the counts are the cached run's
			}
		}
		fmt.Fprintf(r.w, "ok  \t%s\t%s\t%s\n", e.Package, when, counts)
	default:
		r.pkgFails++
		for _, l := range p.output {
			if l != "FAIL\n" && !strings.HasPrefix(l, "FAIL\t") {
				fmt.Fprint(r.w, l)
			}
		}
		// Tests that never finished (the package panicked or timed out):
		// their output is where the cause is.
		for t, out := range p.tests {
			fmt.Fprintf(r.w, "--- unfinished: %s %s\n", short(e.Package), t)
			fmt.Fprint(r.w, strings.Join(out, ""))
		}
		what := ""
		if e.FailedBuild != "" {
			what = " [build failed]"
		}
		fmt.Fprintf(r.w, "FAIL\t%s\t%v\t%s%s\n", e.Package, elapsed, counts, what)
	}
	delete(r.pkgs, e.Package)
}

// finish prints the skips and the totals, and returns the totals line.
func (r *report) finish() string {
	// Packages without a final event: the stream was cut short.
	for name, p := range r.pkgs {
		if len(p.output)+len(p.tests)+p.passed+p.failed+p.skipped > 0 {
			r.endPackage(event{Action: "fail", Package: name}, p)
		}
	}
	if len(r.skips) > 0 {
		fmt.Fprintf(r.w, "\nskipped tests (%d):\n", len(r.skips))
		for _, s := range r.skips {
			fmt.Fprintf(r.w, "  %s %s: %s\n", short(s.pkg), s.test, s.reason)
		}
	}
	line := fmt.Sprintf("go: %d passed, %d failed, %d skipped", r.passed, r.failed, r.skipped)
	if r.pkgFails > 0 {
		line += fmt.Sprintf(" (%d packages failed)", r.pkgFails)
	}
	fmt.Fprintln(r.w, line)
	return line
}

func (r *report) ok() bool { return r.failed == 0 && r.pkgFails == 0 && r.tests > 0 }

// short drops the module path, which every package shares.
func short(pkg string) string {
	return strings.TrimPrefix(strings.TrimPrefix(pkg, "github.com/zarrfs/zarrfs"), "/")
}

// logLine is the start of a t.Log/t.Skip line: "    file_test.go:12: ".
var logLine = regexp.MustCompile(`^\s+([\w.-]+\.go:\d+): (.*)$`)

// reason is the skip message: the last log entry of the skipped test (the
// one t.Skip wrote) and its continuation lines, on one line, followed by
// where it was written.
func reason(out []string) string {
	var where string
	var msg []string
	for _, l := range out {
		l = strings.TrimRight(l, "\n")
		if strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		if m := logLine.FindStringSubmatch(l); m != nil {
			where, msg = m[1], []string{m[2]}
		} else if where != "" && strings.TrimSpace(l) != "" {
			msg = append(msg, strings.TrimSpace(l))
		}
	}
	if where == "" {
		return "(no reason given)"
	}
	s := strings.Join(msg, " / ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s + " (" + where + ")"
}
