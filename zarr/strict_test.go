package zarr_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
)

// arrayDoc is a small uint8 array document with one field replaced (or
// removed, for a nil value) and rendered back to JSON.
func arrayDoc(t testing.TB, field string, value any) []byte {
	t.Helper()
	m := map[string]any{
		"zarr_format": 3, "node_type": "array", "shape": []int{4}, "data_type": "uint8",
		"chunk_grid":         map[string]any{"name": "regular", "configuration": map[string]any{"chunk_shape": []int{2}}},
		"chunk_key_encoding": map[string]any{"name": "default"},
		"codecs":             []any{map[string]any{"name": "bytes"}},
		"fill_value":         0, "attributes": map[string]any{},
	}
	if value == nil {
		delete(m, field)
	} else if field != "" {
		m[field] = value
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func withDType(t testing.TB, dt string, fill any) []byte {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(arrayDoc(t, "fill_value", fill)))
	d.UseNumber()
	d.Decode(&m)
	m["data_type"] = dt
	m["codecs"] = []any{map[string]any{"name": "bytes", "configuration": map[string]any{"endian": "little"}}}
	b, _ := json.Marshal(m)
	return b
}

func blosc(t testing.TB, cfg map[string]any) []byte {
	return arrayDoc(t, "codecs", []any{map[string]any{"name": "bytes"}, map[string]any{"name": "blosc", "configuration": cfg}})
}

// Metadata zarr-python refuses is refused (the array left out, with the
// reason): trailing data after the JSON, a zarr_format other than the
// document's, dimension names that are not strings, blosc settings outside
// the spec's lists, fill values out of the dtype's range or of another
// kind. integration's TestStrictMetadataLikeZarrPython checks each against
// zarr-python itself.
func TestStrictMetadata(t *testing.T) {
	good := arrayDoc(t, "", nil)
	for _, c := range []struct {
		name   string
		doc    []byte
		reason string // "" when the array must open
	}{
		{"plain", good, ""},
		{"trailing garbage", append(append([]byte{}, good...), " garbage"...), "data after the value"},
		{"trailing object", append(append([]byte{}, good...), "{}"...), "data after the value"},
		{"trailing white space", append(append([]byte{}, good...), " \n\t"...), ""},
		{"zarr_format 2", arrayDoc(t, "zarr_format", 2), "zarr_format 2 (want 3)"},
		{"zarr_format string", arrayDoc(t, "zarr_format", "3"), `zarr_format "3" (want 3)`},
		{"zarr_format missing", arrayDoc(t, "zarr_format", nil), "zarr_format missing"},
		{"dimension_names int", arrayDoc(t, "dimension_names", []any{1}), "dimension_names entry 0"},
		{"dimension_names null", []byte(strings.Replace(string(good), `"attributes"`, `"dimension_names":[null],"attributes"`, 1)), ""},
		{"blosc bogus cname", blosc(t, map[string]any{"cname": "bogus", "clevel": 5, "shuffle": "shuffle", "typesize": 1, "blocksize": 0}), "cname"},
		{"blosc int cname", blosc(t, map[string]any{"cname": 5}), "cname"},
		{"blosc bogus shuffle", blosc(t, map[string]any{"cname": "lz4", "shuffle": "bogus"}), "shuffle"},
		{"blosc int shuffle", blosc(t, map[string]any{"cname": "lz4", "shuffle": 1}), "shuffle"},
		{"blosc defaults", blosc(t, map[string]any{}), ""},
		{"uint8 300", arrayDoc(t, "fill_value", 300), "out of range for uint8"},
		{"uint8 -1", arrayDoc(t, "fill_value", -1), "out of range for uint8"},
		{"uint8 255", arrayDoc(t, "fill_value", 255), ""},
		{"uint8 2.0", arrayDoc(t, "fill_value", json.Number("2.0")), ""},
		{"int8 200", withDType(t, "int8", 200), "out of range for int8"},
		{"int8 -128", withDType(t, "int8", -128), ""},
		{"int8 -129", withDType(t, "int8", -129), "out of range for int8"},
		{"int64 1e30", withDType(t, "int64", json.Number("1e30")), "out of range for int64"},
		{"int64 1.5", withDType(t, "int64", 1.5), "not an integer"},
		{"int64 -2^63", withDType(t, "int64", json.Number("-9223372036854775808")), ""},
		{"uint64 2^64-1", withDType(t, "uint64", json.Number("18446744073709551615")), ""},
		{"uint64 -1", withDType(t, "uint64", -1), "out of range for uint64"},
		{"uint16 65536", withDType(t, "uint16", 65536), "out of range for uint16"},
		{"int16 1000.0", withDType(t, "int16", json.Number("1000.0")), ""},
		{"int32 hex", withDType(t, "int32", "0x10"), "fill_value"},
		{"float32 hex", withDType(t, "float32", "0x3f800000"), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, _ := openMem(t, map[string][]byte{"zarr.json": []byte(`{"zarr_format":3,"node_type":"group"}`), "a/zarr.json": c.doc})
			a := h.Array("a")
			if a == nil {
				t.Fatal("no array")
			}
			if c.reason == "" && a.Unsupported != "" {
				t.Fatalf("refused: %s", a.Unsupported)
			}
			if c.reason != "" && !strings.Contains(a.Unsupported, c.reason) {
				t.Fatalf("unsupported %q, want it to mention %q", a.Unsupported, c.reason)
			}
		})
	}
}

// A fill value at the edge of its dtype's range reads as itself, and the
// sidecar's value (Array.FillValue) is the one read.
func TestFillValueEdges(t *testing.T) {
	for _, c := range []struct {
		dt   string
		fill any
		want uint64 // the element's little-endian bits
		json any
	}{
		{"uint8", 255, 255, int64(255)},
		{"int8", -128, 0x80, int64(-128)},
		{"int16", json.Number("1000.0"), 1000, int64(1000)},
		{"uint64", json.Number("18446744073709551615"), 1<<64 - 1, uint64(1<<64 - 1)},
		{"int64", json.Number("-9223372036854775808"), 1 << 63, int64(-1 << 63)},
	} {
		t.Run(c.dt, func(t *testing.T) {
			h, _ := openMem(t, map[string][]byte{"zarr.json": withDType(t, c.dt, c.fill)})
			a := h.Array("")
			if a.Unsupported != "" {
				t.Fatal(a.Unsupported)
			}
			got, err := read(h, a, []int64{0}, []int64{1})
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 8)
			copy(b, got)
			if v := binary.LittleEndian.Uint64(b); v != c.want {
				t.Errorf("reads %#x, want %#x", v, c.want)
			}
			if a.FillValue != c.json {
				t.Errorf("FillValue %#v, want %#v", a.FillValue, c.json)
			}
		})
	}
}
