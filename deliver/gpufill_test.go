package deliver

import (
	"fmt"
	"testing"
)

// The host copies into the slot exactly what the device did not write.
func TestGaps(t *testing.T) {
	for _, tc := range []struct {
		covered [][2]int64
		n       int64
		want    string
	}{
		{nil, 10, "[[0 10]]"},
		{[][2]int64{{0, 10}}, 10, "[]"},
		{[][2]int64{{2, 4}, {4, 6}, {8, 9}}, 10, "[[0 2] [6 8] [9 10]]"},
		{[][2]int64{{0, 3}, {5, 10}}, 12, "[[3 5] [10 12]]"},
	} {
		if got := fmt.Sprint(gaps(tc.covered, tc.n)); got != tc.want && !(tc.want == "[]" && got == "[]") {
			t.Errorf("gaps(%v, %d) = %s, want %s", tc.covered, tc.n, got, tc.want)
		}
	}
}
