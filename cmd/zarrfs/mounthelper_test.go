package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestHelperArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // the mount flags after SOURCE MOUNTPOINT
		log  string
		err  string
	}{
		{[]string{"s3://b/era5.zarr", "/mnt/e", "-o", `ro,direct,gpus="0,1",source_timeout=5s,log=/tmp/l`},
			[]string{"--direct", "--gpus", "0,1", "--source-timeout", "5s"}, "/tmp/l", ""},
		{[]string{"/d/e.zarr", "/mnt/e", "-ocache=/nvme/z,cache_size=500GiB", "-o", "x-systemd.automount,_netdev,log_level=debug"},
			[]string{"--cache", "/nvme/z", "--cache-size", "500GiB", "--log-level", "debug"}, "", ""},
		{[]string{"/d/e.zarr", "/mnt/e", "-o", "gpus=0,1"}, nil, "", `unknown option "1"`},
		{[]string{"/d/e.zarr", "/mnt/e", "-o", "direct=yes"}, nil, "", "wrong form"},
		{[]string{"/d/e.zarr", "/mnt/e", "-o", "cache"}, nil, "", "wrong form"},
		{[]string{"/d/e.zarr", "/mnt/e", "-s", "-o", "nosuchoption,direct"}, []string{"--direct"}, "", ""},
		{[]string{"/d/e.zarr"}, nil, "", "want SOURCE MOUNTPOINT"},
	} {
		got, log, _, err := helperArgs(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error with %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got[3:], tc.want) || log != tc.log || got[1] != tc.args[0] || got[2] != tc.args[1] {
			t.Errorf("%q: %q, log %q, %v; want %q, log %q", tc.args, got, log, err, tc.want, tc.log)
		}
	}
}

// Every flag of `zarrfs mount` is an option of the helper.
func TestHelperOptionsCoverMountFlags(t *testing.T) {
	opts := helperOptions()
	newMountCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		o := strings.ReplaceAll(f.Name, "-", "_")
		form := o + "=1"
		if f.Value.Type() == "bool" {
			form = o
		}
		if _, ok := opts[o]; !ok {
			t.Errorf("--%s has no -o %s", f.Name, o)
		} else if _, _, _, err := helperArgs([]string{"a", "b", "-o", form}); err != nil {
			t.Errorf("-o %s: %v", form, err)
		}
	})
}
