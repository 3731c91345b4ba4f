package codec

import (
	"strings"
	"testing"
)

// A negative worker count is refused (it panics, as make does with a
// negative size), not turned into one worker per CPU.
func TestNegativeWorkersRefused(t *testing.T) {
	defer func() {
		if r, _ := recover().(string); !strings.Contains(r, "Workers -2") {
			t.Errorf("NewCPU(Workers: -2): panic %q", r)
		}
	}()
	NewCPU(Options{Workers: -2}).Close()
}
