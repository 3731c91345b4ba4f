package zarr_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/gcstest"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
	"github.com/zarrfs/zarrfs/zarr"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// consolidateV3 writes every node's zarr.json below dir into the root
// zarr.json's consolidated_metadata, as zarr.consolidate_metadata does.
func consolidateV3(t testing.TB, dir string) {
	t.Helper()
	md := map[string]json.RawMessage{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.Name() != "zarr.json" || filepath.Dir(p) == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, filepath.Dir(p))
		b, err := os.ReadFile(p)
		md[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	b, _ := os.ReadFile(filepath.Join(dir, "zarr.json"))
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	root["consolidated_metadata"] = map[string]any{"kind": "inline", "must_understand": false, "metadata": md}
	b, _ = json.Marshal(root)
	os.WriteFile(filepath.Join(dir, "zarr.json"), b, 0o644)
}

// writeV2 writes a v2 group with one uint16 array t of shape (6, 4) in
// chunks of (2, 4), uncompressed, with or without .zmetadata.
func writeV2(t testing.TB, dir string, consolidated bool) {
	t.Helper()
	zarray := `{"zarr_format":2,"shape":[6,4],"chunks":[2,4],"dtype":"<u2","compressor":null,"filters":null,"fill_value":0,"order":"C"}`
	zattrs := `{"_ARRAY_DIMENSIONS":["time","x"],"units":"K"}`
	files := map[string][]byte{".zgroup": []byte(`{"zarr_format":2}`), "t/.zarray": []byte(zarray), "t/.zattrs": []byte(zattrs)}
	for c := range 3 {
		b := make([]byte, 16)
		for i := range 8 {
			b[2*i] = byte(c*8 + i)
		}
		files["t/"+itoa(c)+".0"] = b
	}
	if consolidated {
		files[".zmetadata"] = []byte(`{"zarr_consolidated_format":1,"metadata":{".zgroup":{"zarr_format":2},"t/.zarray":` + zarray + `,"t/.zattrs":` + zattrs + `}}`)
	}
	webtest.WriteFiles(t, dir, files)
}

// A store that cannot be listed opens from its consolidated metadata and
// reads as the same store does from disk; without consolidated metadata it
// fails with one line that says what is missing.
func TestOpenWithoutListing(t *testing.T) {
	ctx := context.Background()
	v3 := filepath.Join(t.TempDir(), "v3.zarr")
	if err := (zarrtest.Example{Times: 4, Levels: 2, Lat: 9, Lon: 16, TimeChunk: 1}).Write(v3); err != nil {
		t.Fatal(err)
	}
	v2, v2c := t.TempDir(), t.TempDir()
	writeV2(t, v2, false)
	writeV2(t, v2c, true)
	cases := []struct {
		name, dir, missing string
		prepare            func()
	}{
		{"v3", v3, "without consolidated_metadata", func() { consolidateV3(t, v3) }},
		{"v2", v2, "without .zmetadata", nil},
		{"v2 consolidated", v2c, "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := webtest.Start(t, tc.dir)
			h, err := objectstore.OpenHTTP(ctx, srv.URL, objectstore.HTTPOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.missing != "" {
				_, err := zarr.Open(ctx, h, zarr.Options{})
				if err == nil || !strings.Contains(err.Error(), tc.missing) || !strings.Contains(err.Error(), "consolidate") ||
					!errors.Is(err, objectstore.ErrNoListing) || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), srv.URL) {
					t.Fatalf("err = %v; want one line naming the store and what is missing", err)
				}
				if tc.prepare == nil {
					return
				}
				tc.prepare()
			}
			remote, err := zarr.Open(ctx, h, zarr.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer remote.Close()
			px, err := objectstore.OpenPosix(tc.dir)
			if err != nil {
				t.Fatal(err)
			}
			defer px.Close()
			local, err := zarr.Open(ctx, px, zarr.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer local.Close()
			if len(remote.Arrays) != len(local.Arrays) || len(remote.Arrays) == 0 {
				t.Fatalf("%d arrays over HTTP, %d from disk", len(remote.Arrays), len(local.Arrays))
			}
			for _, a := range local.Arrays {
				ra := remote.Array(a.Path)
				if ra == nil || ra.Unsupported != "" || a.Unsupported != "" {
					t.Fatalf("array %q: %v", a.Path, ra)
				}
				got, want := readWhole(t, remote, ra), readWhole(t, local, a)
				if !bytes.Equal(got, want) {
					t.Errorf("array %q differs over HTTP", a.Path)
				}
			}
		})
	}
}

func readWhole(t testing.TB, h *zarr.Hierarchy, a *zarr.Array) []byte {
	t.Helper()
	n := int64(a.DType.Size)
	for _, d := range a.Shape {
		n *= d
	}
	dst := make([]byte, n)
	if err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: make([]int64, len(a.Shape)), Count: a.Shape, Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	return dst
}

// archive writes to the emulator a v3 array t of n time steps in chunks
// of one step, and returns the store.
func archive(t *testing.T, srv *gcstest.Server, n int) string {
	dir := t.TempDir()
	growStore(t, dir, n, 1, 0)
	bucket := srv.NewBucket(t)
	srv.UploadDir(t, bucket, "a.zarr", dir)
	return "gs://" + bucket + "/a.zarr"
}

// Versions of a large array come from asking the chunks a read needs, one
// small request each, never from listing the array; a small array is
// listed with one request. Trusting the metadata costs no request at all
// beyond the reads.
func TestRemoteVersionsWithoutListings(t *testing.T) {
	ctx := context.Background()
	srv := gcstest.Start(t)
	c := srv.Counts()
	for _, tc := range []struct {
		name                        string
		steps                       int
		trust                       bool
		listings, stats, readsExtra int64
	}{
		{"large array", 1500, false, 0, 3, 0},
		{"small array", 50, false, 1, 0, 0},
		{"large array, metadata trusted", 1500, true, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := objectstore.OpenGCS(ctx, archive(t, srv, tc.steps), objectstore.GCSOptions{Endpoint: srv.URL, Anonymous: true})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			var st objectstore.Store = must(objectstore.WithRetry(g, objectstore.RetryOptions{}))
			if tc.trust {
				st = objectstore.TrustMetadata(st)
			}
			h, err := zarr.Open(ctx, st, zarr.Options{ChunkCacheBytes: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			a := h.Array("t")
			l0, s0, r0 := c.Listings.Load(), c.Stats.Load(), c.Reads.Load()
			lst, err := h.List(ctx, a, time.Time{})
			if err != nil || (lst == nil) != tc.trust {
				t.Fatalf("List: %v, %v", lst, err)
			}
			for _, k := range []int64{7, 8, int64(tc.steps) - 1} {
				if lst != nil {
					if _, ok, err := lst.Version("t/c/" + itoa(int(k)) + "/0"); !ok || err != nil {
						t.Fatalf("version of chunk %d: %v %v", k, ok, err)
					}
				}
				got, err := readSample(t, h, k)
				if err != nil || got[0] != uint32(2*k) {
					t.Fatalf("sample %d: %v %v", k, got, err)
				}
			}
			if dl := c.Listings.Load() - l0; dl != tc.listings {
				t.Errorf("%d listing requests, want %d", dl, tc.listings)
			}
			if ds := c.Stats.Load() - s0; ds != tc.stats {
				t.Errorf("%d metadata requests, want %d (one per chunk read)", ds, tc.stats)
			}
			if dr := c.Reads.Load() - r0; dr != 3 {
				t.Errorf("%d reads, want 3", dr)
			}
		})
	}
}

// holdingCache is a source cache in memory that says it holds the store's
// bytes once it holds any (StoreHolder), as the disk cache's chunk tier
// does.
type holdingCache struct{ mapCache }

func (c *holdingCache) Put(k string, b []byte) { c.mapCache.Put(k, bytes.Clone(b)) }

func (c *holdingCache) HoldsStore() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m) > 0
}

// A lazy listing of a remote store made while the source cache holds the
// store's bytes asks each chunk's version before reading it, and reads
// the chunks the cache holds from there: a restarted mount reads none of
// them again. Made while the cache holds nothing, it asks nothing and
// learns the versions from the reads.
func TestRemoteListingAsksFirstWhenTheCacheHoldsTheStore(t *testing.T) {
	ctx := context.Background()
	srv := gcstest.Start(t)
	c := srv.Counts()
	src := archive(t, srv, 1500)
	sc := &holdingCache{mapCache{m: map[string][]byte{}}}
	open := func() *zarr.Hierarchy {
		g, err := objectstore.OpenGCS(ctx, src, objectstore.GCSOptions{Endpoint: srv.URL, Anonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		h, err := zarr.Open(ctx, g, zarr.Options{ChunkCacheBytes: -1, SourceCache: sc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	read := func(h *zarr.Hierarchy, samples ...int64) (stats, reads int64) {
		s0, r0 := c.Stats.Load(), c.Reads.Load()
		for _, k := range samples {
			if got, err := readSample(t, h, k); err != nil || got[0] != uint32(2*k) {
				t.Fatalf("sample %d: %v %v", k, got, err)
			}
		}
		return c.Stats.Load() - s0, c.Reads.Load() - r0
	}
	if s, r := read(open(), 7, 8, 9); s != 0 || r != 3 {
		t.Errorf("into an empty cache: %d metadata requests and %d reads, want 0 and 3", s, r)
	}
	h := open()
	if s, r := read(h, 7, 8, 9); s != 3 || r != 0 {
		t.Errorf("restarted over the cache: %d metadata requests and %d reads, want 3 and 0", s, r)
	}
	if s, r := read(h, 10); s != 1 || r != 1 {
		t.Errorf("a chunk the cache lacks: %d metadata requests and %d reads, want 1 and 1", s, r)
	}
	if lst := h.Array("t").Listing(); lst == nil || !lst.AsksFirst() {
		t.Error("the listing does not say it asks first")
	}
}
