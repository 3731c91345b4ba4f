package icechunk_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/icechunk"
	"github.com/zarrfs/zarrfs/objectstore/targets"
	"github.com/zarrfs/zarrfs/zarr"
)

// openV2 opens testdata/v2, a spec version 2 repository written by
// icechunk 2.3 (testdata/make_v2.py).
func openV2(t *testing.T, ref string) (*icechunk.Store, error) {
	t.Helper()
	repo, err := objectstore.OpenPosix("testdata/v2")
	if err != nil {
		t.Fatal(err)
	}
	tg, _ := targets.New(targets.Options{})
	s, err := icechunk.Open(context.Background(), repo, icechunk.Options{Ref: ref, Targets: tg})
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

func TestSpecV2(t *testing.T) {
	for _, c := range []struct {
		ref   string
		steps int64
	}{{"main", 5}, {"", 5}, {"v1", 4}} {
		s, err := openV2(t, c.ref)
		if err != nil {
			t.Fatalf("ref %q: %v", c.ref, err)
		}
		h, err := zarr.Open(context.Background(), s, zarr.Options{})
		if err != nil {
			t.Fatal(err)
		}
		a := h.Array("t")
		if a == nil || a.Unsupported != "" || a.Shape[0] != c.steps {
			t.Fatalf("ref %q: t = %+v", c.ref, a)
		}
		dst := make([]byte, c.steps*20*10*4)
		if err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: []int64{0, 0, 0}, Count: []int64{c.steps, 20, 10}, Dst: dst}}); err != nil {
			t.Fatal(err)
		}
		for i := range c.steps * 200 {
			want := float32(i)
			if i >= 800 {
				want = -1
			}
			if got := math.Float32frombits(binary.LittleEndian.Uint32(dst[4*i:])); got != want {
				t.Fatalf("ref %q: t element %d = %v, want %v", c.ref, i, got, want)
			}
		}
		sm := h.Array("small")
		b := make([]byte, 6)
		if err := h.Read(context.Background(), nil, []zarr.Request{{Array: sm, Start: []int64{0}, Count: []int64{3}, Dst: b}}); err != nil || b[0] != 1 || b[2] != 2 || b[4] != 3 {
			t.Fatalf("small = %v, %v", b, err)
		}
		h.Close()
	}
	if _, err := openV2(t, "nope"); !errors.Is(err, icechunk.ErrNoRef) {
		t.Errorf("ref nope: %v", err)
	}
}

// The versioned-store part of the conformance suite holds for a
// repository: reads report the versions listings give.
func TestVersionsV2(t *testing.T) {
	s, err := openV2(t, "main")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	ctx := context.Background()
	if err := s.ListVersions(ctx, "", func(k, v string) {
		b, ver, err := s.GetVersion(ctx, k, nil, 0)
		if err != nil || ver != v {
			t.Errorf("%s: version %q, listed %q, %v", k, ver, v, err)
		}
		files[k] = b
	}); err != nil {
		t.Fatal(err)
	}
	if len(files) < 8 { // two arrays' zarr.json, the root's, 5 + 1 chunks
		t.Fatalf("listed %d keys: %v", len(files), files)
	}
	if _, err := s.Get(ctx, "t/c/9/0/0"); !objectstore.IsNotFound(err) {
		t.Errorf("a chunk outside the grid: %v", err)
	}
	names, err := s.List(ctx, "")
	if err != nil || len(names) != 3 {
		t.Errorf("List() = %v, %v", names, err)
	}
}
