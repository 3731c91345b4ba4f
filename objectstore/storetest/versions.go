package storetest

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
)

// runVersions checks a store that tells object versions: reads report the
// version its listing reports, for whole objects and ranges; listings go
// to any depth below a prefix and list nothing below an unknown one.
func runVersions(t *testing.T, s objectstore.Store, files map[string][]byte, o Options) {
	v, ok := objectstore.AsVersioned(s)
	if !ok {
		t.Skip("store does not tell versions")
	}
	ctx := context.Background()
	if o.NoListing {
		runReadVersions(t, s, v, files)
		return
	}
	listed := map[string]string{}
	if err := v.ListVersions(ctx, "", func(k, ver string) { listed[k] = ver }); err != nil {
		t.Fatal(err)
	}
	if len(listed) != len(files) {
		t.Errorf("listed %d objects, want %d: %v", len(listed), len(files), listed)
	}
	for _, k := range sortedKeys(files) {
		b, ver, err := v.GetVersion(ctx, k, nil, 0)
		if err != nil || !bytes.Equal(b, files[k]) {
			t.Errorf("GetVersion(%q): %v, content equal %v", k, err, bytes.Equal(b, files[k]))
			continue
		}
		if ver == "" || ver != listed[k] {
			t.Errorf("GetVersion(%q) version %q, listed %q", k, ver, listed[k])
		}
		if st, ok := objectstore.AsVersionStater(s); ok {
			if sv, err := st.StatVersion(ctx, k); err != nil || sv != ver {
				t.Errorf("StatVersion(%q) = %q, %v; read version %q", k, sv, err, ver)
			}
		}
		if len(files[k]) > 0 {
			_, rver, err := v.GetRangeVersion(ctx, k, 0, 1)
			if err != nil || rver != ver {
				t.Errorf("GetRangeVersion(%q): %v, version %q, want %q", k, err, rver, ver)
			}
		}
	}
	if _, _, err := v.GetVersion(ctx, "missing", nil, 0); !objectstore.IsNotFound(err) {
		t.Errorf("GetVersion(missing): %v, want ErrNotFound", err)
	}
	if st, ok := objectstore.AsVersionStater(s); ok {
		for _, k := range []string{"missing", "a", "a/c"} {
			if _, err := st.StatVersion(ctx, k); !objectstore.IsNotFound(err) {
				t.Errorf("StatVersion(%q): %v, want ErrNotFound", k, err)
			}
		}
	}
	under := map[string]string{}
	if err := v.ListVersions(ctx, "a", func(k, ver string) { under[k] = ver }); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"a/zarr.json": true, "a/c/0/0": true, "a/c/0/1": true, "a/c/1/0": true}
	if len(under) != len(want) {
		t.Errorf("ListVersions(a) = %v, want %v", under, want)
	}
	for k := range under {
		if !want[k] {
			t.Errorf("ListVersions(a) lists %q", k)
		}
	}
	n := 0
	if err := v.ListVersions(ctx, "nothing/here", func(string, string) { n++ }); err != nil || n != 0 {
		t.Errorf("ListVersions(nothing/here): %v, %d objects", err, n)
	}
}

// runReadVersions checks a store that tells versions but cannot list: the
// version one object's read reports is the one StatVersion asks and a
// range reports, and listings fail as they should.
func runReadVersions(t *testing.T, s objectstore.Store, v objectstore.Versioned, files map[string][]byte) {
	ctx := context.Background()
	st, ok := objectstore.AsVersionStater(s)
	if !ok {
		t.Fatal("a store without listings must ask versions one by one (VersionStater)")
	}
	for _, k := range sortedKeys(files) {
		b, ver, err := v.GetVersion(ctx, k, nil, 0)
		if err != nil || !bytes.Equal(b, files[k]) || ver == "" {
			t.Errorf("GetVersion(%q): %v, version %q, content equal %v", k, err, ver, bytes.Equal(b, files[k]))
			continue
		}
		if sv, err := st.StatVersion(ctx, k); err != nil || sv != ver {
			t.Errorf("StatVersion(%q) = %q, %v; read version %q", k, sv, err, ver)
		}
		if len(files[k]) > 0 {
			if _, rver, err := v.GetRangeVersion(ctx, k, 0, 1); err != nil || rver != ver {
				t.Errorf("GetRangeVersion(%q): %v, version %q, want %q", k, err, rver, ver)
			}
			if _, rver, err := v.GetRangeVersion(ctx, k, -1, 1); err != nil || rver != ver {
				t.Errorf("GetRangeVersion(%q, suffix): %v, version %q, want %q", k, err, rver, ver)
			}
		}
	}
	for _, k := range []string{"missing", "a", "a/c"} {
		if _, err := st.StatVersion(ctx, k); !objectstore.IsNotFound(err) {
			t.Errorf("StatVersion(%q): %v, want ErrNotFound", k, err)
		}
	}
	if err := v.ListVersions(ctx, "a", func(string, string) {}); !errors.Is(err, objectstore.ErrNoListing) {
		t.Errorf("ListVersions(a): %v, want ErrNoListing", err)
	}
}
