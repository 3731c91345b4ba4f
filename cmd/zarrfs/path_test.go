package main

import "testing"

func TestParseMountinfo(t *testing.T) {
	for _, tc := range []struct {
		line string
		mnt  string
		uid  int
		ok   bool
	}{
		{`43 27 0:40 / /tmp/q/mnt ro,nosuid,nodev,relatime - fuse.zarrfs file:///s.zarr ro,user_id=1001,group_id=1001,default_permissions,max_read=1048576`,
			"/tmp/q/mnt", 1001, true},
		{`44 27 0:41 / /mnt/my\040data ro,relatime shared:5 - fuse.zarrfs s3://b/p ro,user_id=0,group_id=0,allow_other`,
			"/mnt/my data", 0, true},
		{`45 27 0:42 / /mnt/other ro,relatime - fuse.sshfs host:/ rw,user_id=0,group_id=0`, "", 0, false},
		{`46 27 0:43 / /mnt/bad ro - fuse.zarrfs x ro,group_id=0`, "", 0, false},
		{`22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw`, "", 0, false},
		{``, "", 0, false},
	} {
		mnt, uid, ok := parseMountinfo(tc.line)
		if mnt != tc.mnt || uid != tc.uid || ok != tc.ok {
			t.Errorf("parseMountinfo(%q) = %q, %d, %v", tc.line, mnt, uid, ok)
		}
	}
}
