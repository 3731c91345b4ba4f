package zarr_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"strconv"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/zarr"
)

// stepStore is a v3 array (time 6, y 3, x 5) of uint16, zstd, chunked
// chunk: a chunk of several time steps, as stores written for analysis
// often are. Element (t, y, x) is t*100 + y*10 + x.
func stepStore(t testing.TB, endian string, chunk [3]int) map[string][]byte {
	enc, _ := zstd.NewWriter(nil)
	files := map[string][]byte{"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":[6,3,5],"data_type":"uint16",
	"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[` + strconv.Itoa(chunk[0]) + `,` + strconv.Itoa(chunk[1]) + `,` + strconv.Itoa(chunk[2]) + `]}},
	"chunk_key_encoding":{"name":"default"},"fill_value":0,
	"codecs":[{"name":"bytes","configuration":{"endian":"` + endian + `"}},{"name":"zstd","configuration":{"level":1}}]}`)}
	for c0 := 0; c0 < 6; c0 += chunk[0] {
		for c1 := 0; c1 < 3; c1 += chunk[1] {
			for c2 := 0; c2 < 5; c2 += chunk[2] {
				raw := make([]byte, 0, 2*chunk[0]*chunk[1]*chunk[2])
				for ti := c0; ti < c0+chunk[0]; ti++ {
					for y := c1; y < c1+chunk[1]; y++ {
						for x := c2; x < c2+chunk[2]; x++ {
							v := uint16(ti*100 + y*10 + x)
							if endian == "big" {
								raw = binary.BigEndian.AppendUint16(raw, v)
							} else {
								raw = binary.LittleEndian.AppendUint16(raw, v)
							}
						}
					}
				}
				key := "c/" + strconv.Itoa(c0/chunk[0]) + "/" + strconv.Itoa(c1/chunk[1]) + "/" + strconv.Itoa(c2/chunk[2])
				files[key] = enc.EncodeAll(raw, nil)
			}
		}
	}
	return files
}

// placing decodes each job offered a Place on the CPU into a buffer of its
// own and writes the ranges where they go itself, as a GPU decoding into a
// ring slot does, and scribbles over Dst, which the reader must then not
// read; jobs without a Place it decodes as Inline does.
type placing struct{ offered, placed int }

// Places asks for Place (codec.Placer).
func (p *placing) Places() bool { return true }

func (p *placing) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	for i := range jobs {
		j := &jobs[i]
		if len(j.Place) == 0 {
			if err := (codec.Inline{}).DecodeBatch(ctx, jobs[i:i+1]); err != nil {
				return err
			}
			continue
		}
		p.offered++
		own := []codec.Job{{Codec: j.Codec, Src: j.Src, Dst: make([]byte, len(j.Dst))}}
		if err := (codec.Inline{}).DecodeBatch(ctx, own); err != nil {
			return err
		}
		if j.Err = own[0].Err; j.Err != nil {
			continue
		}
		for _, s := range j.Place {
			copy(s.Dst, own[0].Dst[s.Off:])
		}
		for k := range j.Dst {
			j.Dst[k] = 0xEE
		}
		j.Placed = true
		p.placed++
	}
	return nil
}

// A chunk of several time steps of which a Read takes a few, each step a
// run in the chunk and in its request, is offered to the decoder with
// where each step goes (codec.Job.Place); one that writes them there
// itself leaves the reader nothing to copy, and nothing of the chunk is
// kept for the next Read, whose steps are then right too (the decoded
// bytes the reader holds were never written). A chunk whose needed part
// is no run in its request (a sample cut along x), or whose bytes need a
// swap, is offered no Place.
func TestDecodePlaced(t *testing.T) {
	for _, tc := range []struct {
		name    string
		endian  string
		chunk   [3]int
		offered bool
	}{
		{"steps", "little", [3]int{3, 3, 5}, true},
		{"steps and rows", "little", [3]int{3, 2, 5}, true},
		{"cut along x", "little", [3]int{3, 3, 2}, false},
		{"big-endian", "big", [3]int{3, 3, 5}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := zarr.Open(context.Background(), newMemStore(stepStore(t, tc.endian, tc.chunk)), zarr.Options{ChunkCacheBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			a := h.Arrays[0]
			const per = 3 * 5 * 2
			read := func(r zarr.Reader, steps ...int) {
				t.Helper()
				buf := make([]byte, len(steps)*per)
				var reqs []zarr.Request
				for i, s := range steps {
					reqs = append(reqs, zarr.Request{Array: a, Start: []int64{int64(s), 0, 0}, Count: []int64{1, 3, 5}, Dst: buf[i*per : (i+1)*per]})
				}
				if err := r.Read(context.Background(), nil, reqs); err != nil {
					t.Fatal(err)
				}
				for i, s := range steps {
					for e := range 15 {
						got := binary.LittleEndian.Uint16(buf[i*per+2*e:])
						if want := uint16(s*100 + e/5*10 + e%5); got != want {
							t.Fatalf("step %d element %d: %d, want %d", s, e, got, want)
						}
					}
				}
			}
			p := &placing{}
			read(h.Decoding(p), 1, 2)
			if got := p.offered > 0; got != tc.offered {
				t.Fatalf("chunks offered a Place: %d, want some: %v", p.offered, tc.offered)
			}
			// Step 0 is in the first chunk too: read it plainly, and again
			// through the placing decoder, with steps of the next chunk.
			read(h, 0)
			read(h.Decoding(p), 0, 3, 4)
			if tc.offered && p.placed != p.offered {
				t.Fatalf("%d chunks offered a Place, %d placed", p.offered, p.placed)
			}
		})
	}
}

// The same Read through a placing decoder and Read fill the same bytes.
func TestDecodePlacedMatchesRead(t *testing.T) {
	h, err := zarr.Open(context.Background(), newMemStore(stepStore(t, "little", [3]int{4, 2, 5})), zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a := h.Arrays[0]
	for start := range 6 {
		for n := 1; start+n <= 6; n++ {
			want, got := make([]byte, n*30), make([]byte, n*30)
			req := func(dst []byte) []zarr.Request {
				return []zarr.Request{{Array: a, Start: []int64{int64(start), 0, 0}, Count: []int64{int64(n), 3, 5}, Dst: dst}}
			}
			if err := h.Read(context.Background(), nil, req(want)); err != nil {
				t.Fatal(err)
			}
			if err := h.Decoding(&placing{}).Read(context.Background(), nil, req(got)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("steps %d+%d: placed %x, read %x", start, n, got, want)
			}
		}
	}
}

// A walk over the steps in order places a chunk of several steps once:
// its next step finds the chunk's ghost, so that Read decodes it where the
// decoded-chunk cache keeps it, and the steps after are read from the
// cache; without a cache, every step's Read places the chunk again. A
// chunk read again only after its ghost has gone (other chunks placed
// since filled the cache's bytes) is placed again.
func TestDecodePlacedGhost(t *testing.T) {
	for _, tc := range []struct {
		cache   int64
		offered int // of 6 steps in order, chunks of 3
		decoded int64
	}{{1 << 20, 2, 4}, {-1, 6, 6}} {
		stats := &zarr.Stats{}
		h, err := zarr.Open(context.Background(), newMemStore(stepStore(t, "little", [3]int{3, 3, 5})), zarr.Options{ChunkCacheBytes: tc.cache, Stats: stats})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		p := &placing{}
		buf := make([]byte, 30)
		for s := range 6 {
			if err := h.Decoding(p).Read(context.Background(), nil, []zarr.Request{{Array: h.Arrays[0], Start: []int64{int64(s), 0, 0}, Count: []int64{1, 3, 5}, Dst: buf}}); err != nil {
				t.Fatal(err)
			}
			if got := binary.LittleEndian.Uint16(buf[2*7:]); got != uint16(s*100+12) {
				t.Fatalf("cache %d, step %d: element 7 is %d", tc.cache, s, got)
			}
		}
		if p.offered != tc.offered || stats.ChunksDecoded.Load() != tc.decoded {
			t.Fatalf("cache %d: %d chunks offered a Place, %d decoded; want %d and %d", tc.cache, p.offered, stats.ChunksDecoded.Load(), tc.offered, tc.decoded)
		}
	}
	// A cache of two steps' bytes: the ghosts of chunks 0 and 1 (90 bytes
	// each) do not fit together, so chunk 0's is gone when it comes back.
	h, err := zarr.Open(context.Background(), newMemStore(stepStore(t, "little", [3]int{3, 3, 5})), zarr.Options{ChunkCacheBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p := &placing{}
	buf := make([]byte, 30)
	for _, s := range []int{0, 3, 1} {
		if err := h.Decoding(p).Read(context.Background(), nil, []zarr.Request{{Array: h.Arrays[0], Start: []int64{int64(s), 0, 0}, Count: []int64{1, 3, 5}, Dst: buf}}); err != nil {
			t.Fatal(err)
		}
	}
	if p.offered != 3 {
		t.Fatalf("steps 0, 3, 1 with room for one ghost: %d chunks offered a Place, want 3", p.offered)
	}
}

// offered decodes inline and counts the jobs offered a Place.
type offered struct{ n int }

func (o *offered) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	for _, j := range jobs {
		if len(j.Place) > 0 {
			o.n++
		}
	}
	return codec.Inline{}.DecodeBatch(ctx, jobs)
}

// A decoder that does not say it places (codec.Placer) is offered no
// Place: the reader spares it the bookkeeping, and copies as ever.
func TestDecodeOffersPlaceToPlacersOnly(t *testing.T) {
	h, err := zarr.Open(context.Background(), newMemStore(stepStore(t, "little", [3]int{3, 3, 5})), zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	o := &offered{}
	buf := make([]byte, 30)
	if err := h.Decoding(o).Read(context.Background(), nil, []zarr.Request{{Array: h.Arrays[0], Start: []int64{1, 0, 0}, Count: []int64{1, 3, 5}, Dst: buf}}); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint16(buf[2*7:]); got != 112 || o.n != 0 {
		t.Fatalf("element 7 of step 1: %d (want 112); %d jobs offered a Place (want 0)", got, o.n)
	}
}
