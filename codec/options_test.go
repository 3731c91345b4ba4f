package codec

import (
	"strings"
	"testing"
)

// A negative worker count is refused with an error naming it, not turned
// into one worker per CPU.
func TestNegativeWorkersRefused(t *testing.T) {
	if c, err := NewCPU(Options{Workers: -2}); err == nil || !strings.Contains(err.Error(), "Workers -2") {
		if c != nil {
			c.Close()
		}
		t.Errorf("NewCPU(Workers: -2): %v, want an error naming it", err)
	}
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
