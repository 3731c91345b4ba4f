package zarr_test

import (
	"context"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/zarr"
)

func openDoc(t *testing.T, files map[string][]byte) *zarr.Array {
	t.Helper()
	h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h.Arrays[0]
}

const v3Doc = `{"zarr_format":3,"node_type":"array","shape":[SHAPE],"data_type":"float32",
 "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[24,4]}},
 "chunk_key_encoding":{"name":"default"},"fill_value":0,
 "codecs":[{"name":"bytes","configuration":{"endian":"little"}}CODEC],
 "dimension_names":["time","x"],"attributes":{ATTRS}}`

// DataHash ignores the length along the given axis and the attributes, and
// changes with everything else that shapes the decoded bytes.
func TestDataHash(t *testing.T) {
	doc := func(shape, codec, attrs string) map[string][]byte {
		d := strings.NewReplacer("SHAPE", shape, "CODEC", codec, "ATTRS", attrs).Replace(v3Doc)
		return map[string][]byte{"zarr.json": []byte(d)}
	}
	base := openDoc(t, doc("30,4", "", ""))
	same := map[string]*zarr.Array{
		"appended":       openDoc(t, doc("40,4", "", "")),
		"new attributes": openDoc(t, doc("30,4", "", `"history":"appended"`)),
	}
	for name, a := range same {
		if a.DataHash(0) != base.DataHash(0) {
			t.Errorf("%s: DataHash(0) changed", name)
		}
	}
	if same["appended"].DataHash(-1) == base.DataHash(-1) {
		t.Error("DataHash(-1) ignores the length")
	}
	other := map[string]*zarr.Array{
		"other dimension grew": openDoc(t, doc("30,5", "", "")),
		"codec added":          openDoc(t, doc("30,4", `,{"name":"gzip","configuration":{"level":1}}`, "")),
	}
	for name, a := range other {
		if a.DataHash(0) == base.DataHash(0) {
			t.Errorf("%s: DataHash(0) unchanged", name)
		}
	}
	// v2: dimension names live in .zattrs and count; other attributes do not.
	v2 := func(dims, extra string) map[string][]byte {
		return map[string][]byte{
			".zarray": []byte(`{"zarr_format":2,"shape":[30,4],"chunks":[24,4],"dtype":"<f4","compressor":null,"fill_value":0,"order":"C","filters":null}`),
			".zattrs": []byte(`{"_ARRAY_DIMENSIONS":[` + dims + `]` + extra + `}`),
		}
	}
	a, b, c := openDoc(t, v2(`"time","x"`, "")), openDoc(t, v2(`"time","x"`, `,"units":"K"`)), openDoc(t, v2(`"step","x"`, ""))
	if a.DataHash(0) != b.DataHash(0) || a.DataHash(0) == c.DataHash(0) {
		t.Error("v2: attributes other than the dimension names must not count, the dimension names must")
	}
}
