package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/fixtures"
)

// Every mutation still applies to the source as it is now: its original
// text occurs exactly once in its file. A mutation gone stale breaks
// nothing, and only a run of `make mutate` (not part of make test) would
// say so; here go test does.
func TestMutationsApply(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range mutations {
		if names[m.Name] {
			t.Errorf("%s: two mutations of this name", m.Name)
		}
		names[m.Name] = true
		if m.From == m.To || len(m.Pkgs)+len(m.Pytest) == 0 {
			t.Errorf("%s: From equals To, or no package to test", m.Name)
		}
		if strings.HasSuffix(m.File, ".py") != (len(m.Pytest) > 0) || (len(m.Pytest) > 0 && len(m.Pkgs) > 0) {
			t.Errorf("%s: a mutation of %s names its tests in Pytest (Python) or Pkgs (Go), not both", m.Name, m.File)
		}
		src, err := os.ReadFile(filepath.Join(root, m.File))
		if err != nil {
			t.Errorf("%s: %v", m.Name, err)
			continue
		}
		if _, err := m.apply(src); err != nil {
			t.Errorf("%s: %v (the code moved: update From and To in mutations.go so it breaks the same behaviour)", m.Name, err)
		}
	}
}
