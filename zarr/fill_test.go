package zarr_test

import (
	"encoding/binary"
	"math"
	"testing"
)

// A "NaN" fill value reads, for a chunk missing from the store, as numpy's
// canonical quiet NaN of the array's width, next to a chunk that is
// present; v2 and v3, float16, float32 and float64, no Python needed.
func TestNaNFillMissingChunk(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string][]byte
		size  int
		nan   uint64 // numpy's NaN bits
	}{
		{"v3 float32", map[string][]byte{
			"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":[8],"data_type":"float32",
			"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4]}},"chunk_key_encoding":{"name":"default"},
			"fill_value":"NaN","codecs":[{"name":"bytes","configuration":{"endian":"little"}}]}`),
		}, 4, 0x7fc00000},
		{"v3 float16", map[string][]byte{
			"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":[8],"data_type":"float16",
			"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4]}},"chunk_key_encoding":{"name":"default"},
			"fill_value":"NaN","codecs":[{"name":"bytes","configuration":{"endian":"little"}}]}`),
		}, 2, 0x7e00},
		{"v2 float64", map[string][]byte{
			".zarray": []byte(`{"zarr_format":2,"shape":[8],"chunks":[4],"dtype":"<f8","compressor":null,
			"fill_value":"NaN","order":"C","filters":null}`),
		}, 8, 0x7ff8000000000000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Chunk 0 holds 1, 2, 3, 4; chunk 1 is missing.
			present := make([]byte, 4*tc.size)
			for i := range 4 {
				putNumber(present[i*tc.size:], tc.size, float64(i+1))
			}
			key := "c/0"
			if _, v2 := tc.files[".zarray"]; v2 {
				key = "0"
			}
			tc.files[key] = present
			h, _ := openMem(t, tc.files)
			a := h.Array("")
			if a.FillValue != "NaN" {
				t.Errorf("FillValue = %v, want \"NaN\"", a.FillValue)
			}
			got, err := read(h, a, []int64{0}, []int64{8})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 8 {
				b := got[i*tc.size : (i+1)*tc.size]
				if i < 4 {
					if want := present[i*tc.size : (i+1)*tc.size]; string(b) != string(want) {
						t.Errorf("element %d: % x, want % x", i, b, want)
					}
					continue
				}
				if bits := bitsOf(b, tc.size); bits != tc.nan {
					t.Errorf("element %d of the missing chunk: %#x, want NaN %#x", i, bits, tc.nan)
				}
			}
			if n := h.Stats().ChunksMissing.Load(); n != 1 {
				t.Errorf("%d chunks read as missing, want 1", n)
			}
		})
	}
}

func putNumber(b []byte, size int, f float64) {
	switch size {
	case 2: // small integers are exact in float16: sign 0, exponent, mantissa
		e := math.Ilogb(f)
		m := uint16((f/math.Ldexp(1, e) - 1) * 1024)
		binary.LittleEndian.PutUint16(b, uint16(e+15)<<10|m)
	case 4:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(f)))
	case 8:
		binary.LittleEndian.PutUint64(b, math.Float64bits(f))
	}
}

func bitsOf(b []byte, size int) uint64 {
	switch size {
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}
