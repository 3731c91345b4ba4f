package cache

import (
	"strings"
	"testing"
)

// A refused mode is named as the user typed it: 0777 is refused as 0777,
// not as the 0577 left once the owner's write bit is dropped.
func TestParseModeNamesTheModeTyped(t *testing.T) {
	for _, in := range []string{"0777", "0755", "0200"} {
		_, err := ParseMode(in)
		if err == nil || !strings.HasPrefix(err.Error(), in+" ") && !strings.HasPrefix(err.Error(), in+":") {
			t.Errorf("ParseMode(%q): %v, want an error naming %s", in, err, in)
		}
	}
	if m, err := ParseMode("0644"); err != nil || m != 0o444 {
		t.Errorf("ParseMode(0644) = %04o, %v; want 0444 (owner write dropped)", m, err)
	}
}
