package zarr_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/klauspost/compress/zlib"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/zarr"
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

// A chunk decoded in two steps (HDF5's deflate, then shuffle) gives the
// first step's buffer back to the lender (Options.Host) once the second
// has read it: a second Read of the array is lent the same memory again,
// and allocates none of its own.
func TestTwoStepDecodeReusesItsBuffer(t *testing.T) {
	const n, chunks = 64 << 10, 8 // float32 values per chunk: 256 KiB
	files := map[string][]byte{
		".zarray": []byte(fmt.Sprintf(`{"zarr_format":2,"shape":[%d],"chunks":[%d],"dtype":"<f4","compressor":null,"fill_value":0,"order":"C",`+
			`"filters":[{"id":"shuffle","elementsize":4},{"id":"zlib","level":1}]}`, n*chunks, n)),
	}
	vals := make([]float32, n)
	for c := range chunks {
		for i := range vals {
			vals[i] = float32(c*n + i)
		}
		files[fmt.Sprint(c)] = hdf5Chunk(vals, false)
	}
	arena := memory.NewArena(64 << 20)
	defer arena.Close()
	h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{ChunkCacheBytes: -1, Host: arena})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a := h.Arrays[0]
	if a.Unsupported != "" {
		t.Fatal(a.Unsupported)
	}
	// The whole array, one request: the last step decodes straight into
	// it, the first into buffers the lender lends.
	dst := make([]byte, 4*n*chunks)
	reqs := []zarr.Request{{Array: a, Start: []int64{0}, Count: []int64{n * chunks}, Dst: dst}}
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // TotalAlloc counts everything
	var before, after runtime.MemStats
	var first int64
	for round := range 3 {
		runtime.ReadMemStats(&before)
		if err := h.Read(context.Background(), nil, reqs); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		for i := 0; i < n*chunks; i += n/2 - 1 {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(dst[4*i:])); got != float32(i) {
				t.Fatalf("round %d value %d: %v", round, i, got)
			}
		}
		mapped, idle := arena.Held()
		if mapped != idle {
			t.Errorf("round %d: %d bytes still lent after the Read", round, mapped-idle)
		}
		if round == 0 {
			first = mapped
		} else if mapped != first {
			t.Errorf("round %d: %d bytes mapped, %d after the first: the first step's buffers were not lent again", round, mapped, first)
		}
	}
	if first == 0 || first > 2*4*n*chunks {
		t.Errorf("%d bytes mapped for the first step's %d", first, 4*n*chunks)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4*n*chunks/2 {
		t.Errorf("the third Read allocated %d bytes; the buffers of the first step (%d bytes) were not reused", got, 4*n*chunks)
	}
}

// ReadCost charges a chunk decoded in two steps the buffer it holds
// between them: one decoded chunk more than the same chunk in one step.
func TestReadCostCountsTheStepBetween(t *testing.T) {
	open := func(filters string) *zarr.Array {
		h, err := zarr.Open(context.Background(), newMemStore(map[string][]byte{
			".zarray": []byte(`{"zarr_format":2,"shape":[64],"chunks":[16],"dtype":"<f4","compressor":null,"fill_value":0,"order":"C","filters":` + filters + `}`),
		}), zarr.Options{ChunkCacheBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h.Arrays[0]
	}
	one := open(`[{"id":"zlib","level":1}]`)
	two := open(`[{"id":"shuffle","elementsize":4},{"id":"zlib","level":1}]`)
	start, count := []int64{8}, []int64{40} // 3 chunks
	if got, want := two.ReadCost(start, count)-one.ReadCost(start, count), int64(3*16*4); got != want {
		t.Errorf("two steps cost %d more than one, want %d (a decoded chunk each)", got, want)
	}
	if got, want := two.ReadCostInto(start, count)-one.ReadCostInto(start, count), int64(3*16*4); got != want {
		t.Errorf("into the region: two steps cost %d more than one, want %d", got, want)
	}
}
