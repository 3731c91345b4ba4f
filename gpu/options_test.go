package gpu

import (
	"strings"
	"testing"
	"time"
)

// Options are checked before any library loads, so this runs without a GPU.
func TestNegativeOptionsRefused(t *testing.T) {
	for _, o := range []Options{{HostIdle: -time.Second}, {Streams: -1}, {MaxBatchBytes: -1}} {
		if _, err := New(o); err == nil || !strings.Contains(err.Error(), "want 0 (the default) or more") {
			t.Errorf("New(%+v): %v", o, err)
		}
	}
}
