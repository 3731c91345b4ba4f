package fs

import (
	"context"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// Negative counts are refused before anything is mounted, not read as
// "none" (readahead) or the default (inodes).
func TestNegativeOptionsRefused(t *testing.T) {
	l, err := layout.Build(&zarr.Hierarchy{Groups: map[string]map[string]any{"": {}}}, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.Open(cache.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, o := range []Options{{Readahead: -1}, {MaxInodes: -5}} {
		o.Mountpoint, o.Layout, o.Blobs = t.TempDir(), l, testBlobs(t, c, nil)
		if m, err := Mount(context.Background(), o); err == nil || !strings.Contains(err.Error(), "want 0 (the default) or more") {
			if m != nil {
				m.Unmount(0)
			}
			t.Errorf("Mount(readahead %d, max inodes %d): %v", o.Readahead, o.MaxInodes, err)
		}
	}
}
