package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// mount and warm refuse a bad split with the same message, naming the
// flags the user gave (not "invalid layout option"), as usage errors.
func TestCheckShard(t *testing.T) {
	for _, tt := range []struct {
		rank, world int
		mode, want  string
	}{
		{3, 2, "contiguous", "--rank 3 --world 2: want 0 <= rank < world"},
		{-1, 2, "contiguous", "--rank -1 --world 2: want 0 <= rank < world"},
		{0, 0, "contiguous", "--world 0: want 1 or more"},
		{0, 2, "foo", `--shard "foo": want contiguous or interleaved`},
	} {
		_, err := checkShard(tt.rank, tt.world, tt.mode)
		var ue usageError
		if err == nil || err.Error() != tt.want || !errors.As(err, &ue) {
			t.Errorf("checkShard(%d, %d, %q) = %v, want usage error %q", tt.rank, tt.world, tt.mode, err, tt.want)
		}
	}
	for _, mode := range []string{"contiguous", "interleaved"} {
		s, err := checkShard(1, 3, mode)
		if err != nil || s.Mode() != mode || s.Rank != 1 || s.World != 3 {
			t.Errorf("checkShard(1, 3, %s) = %+v, %v", mode, s, err)
		}
	}
}

func TestCheckMetricsAddr(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:9464", ":9464", "[::1]:0", "localhost:80"} {
		if err := checkMetricsAddr(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"bogus", "127.0.0.1", "host:99999", "host:http", "a b:80", "1.2.3.4:-1"} {
		err := checkMetricsAddr(bad)
		var ue usageError
		if err == nil || !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), "--metrics ") {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

func TestCount(t *testing.T) {
	for n, want := range map[int64]string{0: "0 files", 1: "1 file", 2: "2 files", 87612: "87,612 files"} {
		if got := count(n, "file"); got != want {
			t.Errorf("count(%d) = %q, want %q", n, got, want)
		}
	}
}

// A command that only groups others refuses an unknown subcommand (exit
// status 2) and prints its help without one.
func TestSubcommandsOnly(t *testing.T) {
	root := &cobra.Command{Use: "zarrfs"}
	group := &cobra.Command{Use: "cache"}
	group.AddCommand(&cobra.Command{Use: "gc", RunE: func(*cobra.Command, []string) error { return nil }})
	subcommandsOnly(group)
	root.AddCommand(group)
	var out strings.Builder
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"cache", "bogus"})
	err := root.Execute()
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), `unknown command "bogus" for "zarrfs cache"`) {
		t.Errorf("cache bogus: %v", err)
	}
	out.Reset()
	root.SetArgs([]string{"cache"})
	if err := root.Execute(); err != nil || !strings.Contains(out.String(), "gc") {
		t.Errorf("cache: %v, help %q", err, out.String())
	}
}
