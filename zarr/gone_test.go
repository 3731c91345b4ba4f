package zarr_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

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
