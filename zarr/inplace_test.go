package zarr_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/zarr"
)

// levelStore is a v3 array (time 2, level 4, y 3, x 5) of uint16, big- or
// little-endian, zstd, one chunk per time step holding every level: the
// layout of ERA5's pressure-level variables. Element (t, l, y, x) is
// t*1000 + l*100 + y*10 + x.
func levelStore(t testing.TB, endian string) map[string][]byte {
	enc, _ := zstd.NewWriter(nil)
	files := map[string][]byte{"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":[2,4,3,5],"data_type":"uint16",
	"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,4,3,5]}},
	"chunk_key_encoding":{"name":"default"},"fill_value":0,
	"codecs":[{"name":"bytes","configuration":{"endian":"` + endian + `"}},{"name":"zstd","configuration":{"level":1}}]}`)}
	for ti := range 2 {
		raw := make([]byte, 4*3*5*2)
		for i := range 4 * 3 * 5 {
			v := uint16(ti*1000 + i/15*100 + i%15/5*10 + i%5)
			if endian == "big" {
				binary.BigEndian.PutUint16(raw[2*i:], v)
			} else {
				binary.LittleEndian.PutUint16(raw[2*i:], v)
			}
		}
		files["c/"+string(rune('0'+ti))+"/0/0/0"] = enc.EncodeAll(raw, nil)
	}
	return files
}

// A view stacks the levels of one chunk as adjacent slots of a sample: the
// chunk decodes straight into them, with no copy, however many requests it
// is split into. Slots in another order, or with a gap, are copied.
func TestDecodeInPlace(t *testing.T) {
	for _, endian := range []string{"little", "big"} {
		for _, tc := range []struct {
			name   string
			slots  []int // slot of each level in the sample buffer
			nslots int
			copied bool
		}{
			{"adjacent", []int{0, 1, 2, 3}, 4, false},
			{"after another channel", []int{1, 2, 3, 4}, 5, false},
			{"reversed", []int{3, 2, 1, 0}, 4, true},
			{"gap", []int{0, 1, 3, 4}, 5, true},
		} {
			t.Run(endian+"/"+tc.name, func(t *testing.T) {
				st := newMemStore(levelStore(t, endian))
				stats := &zarr.Stats{}
				h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1, Stats: stats})
				if err != nil {
					t.Fatal(err)
				}
				defer h.Close()
				a := h.Arrays[0]
				const per = 3 * 5 * 2
				buf := make([]byte, tc.nslots*per)
				var reqs []zarr.Request
				for l, s := range tc.slots {
					reqs = append(reqs, zarr.Request{Array: a, Start: []int64{1, int64(l), 0, 0}, Count: []int64{1, 1, 3, 5}, Dst: buf[s*per : (s+1)*per]})
				}
				if err := h.Read(context.Background(), nil, reqs); err != nil {
					t.Fatal(err)
				}
				for l, s := range tc.slots {
					for i := range 15 {
						got := binary.LittleEndian.Uint16(buf[s*per+2*i:])
						if want := uint16(1000 + l*100 + i/5*10 + i%5); got != want {
							t.Fatalf("level %d element %d: %d, want %d", l, i, got, want)
						}
					}
				}
				copied := stats.BytesAssembled.Load()
				swapped := int64(0)
				if endian == "big" {
					swapped = 4 * per
				}
				if tc.copied && copied != 4*per {
					t.Errorf("assembled %d bytes, want the chunk copied (%d)", copied, 4*per)
				}
				if !tc.copied && copied != swapped {
					t.Errorf("assembled %d bytes, want %d: the chunk was not decoded in place", copied, swapped)
				}
			})
		}
	}
}

// ReadCostInto charges a chunk that lands whole and contiguous in the
// destination its compressed bytes only, and every other chunk what
// ReadCost charges.
func TestReadCostInto(t *testing.T) {
	open := func(shape, chunks string) *zarr.Array {
		st := newMemStore(map[string][]byte{"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":` + shape + `,"data_type":"float32",
	"chunk_grid":{"name":"regular","configuration":{"chunk_shape":` + chunks + `}},
	"chunk_key_encoding":{"name":"default"},"fill_value":0,
	"codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1}}]}`)})
		h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h.Arrays[0]
	}
	const unit = 4 * 16 * 32 * 4 // one (1, 4, 16, 32) float32 chunk
	levels := open("[8,4,16,32]", "[1,4,16,32]")
	for _, tc := range []struct {
		name         string
		start, count []int64
		inPlace      int64 // chunks charged their compressed bytes only
	}{
		{"one sample, every level", []int64{3, 0, 0, 0}, []int64{1, 4, 16, 32}, 1},
		{"three samples", []int64{3, 0, 0, 0}, []int64{3, 4, 16, 32}, 3},
		{"one level", []int64{3, 1, 0, 0}, []int64{1, 1, 16, 32}, 0},
		{"half the rows", []int64{3, 0, 0, 0}, []int64{1, 4, 8, 32}, 0},
	} {
		full := levels.ReadCost(tc.start, tc.count)
		got := levels.ReadCostInto(tc.start, tc.count)
		if want := full - tc.inPlace*unit; got != want {
			t.Errorf("%s: ReadCostInto %d, want %d (ReadCost %d)", tc.name, got, want, full)
		}
	}
	tiled := open("[8,4,16,32]", "[1,4,8,32]") // a sample is two tiles of rows
	if s, c := []int64{3, 0, 0, 0}, []int64{1, 4, 16, 32}; tiled.ReadCostInto(s, c) != tiled.ReadCost(s, c) {
		t.Error("tiled chunks charged as decoded in place: a tile is not contiguous in the sample")
	}
}

// ReadCostInto's in-place chunks are exactly those a Read over the region
// decodes in place: ReadCost less ReadCostInto is the bytes of the chunks
// the Read did not copy. The data are incompressible, so that a chunk
// charged as in place but copied would hold twice what it is charged.
func TestReadCostIntoMatchesRead(t *testing.T) {
	enc, _ := zstd.NewWriter(nil)
	shape := []int64{8, 4, 16, 32}
	for _, tc := range []struct {
		chunks       []int64
		start, count []int64
	}{
		{[]int64{1, 4, 16, 32}, []int64{3, 0, 0, 0}, []int64{1, 4, 16, 32}},
		{[]int64{1, 4, 16, 32}, []int64{3, 0, 0, 0}, []int64{3, 4, 16, 32}},
		{[]int64{1, 4, 16, 32}, []int64{3, 1, 0, 0}, []int64{1, 1, 16, 32}},
		{[]int64{1, 4, 16, 32}, []int64{3, 0, 0, 0}, []int64{1, 4, 8, 32}},
		{[]int64{1, 4, 8, 32}, []int64{3, 0, 0, 0}, []int64{1, 4, 16, 32}},
		{[]int64{1, 1, 16, 32}, []int64{3, 0, 0, 0}, []int64{2, 4, 16, 32}},
		{[]int64{1, 2, 16, 32}, []int64{3, 1, 0, 0}, []int64{1, 3, 16, 32}},
		{[]int64{2, 1, 16, 32}, []int64{3, 0, 0, 0}, []int64{1, 4, 16, 32}}, // a chunk two samples thick
		{[]int64{2, 1, 16, 32}, []int64{2, 0, 0, 0}, []int64{2, 4, 16, 32}},
		{[]int64{2, 4, 16, 32}, []int64{2, 0, 0, 0}, []int64{4, 4, 16, 32}},
		{[]int64{3, 4, 16, 32}, []int64{2, 0, 0, 0}, []int64{6, 4, 16, 32}}, // an edge chunk sticks out of the array
	} {
		name := fmt.Sprintf("chunks %v start %v count %v", tc.chunks, tc.start, tc.count)
		files := map[string][]byte{"zarr.json": []byte(fmt.Sprintf(`{"zarr_format":3,"node_type":"array","shape":[8,4,16,32],"data_type":"float32",
	"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[%d,%d,%d,%d]}},
	"chunk_key_encoding":{"name":"default"},"fill_value":0,
	"codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1}}]}`,
			tc.chunks[0], tc.chunks[1], tc.chunks[2], tc.chunks[3]))}
		rng := rand.New(rand.NewPCG(1, 2))
		unit := 4 * tc.chunks[0] * tc.chunks[1] * tc.chunks[2] * tc.chunks[3]
		for c0 := int64(0); c0*tc.chunks[0] < shape[0]; c0++ {
			for c1 := int64(0); c1*tc.chunks[1] < shape[1]; c1++ {
				for c2 := int64(0); c2*tc.chunks[2] < shape[2]; c2++ {
					for c3 := int64(0); c3*tc.chunks[3] < shape[3]; c3++ {
						raw := make([]byte, unit)
						for i := range raw {
							raw[i] = byte(rng.Uint32())
						}
						files[fmt.Sprintf("c/%d/%d/%d/%d", c0, c1, c2, c3)] = enc.EncodeAll(raw, nil)
					}
				}
			}
		}
		stats := &zarr.Stats{}
		h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{ChunkCacheBytes: -1, Stats: stats})
		if err != nil {
			t.Fatal(err)
		}
		a := h.Arrays[0]
		dst := make([]byte, 4*tc.count[0]*tc.count[1]*tc.count[2]*tc.count[3])
		if err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: tc.start, Count: tc.count, Dst: dst}}); err != nil {
			t.Fatal(err)
		}
		h.Close()
		// Every byte of the region was decoded in place or copied.
		inPlace := int64(len(dst)) - stats.BytesAssembled.Load()
		if got := a.ReadCost(tc.start, tc.count) - a.ReadCostInto(tc.start, tc.count); got != inPlace {
			t.Errorf("%s: ReadCostInto takes %d bytes off ReadCost (%d chunks), the Read decoded %d in place (%d chunks)",
				name, got, got/unit, inPlace, inPlace/unit)
		}
	}
}

// A chunk read in part, with the decoded-chunk cache off (or the chunk
// larger than it), goes back to the lender (Options.Host): nothing keeps
// it, and a second Read reuses it.
func TestPartlyReadChunkBackToTheLender(t *testing.T) {
	const n, chunks = 64 << 10, 8 // uint8 values per chunk
	enc, _ := zstd.NewWriter(nil)
	files := map[string][]byte{"zarr.json": []byte(fmt.Sprintf(`{"zarr_format":3,"node_type":"array","shape":[%d],"data_type":"uint8",
	"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[%d]}},"chunk_key_encoding":{"name":"default"},"fill_value":0,
	"codecs":[{"name":"bytes"},{"name":"zstd","configuration":{"level":1}}]}`, n*chunks, n))}
	for c := range chunks {
		raw := make([]byte, n)
		for i := range raw {
			raw[i] = byte(c + i)
		}
		files[fmt.Sprintf("c/%d", c)] = enc.EncodeAll(raw, nil)
	}
	for _, cacheBytes := range []int64{-1, n / 2} { // off; smaller than a chunk
		arena := memory.NewArena(64 << 20)
		h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{ChunkCacheBytes: cacheBytes, Host: arena})
		if err != nil {
			t.Fatal(err)
		}
		a := h.Arrays[0]
		dst := make([]byte, chunks*n/2)
		reqs := make([]zarr.Request, chunks)
		for c := range chunks {
			reqs[c] = zarr.Request{Array: a, Start: []int64{int64(c*n + n/2)}, Count: []int64{n / 2}, Dst: dst[c*n/2 : (c+1)*n/2]}
		}
		var first int64
		for round := range 3 {
			if err := h.Read(context.Background(), nil, reqs); err != nil {
				t.Fatal(err)
			}
			for c := range chunks {
				if got, want := dst[c*n/2], byte(c+n/2); got != want {
					t.Fatalf("cache %d round %d chunk %d: %d, want %d", cacheBytes, round, c, got, want)
				}
			}
			mapped, idle := arena.Held()
			if mapped != idle {
				t.Errorf("cache %d round %d: %d bytes still lent after the Read", cacheBytes, round, mapped-idle)
			}
			if round == 0 {
				first = mapped
			} else if mapped != first {
				t.Errorf("cache %d round %d: %d bytes mapped, %d after the first Read: the decoded chunks were not lent again", cacheBytes, round, mapped, first)
			}
		}
		if first < chunks*n {
			t.Errorf("cache %d: %d bytes mapped for %d chunks of %d bytes: not decoded into the lender's memory", cacheBytes, first, chunks, n)
		}
		h.Close()
		arena.Close()
	}
}

// Concurrent Reads over a decoded-chunk cache too small for their chunks,
// in lent memory: each reads the right values (a chunk evicted while
// another Read copies from it is not lent again under that Read), and once
// the Hierarchy is closed everything lent is back.
func TestConcurrentReadsHoldTheirChunks(t *testing.T) {
	const n, chunks = 64 << 10, 16
	enc, _ := zstd.NewWriter(nil)
	files := map[string][]byte{"zarr.json": []byte(fmt.Sprintf(`{"zarr_format":3,"node_type":"array","shape":[%d],"data_type":"uint8",
	"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[%d]}},"chunk_key_encoding":{"name":"default"},"fill_value":0,
	"codecs":[{"name":"bytes"},{"name":"zstd","configuration":{"level":1}}]}`, n*chunks, n))}
	value := func(i int) byte { return byte(i*7 + i/n) }
	for c := range chunks {
		raw := make([]byte, n)
		for i := range raw {
			raw[i] = value(c*n + i)
		}
		files[fmt.Sprintf("c/%d", c)] = enc.EncodeAll(raw, nil)
	}
	arena := memory.NewArena(64 << 20)
	defer arena.Close()
	h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{ChunkCacheBytes: 3 * n, Host: arena})
	if err != nil {
		t.Fatal(err)
	}
	a := h.Arrays[0]
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 60 {
				start := r.IntN(n*chunks - 1)
				count := 1 + r.IntN(min(n*chunks-start, 3*n/2))
				dst := make([]byte, count)
				if err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: []int64{int64(start)}, Count: []int64{int64(count)}, Dst: dst}}); err != nil {
					t.Error(err)
					return
				}
				for i, v := range dst {
					if v != value(start+i) {
						t.Errorf("element %d: %d, want %d", start+i, v, value(start+i))
						return
					}
				}
			}
		})
	}
	wg.Wait()
	h.Close()
	if mapped, idle := arena.Held(); mapped != idle {
		t.Errorf("%d bytes still lent once the Reads ended and the Hierarchy closed", mapped-idle)
	}
}
