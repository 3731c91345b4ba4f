package testenv

import "testing"

func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		ci, want string
	}{
		{"", "skip: no tool"}, {"false", "skip: no tool"}, {"0", "skip: no tool"},
		{"true", "fail: missing under CI: no tool"}, {"1", "fail: missing under CI: no tool"},
	} {
		t.Setenv("CI", tc.ci)
		if got := Outcome(func(t testing.TB) { Missing(t, "no %s", "tool") }); got != tc.want {
			t.Errorf("CI=%q: %s, want %s", tc.ci, got, tc.want)
		}
	}
}
