package zarr_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
	"github.com/zarrfs/zarrfs/zarr"
)

// goneDoc is a v3 array t shaped (shape) in chunks of one row of two
// uint8, raw, fill value fill.
func goneDoc(shape, fill, attrs string) []byte {
	return []byte(`{"zarr_format":3,"node_type":"array","shape":` + shape + `,"data_type":"uint8",
 "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,2]}},
 "chunk_key_encoding":{"name":"default"},"fill_value":` + fill + `,
 "codecs":[{"name":"bytes"}],"attributes":` + attrs + `}`)
}

// A missing chunk reads as the fill value while the array's metadata, as
// it is now, still names it: unchanged, grown, attributes edited. Once the
// array shrank past it, changed otherwise, or is gone, the Read fails with
// ErrMetadataChanged naming the chunk: it was deleted, and its fill value
// would be served as data. Consolidated metadata is asked, not the
// array's own document.
func TestMissingChunkNamedByTheMetadata(t *testing.T) {
	const key = "t/zarr.json"
	for _, tc := range []struct {
		name    string
		now     []byte // t/zarr.json after Open; nil: deleted
		changed string // "" when the fill value stands
	}{
		{"unchanged", goneDoc("[4,2]", "7", "{}"), ""},
		{"grown", goneDoc("[9,2]", "7", "{}"), ""},
		{"attributes", goneDoc("[4,2]", "7", `{"units":"K"}`), ""},
		{"shrunk", goneDoc("[1,2]", "7", "{}"), "shape [1 2], no longer [4 2]"},
		{"fill value", goneDoc("[4,2]", "8", "{}"), "more than its shape changed"},
		{"gone", nil, "t/zarr.json is gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newMemStore(map[string][]byte{
				"zarr.json": []byte(`{"zarr_format":3,"node_type":"group"}`),
				key:         goneDoc("[4,2]", "7", "{}"),
				"t/c/0/0":   {1, 2}, "t/c/2/0": {5, 6}, // rows 1 and 3 never written
			})
			h := openWith(t, st, zarr.Options{ChunkCacheBytes: -1})
			st.mu.Lock()
			if tc.now == nil {
				delete(st.files, key)
			} else {
				st.files[key] = tc.now
			}
			st.mu.Unlock()
			a := h.Array("t")
			// Rows 0 and 1: one chunk present, one missing.
			req := []zarr.Request{{Array: a, Start: []int64{0, 0}, Count: []int64{2, 2}, Dst: make([]byte, 4)}}
			err := h.Read(context.Background(), nil, req)
			if tc.changed == "" {
				if err != nil || !bytes.Equal(req[0].Dst, []byte{1, 2, 7, 7}) {
					t.Fatalf("Read: %v, %v; want rows 1 2 and the fill value 7 7", err, req[0].Dst)
				}
				return
			}
			var ce *zarr.ChunkError
			if !errors.Is(err, zarr.ErrMetadataChanged) || !errors.As(err, &ce) || ce.Key != "t/c/1/0" || !strings.Contains(err.Error(), tc.changed) {
				t.Fatalf("Read: %v; want ErrMetadataChanged naming chunk t/c/1/0 and %q", err, tc.changed)
			}
			// A Read that finds nothing missing asks nothing.
			gets := st.gets.Load()
			whole := []zarr.Request{{Array: a, Start: []int64{2, 0}, Count: []int64{1, 2}, Dst: make([]byte, 2)}}
			if err := h.Read(context.Background(), nil, whole); err != nil || st.gets.Load() != gets+1 {
				t.Errorf("a Read of a present chunk: %v, %d requests, want its one", err, st.gets.Load()-gets)
			}
		})
	}
	// Consolidated metadata: its entry is what the mount was opened from.
	zarray := func(shape string) string {
		return `{"zarr_format":2,"shape":` + shape + `,"chunks":[1,2],"dtype":"|u1","compressor":null,"filters":null,"fill_value":7,"order":"C"}`
	}
	zmeta := func(shape string) []byte {
		return []byte(`{"zarr_consolidated_format":1,"metadata":{".zgroup":{"zarr_format":2},"t/.zarray":` + zarray(shape) + `}}`)
	}
	st := newMemStore(map[string][]byte{".zgroup": []byte(`{"zarr_format":2}`), ".zmetadata": zmeta("[4,2]"), "t/0.0": {1, 2}})
	h := openWith(t, st, zarr.Options{ChunkCacheBytes: -1})
	a := h.Array("t")
	read := func() error {
		return h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: []int64{1, 0}, Count: []int64{1, 2}, Dst: make([]byte, 2)}})
	}
	if err := read(); err != nil {
		t.Fatalf("consolidated, no t/.zarray of its own: %v", err)
	}
	st.mu.Lock()
	st.files[".zmetadata"] = zmeta("[1,2]")
	st.mu.Unlock()
	if err := read(); !errors.Is(err, zarr.ErrMetadataChanged) {
		t.Fatalf("consolidated metadata shrunk: %v, want ErrMetadataChanged", err)
	}
}

// consolidatedGone writes to dir a v3 store whose consolidated metadata
// names arrays a0..a(n-1), each shaped [8,2] in chunks of one row like
// goneDoc's; only row 0 of a0 is written.
func consolidatedGone(t testing.TB, dir string, n int) {
	members := make([]string, n)
	for i := range members {
		members[i] = fmt.Sprintf(`"a%d":%s`, i, goneDoc("[8,2]", "7", `{"long_name":"`+strings.Repeat("x", 200)+`"}`))
	}
	webtest.WriteFiles(t, dir, map[string][]byte{
		"zarr.json": []byte(`{"zarr_format":3,"node_type":"group","consolidated_metadata":{"kind":"inline","must_understand":false,"metadata":{` +
			strings.Join(members, ",") + `}}}`),
		"a0/c/0/0": {1, 2},
	})
}

// A chunk a lazy listing (HTTP) learnt is missing is vouched for by one
// read of the metadata after it was learnt, for every Read that finds it
// again, as a listed absence is by one read per listing: reading the rows
// of a missing chunk again costs no request. A chunk found missing anew
// needs the metadata read after it (one request), and the metadata
// changed since fails the Read.
func TestLazyAbsenceChecksTheMetadataOnce(t *testing.T) {
	dir := t.TempDir()
	consolidatedGone(t, dir, 3)
	srv := webtest.Start(t, dir)
	st, err := objectstore.OpenHTTP(context.Background(), srv.URL, objectstore.HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// With a source cache, a Read lists the array it reads (lazily, for
	// HTTP), as the device path's batches do; a fill reads under its pin.
	h := openWith(t, st, zarr.Options{ChunkCacheBytes: -1, SourceCache: &mapCache{m: map[string][]byte{}}})
	a := h.Array("a0")
	read := func(row int64) (int64, error) {
		before := srv.Requests()
		req := []zarr.Request{{Array: a, Start: []int64{row, 0}, Count: []int64{1, 2}, Dst: make([]byte, 2)}}
		err := h.Read(context.Background(), nil, req)
		if err == nil && !bytes.Equal(req[0].Dst, []byte{7, 7}) {
			t.Fatalf("row %d: %v, want the fill value", row, req[0].Dst)
		}
		return srv.Requests() - before, err
	}
	if n, err := read(1); err != nil || n != 2 {
		t.Fatalf("first read of a missing chunk: %v, %d requests, want the chunk's and the metadata's", err, n)
	}
	for range 5 {
		if n, err := read(1); err != nil || n != 0 {
			t.Fatalf("the same missing chunk again: %v, %d requests, want none", err, n)
		}
	}
	if n, err := read(2); err != nil || n != 2 {
		t.Fatalf("another missing chunk: %v, %d requests, want the chunk's and the metadata's", err, n)
	}
	// The array shrank: a chunk found missing now fails.
	consolidated := func(shape string) {
		os.WriteFile(filepath.Join(dir, "zarr.json"), []byte(`{"zarr_format":3,"node_type":"group","consolidated_metadata":{"kind":"inline","must_understand":false,"metadata":{"a0":`+string(goneDoc(shape, "7", "{}"))+`}}}`), 0o644)
	}
	consolidated("[2,2]")
	if _, err := read(5); !errors.Is(err, zarr.ErrMetadataChanged) {
		t.Fatalf("a chunk missing past the shape the metadata names now: %v, want ErrMetadataChanged", err)
	}
}

// A Read that finds chunks of ten arrays missing, under consolidated
// metadata of a thousand arrays (about 470 KB), reads the document once
// and parses it once, whatever the number of arrays checked against it.
func BenchmarkMissingChunksConsolidated(b *testing.B) {
	dir := b.TempDir()
	consolidatedGone(b, dir, 1000)
	doc, err := os.ReadFile(filepath.Join(dir, "zarr.json"))
	if err != nil {
		b.Fatal(err)
	}
	st := newMemStore(map[string][]byte{"zarr.json": doc})
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	var reqs []zarr.Request
	for i := range 10 {
		reqs = append(reqs, zarr.Request{Array: h.Array(fmt.Sprintf("a%d", i)), Start: []int64{1, 0}, Count: []int64{1, 2}, Dst: make([]byte, 2)})
	}
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if err := h.Read(context.Background(), nil, reqs); err != nil {
			b.Fatal(err)
		}
	}
}
