package mountinfo

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	e, ok := Parse(`44 27 0:41 / /mnt/my\040data ro,relatime shared:5 - fuse.zarrfs s3://b/p\040q ro,user_id=0,allow_other`)
	want := Entry{Mountpoint: "/mnt/my data", FSType: "fuse.zarrfs", Source: "s3://b/p q", Options: []string{"ro", "user_id=0", "allow_other"}}
	if !ok || !reflect.DeepEqual(e, want) {
		t.Errorf("Parse = %+v, %v; want %+v", e, ok, want)
	}
	if v, ok := e.Option("user_id"); !ok || v != "0" {
		t.Errorf("Option(user_id) = %q, %v", v, ok)
	}
	if _, ok := e.Option("group_id"); ok {
		t.Error("Option(group_id) found in options without it")
	}
	for _, bad := range []string{"", "22 1 8:1 / / rw", "1 2 3 - ext4"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if mounts, err := Read(); err != nil || len(mounts) == 0 {
		t.Errorf("Read: %d mounts, %v", len(mounts), err)
	}
}

func TestContaining(t *testing.T) {
	mounts := []Entry{
		{Mountpoint: "/", FSType: "ext4"},
		{Mountpoint: "/dev/shm", FSType: "tmpfs"},
		{Mountpoint: "/mnt/cache", FSType: "ext4"},
		{Mountpoint: "/mnt/cache", FSType: "tmpfs"}, // stacked on top
		{Mountpoint: "/mnt/cache2", FSType: "xfs"},
	}
	for _, tc := range []struct{ path, want string }{
		{"/", "ext4"},
		{"/var/tmp", "ext4"},
		{"/dev/shm", "tmpfs"},
		{"/dev/shm/zarrfs", "tmpfs"},
		{"/dev/shmx", "ext4"},
		{"/mnt/cache/blobs", "tmpfs"},
		{"/mnt/cache2/blobs", "xfs"},
	} {
		e, ok := Containing(mounts, tc.path)
		if !ok || e.FSType != tc.want {
			t.Errorf("Containing(%q) = %+v, %v; want %s", tc.path, e, ok, tc.want)
		}
	}
	if _, ok := Containing(nil, "/x"); ok {
		t.Error("Containing found a mount in an empty table")
	}
}
