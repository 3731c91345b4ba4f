package main

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"testing"
)

func TestBlobAccessFlags(t *testing.T) {
	own := strconv.Itoa(os.Getegid()) // a group anyone may give their files
	for _, tc := range []struct {
		mode, group string
		want        fs.FileMode
		gid         int // -1: none
		usage       bool
	}{
		{"", "", 0, -1, false},
		{"owner", "", 0o400, -1, false},
		{"all", "", 0o444, -1, false},
		{"0640", "", 0o440, -1, false},
		{"", own, 0o440, os.Getegid(), false}, // a gid; implies group
		{"all", own, 0o444, os.Getegid(), false},
		{"0604", own, 0, -1, true}, // the mode gives the group nothing
		{"0660", "", 0, -1, true},
		{"", "no-such-group-zarrfs", 0, -1, true},
	} {
		f := layoutFlags{cacheMode: tc.mode, cacheGroup: tc.group}
		mode, gid, err := f.blobAccess()
		var ue usageError
		if tc.usage {
			if !errors.As(err, &ue) {
				t.Errorf("--cache-mode %q --cache-group %q: %v, want a usage error", tc.mode, tc.group, err)
			}
			continue
		}
		if err != nil || mode != tc.want || (gid == nil) != (tc.gid < 0) || (gid != nil && int(*gid) != tc.gid) {
			t.Errorf("--cache-mode %q --cache-group %q = %04o, %v, %v", tc.mode, tc.group, mode, gid, err)
		}
	}
	if os.Geteuid() != 0 {
		// Not a member of root's group: refused.
		f := layoutFlags{cacheGroup: "0"}
		if _, _, err := f.blobAccess(); err == nil && os.Getegid() != 0 {
			t.Error("--cache-group of a group the user is not in accepted")
		}
	}
}
