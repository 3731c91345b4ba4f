package cache

import (
	"os"
	"path/filepath"
	"testing"
)

// RemoveEmpty removes a cache directory that holds nothing and that no
// instance has open, and nothing else.
func TestRemoveEmpty(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c")
	c := mustOpen(t, Options{Dir: dir})
	if RemoveEmpty(dir) {
		t.Fatal("removed a cache an instance has open")
	}
	c.Close()
	if !RemoveEmpty(dir) {
		t.Fatal("an empty cache, closed, was kept")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", dir, err)
	}

	c = mustOpen(t, Options{Dir: dir})
	getBlob(t, c, "t/0.npy")
	c.Close()
	if RemoveEmpty(dir) {
		t.Fatal("removed a cache holding a blob")
	}
	if RemoveEmpty(t.TempDir()) {
		t.Fatal("removed a directory that is not a cache")
	}
}
