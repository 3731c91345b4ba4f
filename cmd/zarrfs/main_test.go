package main

import "testing"

// zarrfs runs twice the runtime's default processors, unless GOMAXPROCS
// says otherwise; a user's GOMAXPROCS stands whatever it is.
func TestMaxProcs(t *testing.T) {
	for _, c := range []struct {
		env       string
		cur, want int
	}{
		{"", 16, 32},
		{"", 1, 2},
		{"4", 4, 4},
		{"16", 16, 16},
	} {
		if got := maxProcs(c.env, c.cur); got != c.want {
			t.Errorf("maxProcs(%q, %d) = %d, want %d", c.env, c.cur, got, c.want)
		}
	}
}
