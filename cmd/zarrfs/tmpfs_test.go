package main

import (
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/mountinfo"
)

func TestTmpfsHugeHint(t *testing.T) {
	mounts := []mountinfo.Entry{
		{Mountpoint: "/", FSType: "ext4", Options: []string{"rw"}},
		{Mountpoint: "/dev/shm", FSType: "tmpfs", Options: []string{"rw", "size=100g"}},
		{Mountpoint: "/mnt/ram", FSType: "tmpfs", Options: []string{"rw", "size=64g", "huge=within_size"}},
		{Mountpoint: "/mnt/never", FSType: "tmpfs", Options: []string{"rw", "huge=never"}},
		{Mountpoint: "/mnt/advise", FSType: "tmpfs", Options: []string{"rw", "huge=advise"}},
		{Mountpoint: "/mnt/always", FSType: "tmpfs", Options: []string{"rw", "huge=always"}},
	}
	const never = "always within_size advise [never] deny force"
	for _, tc := range []struct {
		dir, shmem string
		hint       bool
	}{
		{"/var/cache/zarrfs", never, false},
		{"/dev/shm/zarrfs", never, true},
		{"/mnt/ram/zarrfs", never, false},
		{"/mnt/never/c", never, true},
		{"/mnt/advise/c", never, true}, // blobs are written with write(2), never advised
		{"/mnt/always/c", never, false},
		{"/dev/shm/zarrfs", "always within_size advise never deny [force]", false},
	} {
		got := tmpfsHugeHint(mounts, tc.shmem, tc.dir)
		if (got != "") != tc.hint {
			t.Errorf("%s (shmem %q): hint %q, want one: %v", tc.dir, tc.shmem, got, tc.hint)
		}
		if got != "" && (!strings.Contains(got, "huge=within_size") || strings.Contains(got, "\n")) {
			t.Errorf("%s: hint %q does not say what to mount in one line", tc.dir, got)
		}
	}
}
