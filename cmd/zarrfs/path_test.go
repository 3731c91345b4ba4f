package main

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/internal/mountinfo"
)

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
		e, _ := mountinfo.Parse(tc.line)
		mnt, uid, ok := zarrfsMount(e)
		if mnt != tc.mnt || uid != tc.uid || ok != tc.ok {
			t.Errorf("zarrfsMount(%q) = %q, %d, %v", tc.line, mnt, uid, ok)
		}
	}
}

// A record names its daemon by PID and start time: a PID taken since by
// another process, or a daemon that exited and waits for its parent, is
// not a live mount.
func TestRecordAlive(t *testing.T) {
	started, ok := procStarted(os.Getpid())
	if !ok || started == 0 {
		t.Fatalf("procStarted(self) = %d, %v", started, ok)
	}
	for _, c := range []struct {
		r    mountRecord
		want bool
	}{
		{mountRecord{PID: os.Getpid(), Started: started}, true},
		{mountRecord{PID: os.Getpid()}, true}, // an older daemon's record
		{mountRecord{PID: os.Getpid(), Started: started + 1}, false},
		{mountRecord{PID: 0}, false},
		{mountRecord{PID: 1 << 30}, false},
	} {
		if got := c.r.alive(); got != c.want {
			t.Errorf("alive(%+v) = %v, want %v", c.r, got, c.want)
		}
	}

	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for running(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("an exited child (a zombie) counts as running")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if state, _, ok := procStat(cmd.Process.Pid); !ok || state != 'Z' {
		t.Errorf("the exited child's state: %q, %v; want a zombie", state, ok)
	}
	cmd.Wait()
}
