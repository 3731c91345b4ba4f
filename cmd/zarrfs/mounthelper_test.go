package main

import (
	"slices"
	"strings"
	"testing"
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

// The options fstab users write (docs/operations.md, contrib/fstab.example)
// reach the mount as its flags.
func TestHelperOptionsOfFstab(t *testing.T) {
	for opt, want := range map[string][]string{
		"allow_other":         {"--allow-other"},
		"direct":              {"--direct"},
		"follow_symlinks":     {"--follow-symlinks"},
		"cache=/nvme/z":       {"--cache", "/nvme/z"},
		"cache_size=500GiB":   {"--cache-size", "500GiB"},
		"cache_mode=all":      {"--cache-mode", "all"},
		"cache_group=ml":      {"--cache-group", "ml"},
		"decode=auto":         {"--decode", "auto"},
		`gpus="0,1"`:          {"--gpus", "0,1"},
		"gpu_memory=2GiB":     {"--gpu-memory", "2GiB"},
		"pinned_memory=1GiB":  {"--pinned-memory", "1GiB"},
		"gpu_idle=5m":         {"--gpu-idle", "5m"},
		"gpu_trust_unchecked": {"--gpu-trust-unchecked"},
		"lease=10m":           {"--lease", "10m"},
		"memory=8GiB":         {"--memory", "8GiB"},
		"metadata_ttl=1m":     {"--metadata-ttl", "1m"},
		"metrics=:9464":       {"--metrics", ":9464"},
		"readahead=16":        {"--readahead", "16"},
		"rank=1":              {"--rank", "1"},
		"world=4":             {"--world", "4"},
		"shard=train":         {"--shard", "train"},
		"view=/etc/v.yaml":    {"--view", "/etc/v.yaml"},
		"align=4096":          {"--align", "4096"},
		"sample_dim=time":     {"--sample-dim", "time"},
		"source_stall=10s":    {"--source-stall", "10s"},
		"source_timeout=1m":   {"--source-timeout", "1m"},
		"log_level=debug":     {"--log-level", "debug"},
		"log_format=json":     {"--log-format", "json"},
	} {
		got, _, _, err := helperArgs([]string{"a", "b", "-o", opt})
		if err != nil || !slices.Equal(got[3:], want) {
			t.Errorf("-o %s: %q, %v; want %q", opt, got, err, want)
		}
	}
}
