package zarr_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/klauspost/compress/zlib"

	"github.com/zarrfs/zarrfs/zarr/codec"
)

// hdf5Chunk encodes float32 values as HDF5 does with shuffle, deflate and
// fletcher32, in that order.
func hdf5Chunk(vals []float32, checksum bool) []byte {
	raw := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	sh := make([]byte, len(raw))
	n := len(vals)
	for i := range n {
		for j := range 4 {
			sh[j*n+i] = raw[4*i+j]
		}
	}
	var z bytes.Buffer
	w := zlib.NewWriter(&z)
	w.Write(sh)
	w.Close()
	out := z.Bytes()
	if checksum {
		out = binary.LittleEndian.AppendUint32(out, codec.Fletcher32(out))
	}
	return out
}

func TestHDF5Filters(t *testing.T) {
	vals := []float32{1.5, -2, 3.25, 1e6, 0, 7, 8, 9}
	v2 := func(filters string) map[string][]byte {
		return map[string][]byte{
			".zarray": []byte(`{"zarr_format":2,"shape":[16],"chunks":[8],"dtype":"<f4","compressor":null,"fill_value":0,"order":"C","filters":` + filters + `}`),
		}
	}
	v3 := func(codecs string) map[string][]byte {
		return map[string][]byte{
			"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":[16],"data_type":"float32",
			"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[8]}},"chunk_key_encoding":{"name":"default"},
			"fill_value":0,"codecs":[{"name":"bytes","configuration":{"endian":"little"}}` + codecs + `]}`),
		}
	}
	for _, c := range []struct {
		name     string
		files    map[string][]byte
		key      string
		checksum bool
	}{
		{"v2 shuffle zlib", v2(`[{"id":"shuffle","elementsize":4},{"id":"zlib","level":4}]`), "0", false},
		{"v2 shuffle zlib fletcher32", v2(`[{"id":"shuffle","elementsize":4},{"id":"zlib","level":4},{"id":"fletcher32"}]`), "0", true},
		{"v3 numcodecs", v3(`,{"name":"numcodecs.shuffle","configuration":{"elementsize":4}},{"name":"numcodecs.zlib","configuration":{"level":4}},{"name":"numcodecs.fletcher32","configuration":{}}`), "c/0", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.files[c.key] = hdf5Chunk(vals, c.checksum)
			h, _ := openMem(t, c.files)
			a := h.Array("")
			if a.Unsupported != "" {
				t.Fatalf("unsupported: %s", a.Unsupported)
			}
			got, err := read(h, a, []int64{0}, []int64{16})
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range vals {
				if g := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])); g != v {
					t.Fatalf("element %d: %v, want %v", i, g, v)
				}
			}
			if c.checksum {
				bad := bytes.Clone(c.files[c.key])
				bad[3] ^= 1
				c.files[c.key] = bad
				h, _ := openMem(t, c.files)
				if _, err := read(h, h.Array(""), []int64{0}, []int64{8}); !errors.Is(err, codec.ErrCorrupt) {
					t.Fatalf("corrupt chunk read: %v", err)
				}
			}
		})
	}
}

func TestFiltersUnsupported(t *testing.T) {
	for _, c := range []struct{ filters, reason string }{
		{`[{"id":"grib","var":"t"}]`, "eccodes"},
		{`[{"id":"fletcher32"},{"id":"zlib"}]`, "fletcher32 before another codec"},
		{`[{"id":"zlib"},{"id":"zstd"}]`, "more than one compression codec"},
		{`[{"id":"bitround","keepbits":3}]`, `"bitround"`},
		{`[{"id":"shuffle","elementsize":65537}]`, "elementsize 65537"}, // codec.MaxShuffleElement + 1
		{`[{"id":"shuffle","elementsize":0}]`, "elementsize 0"},
	} {
		files := map[string][]byte{
			".zarray": []byte(`{"zarr_format":2,"shape":[16],"chunks":[8],"dtype":"<f4","compressor":null,"fill_value":0,"order":"C","filters":` + c.filters + `}`),
		}
		h, _ := openMem(t, files)
		if a := h.Array(""); !strings.Contains(a.Unsupported, c.reason) {
			t.Errorf("%s: unsupported %q, want it to name %q", c.filters, a.Unsupported, c.reason)
		}
	}
}
