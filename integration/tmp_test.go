package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// runTests runs the package's tests with TMPDIR a folder of their own,
// so that what they and the programs they start make in the temporary
// folder lands there. At the end the fixtures made once per run (the
// built binary, the replicas, the kerchunk files) go, and anything else
// left there fails the run, named: a test that leaves files behind is a
// bug (t.TempDir removes its own).
func runTests(m *testing.M) int {
	root, err := os.MkdirTemp("", "zarrfs-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(root)
	// As /tmp: tests run programs as other users, who must reach their
	// folders (and may make their own).
	if err := os.Chmod(root, 0o1777); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	old, had := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", root)
	code := m.Run()
	if had {
		os.Setenv("TMPDIR", old)
	} else {
		os.Unsetenv("TMPDIR")
	}
	for _, d := range []string{binPath, replicaDir, kerchunkDir} {
		if d == "" {
			continue
		}
		if d == binPath {
			d = filepath.Dir(d)
		}
		if strings.HasPrefix(d, root+string(filepath.Separator)) {
			os.RemoveAll(d)
		}
	}
	if left := leftIn(root); len(left) > 0 && !testing.Short() {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left %s in the temporary folder (%s)\n", strings.Join(left, ", "), root)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// leftIn lists what dir holds, by name.
func leftIn(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}
