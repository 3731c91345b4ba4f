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
