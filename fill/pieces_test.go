package fill

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// memWriter is an io.WriterAt into a byte slice.
type memWriter []byte

func (m memWriter) WriteAt(p []byte, off int64) (int, error) { return copy(m[off:], p), nil }

// Pieces, wherever the cut falls, assemble the same bytes as one read, and
// every piece respects the byte bound when any cut can.
func TestPiecesMatchOneRead(t *testing.T) {
	for _, tt := range []struct {
		name          string
		shape, chunks []int64
		start, count  []int64
		maxBytes      int64
	}{
		{"outer axis", []int64{23, 4}, []int64{5, 4}, []int64{0, 0}, []int64{23, 4}, 80},
		{"second axis", []int64{2, 3, 17, 5}, []int64{1, 2, 4, 5}, []int64{1, 0, 0, 0}, []int64{1, 3, 17, 5}, 160},
		{"row too large: third axis", []int64{6, 3, 10, 12}, []int64{4, 2, 3, 4}, []int64{5, 0, 0, 0}, []int64{1, 3, 10, 12}, 2 * 3 * 12 * 4},
		{"one cell per piece", []int64{6, 3, 10, 12}, []int64{4, 2, 3, 4}, []int64{2, 0, 0, 0}, []int64{1, 3, 10, 12}, 4},
		{"unaligned region", []int64{9, 11, 13}, []int64{2, 3, 4}, []int64{1, 2, 3}, []int64{7, 8, 9}, 100},
		{"whole", []int64{4, 4}, []int64{2, 2}, []int64{0, 0}, []int64{4, 4}, 1 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := &zarr.Array{Path: "a", Shape: tt.shape, Chunks: tt.chunks, DType: f32}
			r := &indexReader{}
			f := newFiller(t, Options{Reader: r, SlabBytes: tt.maxBytes})
			n := prod(tt.count) * 4
			got := make(memWriter, 64+n)
			if err := (run{Filler: f, r: r}).readRegion(context.Background(), got, 64, a, tt.start, tt.count); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, n)
			fillIndex(zarr.Request{Array: a, Start: tt.start, Count: tt.count, Dst: want})
			if !bytes.Equal(got[64:], want) {
				t.Fatalf("pieces differ from one read (%d reads)", len(r.reqs))
			}
			cells := int64(1)
			for d := range tt.shape {
				cells *= tt.chunks[d]
			}
			for _, q := range r.reqs {
				if b := prod(q.Count) * 4; b > max(tt.maxBytes, cells*4) {
					t.Errorf("piece %v+%v holds %d bytes, bound %d", q.Start, q.Count, b, tt.maxBytes)
				}
				for d := range q.Start {
					// Every piece is aligned to the chunk grid: it starts on a
					// boundary or at the region's start, and ends on one or
					// at the region's end.
					if q.Start[d] != tt.start[d] && q.Start[d]%tt.chunks[d] != 0 {
						t.Errorf("piece %v+%v is not cut at chunk boundaries", q.Start, q.Count)
					}
					if e := q.Start[d] + q.Count[d]; e != tt.start[d]+tt.count[d] && e%tt.chunks[d] != 0 {
						t.Errorf("piece %v+%v is not cut at chunk boundaries", q.Start, q.Count)
					}
				}
			}
		})
	}
}

// absurdStore writes a store whose array t has samples of 3 x 100,000 x
// 100,000 float32 (120 GB) in chunks of 4 x 2 x 8 x 16, and no chunk at all.
func absurdStore(t *testing.T, shape, chunks []int64) *zarr.Hierarchy {
	t.Helper()
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, nil)
	doc := `{"zarr_format":3,"node_type":"array","shape":` + jsonInts(shape) + `,"data_type":"float32",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":` + jsonInts(chunks) + `}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1,"checksum":false}}],
"fill_value":1.5,"dimension_names":["time","level","latitude","longitude"],"attributes":{}}`
	if err := os.MkdirAll(filepath.Join(dir, "t"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "t", "zarr.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	h, err := zarr.Open(context.Background(), st, zarr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func jsonInts(s []int64) string {
	b := []byte{'['}
	for i, x := range s {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, []byte(itoa(x))...)
	}
	return string(append(b, ']'))
}

func itoa(x int64) string {
	if x == 0 {
		return "0"
	}
	var d []byte
	for ; x > 0; x /= 10 {
		d = append([]byte{byte('0' + x%10)}, d...)
	}
	return string(d)
}

// A sample whose chunk row along its first long axis is 80 GB (the store
// of the issue) is planned in pieces of at most SlabBytes; it is never
// allocated whole.
func TestPlanAbsurdChunkRow(t *testing.T) {
	h := absurdStore(t, []int64{30, 3, 100000, 100000}, []int64{4, 2, 8, 16})
	a := h.Array("t")
	f := newFiller(t, Options{})
	p := planPieces(a, []int64{0, 0, 0, 0}, []int64{1, 3, 100000, 100000}, f.pieceBytes(), f.pieceCost())
	if p.bytes > f.o.SlabBytes || p.cost > f.pieceCost() {
		t.Fatalf("plan: axis %d steps %v, %d bytes, cost %d; want at most %d and %d", p.axis, p.steps, p.bytes, p.cost, f.o.SlabBytes, f.pieceCost())
	}
}

// Filling a sample of 120 MB whose chunk row is 80 MB, with a 16 MiB
// budget, streams it in pieces: the fill allocates far less than the row,
// holds no more than the budget, and writes the right values.
func TestFillStreamsWithinBudget(t *testing.T) {
	h := absurdStore(t, []int64{30, 3, 100, 100000}, []int64{4, 2, 8, 50000})
	budget := memory.New(128 << 20)
	l, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := newFiller(t, Options{MemoryBudget: budget})
	b := mustLookup(t, l, "t/00.npy")
	out := make(memWriter, b.Size())
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := f.Fill(context.Background(), l, b, nil, out); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("fill of %d MB: %d MiB allocated, budget peak %d MiB", b.Size()>>20, alloc>>20, budget.Peak()>>20)
	if alloc > 48<<20 {
		t.Errorf("fill allocated %d MiB (the chunk row is 80 MB)", alloc>>20)
	}
	if budget.Peak() == 0 || budget.Peak() > budget.Total() || budget.Used() != 0 {
		t.Errorf("budget peak %d, used %d after the fill", budget.Peak(), budget.Used())
	}
	want := []byte{0, 0, 0xc0, 0x3f} // 1.5 as little-endian float32
	for off := int64(4096); off < b.Size(); off += 4096 * 1021 {
		if !bytes.Equal(out[off:off+4], want) {
			t.Fatalf("value at %d: %x", off, out[off:off+4])
		}
	}
}

// A fill that needs more memory than the whole budget, even in pieces (one
// chunk is larger), fails with memory.ErrExceeded before it allocates.
func TestFillBeyondBudgetFails(t *testing.T) {
	h := absurdStore(t, []int64{2, 1, 2048, 2048}, []int64{1, 1, 2048, 2048})
	l, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustLookup(t, l, "t/0.npy")
	err = newFiller(t, Options{MemoryBudget: memory.New(8 << 20)}).Fill(context.Background(), l, b, nil, make(memWriter, b.Size()))
	if !errors.Is(err, memory.ErrExceeded) {
		t.Fatalf("fill: %v, want ErrExceeded", err)
	}
}

// A sharded array is cut along its inner chunks, which a Read decodes one
// by one, not its shards: a 256 MiB shard of 1 MiB chunks fills in pieces
// within the limits.
func TestPlanShardedAlongInnerChunks(t *testing.T) {
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, nil)
	doc := `{"zarr_format":3,"node_type":"array","shape":[8192,8192],"data_type":"float32",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[8192,8192]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"codecs":[{"name":"sharding_indexed","configuration":{"chunk_shape":[512,512],
  "codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1,"checksum":false}}],
  "index_codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"crc32c"}],"index_location":"end"}}],
"fill_value":0,"dimension_names":["latitude","longitude"],"attributes":{}}`
	if err := os.MkdirAll(filepath.Join(dir, "s"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "s", "zarr.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	h, err := zarr.Open(context.Background(), st, zarr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := h.Array("s")
	if a == nil {
		t.Fatal("no array s")
	}
	const maxBytes, maxCost = 64 << 20, 256 << 20
	p := planPieces(a, []int64{0, 0}, []int64{8192, 8192}, maxBytes, maxCost)
	if p.bytes > maxBytes || p.cost > maxCost || p.steps[p.axis]%512 != 0 {
		t.Errorf("plan: axis %d steps %v, %d bytes, cost %d; want at most %d and %d, cut on the 512 grid", p.axis, p.steps, p.bytes, p.cost, maxBytes, maxCost)
	}
}

// A sharded array's pieces are cut on its inner grid, so a piece may
// straddle a shard boundary that the piece at 0 does not: the plan's cost
// bounds every piece's read wherever its cuts fall against the shards.
func TestPlanCostBoundsShardedPieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, nil)
	type sharded struct{ shape, shard, inner []int64 }
	var arrays []sharded
	for i := range 100 {
		rank := 1 + rng.IntN(2)
		s := sharded{make([]int64, rank), make([]int64, rank), make([]int64, rank)}
		for d := range rank {
			s.inner[d] = 1 + rng.Int64N(3)
			s.shard[d] = s.inner[d] * (1 + rng.Int64N(4))
			s.shape[d] = 1 + rng.Int64N(24)
		}
		arrays = append(arrays, s)
		doc := fmt.Sprintf(`{"zarr_format":3,"node_type":"array","shape":%s,"data_type":"float32",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":%s}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"codecs":[{"name":"sharding_indexed","configuration":{"chunk_shape":%s,
  "codecs":[{"name":"bytes","configuration":{"endian":"little"}}],
  "index_codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"crc32c"}],"index_location":"end"}}],
"fill_value":0,"attributes":{}}`, jsonInts(s.shape), jsonInts(s.shard), jsonInts(s.inner))
		sub := filepath.Join(dir, "s"+itoa(int64(i)))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, "zarr.json"), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := viewtest.OpenStore(t, dir, zarr.Options{})
	defer h.Close()
	straddles := 0 // plans with a piece that costs more than the piece at 0
	for i, sa := range arrays {
		a := h.Array("s" + itoa(int64(i)))
		if a == nil {
			t.Fatalf("no array s%d", i)
		}
		for range 50 {
			start, count := randomRegion(rng, sa.shape, false)
			p := planPieces(a, start, count, int64(4<<rng.IntN(5)), 1<<20)
			most := mostHeld(t, a, p, start, count)
			if most > p.cost {
				t.Fatalf("shape %v shards %v inner %v region %v+%v, plan axis %d steps %v: cost %d, a piece holds %d",
					sa.shape, sa.shard, sa.inner, start, count, p.axis, p.steps, p.cost, most)
			}
			if p.axis >= 0 && most > p.bytes+aligned(a, start, count, p) {
				straddles++
			}
		}
	}
	if straddles < 100 {
		t.Fatalf("%d plans with a piece costlier than the piece at 0: the cases prove little", straddles)
	}
}

// runsAt records where each write of writePiece lands.
type runsAt struct{ offs, lens []int64 }

func (w *runsAt) WriteAt(p []byte, off int64) (int, error) {
	w.offs, w.lens = append(w.offs, off), append(w.lens, int64(len(p)))
	return len(p), nil
}

// contiguous says exactly when every piece of a plan lands in the region's
// C-order output as one run at offsetIn, the one place a piece read
// straight into the output goes: over regions of arrays of every rank up
// to 4, cut at every bound, each piece writePiece writes is one write at
// that offset where contiguous holds, and some piece is several where it
// does not. Read into FillInto's buffer, each such region's pieces go
// straight there, one Read a piece; the others through a piece buffer.
func TestPiecesContiguous(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var many, no int // plans of several contiguous pieces, plans not contiguous
	for range 20000 {
		rank := 1 + rng.IntN(4)
		shape, chunks, start, count := make([]int64, rank), make([]int64, rank), make([]int64, rank), make([]int64, rank)
		for d := range rank {
			shape[d] = 1 + rng.Int64N(9)
			chunks[d] = 1 + rng.Int64N(shape[d])
			start[d] = rng.Int64N(shape[d])
			count[d] = 1 + rng.Int64N(shape[d]-start[d])
			if rng.IntN(3) == 0 {
				count[d] = 1 // a sample's axis
			}
		}
		a := &zarr.Array{Path: "a", Shape: shape, Chunks: chunks, DType: f32}
		limit := 4 << rng.IntN(5)
		p := planPieces(a, start, count, int64(limit), int64(4*limit))
		stride := strides(count, 4)
		one, n := true, 0
		err := p.pieces(start, count, func(ps, pc []int64) error {
			n++
			w := &runsAt{}
			if err := writePiece(w, 0, start, count, ps, pc, p.axis, 4, make([]byte, 4*prod(pc))); err != nil {
				return err
			}
			one = one && len(w.offs) == 1 && w.offs[0] == offsetIn(stride, start, ps)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if one != p.contiguous(start, count) {
			t.Fatalf("shape %v chunks %v region %v+%v, plan axis %d steps %v: pieces one run each %v, contiguous says %v",
				shape, chunks, start, count, p.axis, p.steps, one, !one)
		}
		// Read into FillInto's buffer (after an 8-byte header), the region
		// is right, and a piece buffer is lent only where a piece is not
		// one run.
		mem := &lendingMemory{out: map[*byte]int{}}
		r := &indexReader{}
		f := newFiller(t, Options{Reader: r, SlabBytes: int64(limit), Memory: mem})
		got := make([]byte, 4*prod(count))
		if err := (run{Filler: f, r: r}).readRegion(context.Background(), dataWriter{got, 8}, 8, a, start, count); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, len(got))
		fillIndex(zarr.Request{Array: a, Start: start, Count: count, Dst: want})
		if !bytes.Equal(got, want) || (mem.lends == 0) != one || len(r.reqs) != n {
			t.Fatalf("shape %v chunks %v region %v+%v: bytes right %v, %d buffers lent, %d reads of %d pieces",
				shape, chunks, start, count, bytes.Equal(got, want), mem.lends, len(r.reqs), n)
		}
		switch {
		case !one:
			no++
		case n > 1:
			many++
		}
	}
	if many < 500 || no < 500 {
		t.Fatalf("%d plans of several contiguous pieces and %d not contiguous: the cases prove little", many, no)
	}
}

// A plan's cost bounds what the Read of every one of its pieces holds, the
// region's edge pieces included (off the grid, or cutting a chunk at the
// array's edge): 200 arrays of random shapes and chunks, 50 regions each.
func TestPlanCostBoundsEveryPiece(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	dir := t.TempDir()
	var arrays []storeArray
	for i := range 200 {
		rank := 1 + rng.IntN(4)
		shape, chunks := make([]int64, rank), make([]int64, rank)
		dims := make([]string, rank)
		for d := range rank {
			shape[d] = 1 + rng.Int64N(9)
			chunks[d] = 1 + rng.Int64N(shape[d])
			dims[d] = "d" + itoa(int64(d))
		}
		arrays = append(arrays, storeArray{Path: "a" + itoa(int64(i)), DType: "float32", Shape: shape, Chunks: chunks, Dims: dims, Value: func([]int64) float64 { return 0 }})
	}
	viewtest.WriteStore(t, dir, arrays)
	h := viewtest.OpenStore(t, dir, zarr.Options{})
	defer h.Close()
	edges := 0 // plans whose edge pieces cost more than a full piece at 0
	for _, sa := range arrays {
		a := h.Array(sa.Path)
		for range 50 {
			start, count := randomRegion(rng, sa.Shape, true)
			limit := int64(4 << rng.IntN(5))
			p := planPieces(a, start, count, limit, 1<<20)
			most := mostHeld(t, a, p, start, count)
			if most > p.cost {
				t.Fatalf("shape %v chunks %v region %v+%v, plan axis %d steps %v: cost %d, a piece holds %d",
					sa.Shape, sa.Chunks, start, count, p.axis, p.steps, p.cost, most)
			}
			if p.axis >= 0 && most > p.bytes+aligned(a, start, count, p) {
				edges++
			}
		}
	}
	if edges < 300 {
		t.Fatalf("%d plans whose edge pieces cost more than a full piece at 0: the cases prove little", edges)
	}
}

// randomRegion is a random region of an array shaped shape; thin makes a
// third of its extents one element.
func randomRegion(rng *rand.Rand, shape []int64, thin bool) (start, count []int64) {
	start, count = make([]int64, len(shape)), make([]int64, len(shape))
	for d := range shape {
		start[d] = rng.Int64N(shape[d])
		count[d] = 1 + rng.Int64N(shape[d]-start[d])
		if thin && rng.IntN(3) == 0 {
			count[d] = 1
		}
	}
	return start, count
}

// mostHeld is the most any piece of plan p of a float32 region holds: its
// bytes and what its Read holds. It checks the plan's count of pieces too.
func mostHeld(t *testing.T, a *zarr.Array, p piecePlan, start, count []int64) int64 {
	t.Helper()
	var most, n int64
	if err := p.pieces(start, count, func(ps, pc []int64) error {
		most = max(most, 4*prod(pc)+a.ReadCostInto(ps, pc))
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c := p.count(start, count); c != n {
		t.Fatalf("region %v+%v, plan axis %d steps %v: %d pieces, count says %d", start, count, p.axis, p.steps, n, c)
	}
	return most
}

// aligned is what the Read of the plan's full piece at 0 holds.
func aligned(a *zarr.Array, start, count []int64, p piecePlan) int64 {
	ps, pc := append([]int64(nil), start...), append([]int64(nil), count...)
	for i := 0; i <= p.axis; i++ {
		ps[i], pc[i] = 0, min(p.steps[i], count[i])
	}
	return a.ReadCostInto(ps, pc)
}
