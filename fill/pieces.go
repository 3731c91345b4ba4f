package fill

import (
	"context"
	"fmt"
	"io"

	"github.com/zarrfs/zarrfs/zarr"
)

// A region too large to hold in memory at once is read in pieces: boxes
// aligned to the chunk grid, so that every chunk lands in exactly one piece
// and is decoded once per fill. A piece spans one chunk cell along each
// axis before the split axis, a run of chunk cells along the split axis,
// and the whole region along the axes after it, so it lands in the output
// as runs that are contiguous there. The split axis is the outermost one
// that keeps a piece within the limits; a store whose sample holds a chunk
// row of 80 GB (shape [30, 3, 1e5, 1e5], chunks [4, 2, 8, 16]) is then read
// in pieces of at most SlabBytes instead of being allocated whole. A piece
// is read into a buffer of the fill's and written from there, unless the
// output is memory the region may be read straight into (FillInto's) and
// every piece lands there as one run (a sample's levels, chunked a level
// a chunk): each piece is then read into its part of the output.

// piecePlan says how a region is cut.
type piecePlan struct {
	axis  int     // split axis; -1: the region is one piece (rank 0)
	steps []int64 // piece extent along each axis <= axis, aligned in array coordinates
	bytes int64   // the largest piece's bytes
	cost  int64   // the largest piece's bytes plus the memory its Read holds
}

// planPieces cuts the region [start, start+count) of a into pieces of at
// most maxBytes whose bytes and read cost stay within maxCost, where any
// cut can. When not even one chunk cell fits, pieces are single chunk
// cells: the caller then checks plan.cost against its memory budget.
func planPieces(a *zarr.Array, start, count []int64, maxBytes, maxCost int64) piecePlan {
	rank := len(count)
	itemsize := int64(a.DType.Size)
	if rank == 0 {
		return piecePlan{axis: -1, bytes: itemsize, cost: itemsize + a.ReadCostInto(start, count)}
	}
	// Cuts follow the grid a Read decodes by (a sharded array's inner
	// chunks, not its shards).
	grid := a.ReadGrid()
	steps := make([]int64, rank)
	measure := func(axis int) (bytes, cost int64) {
		bytes = satMul(prod(count[axis+1:]), itemsize)
		for i := 0; i <= axis; i++ {
			bytes = satMul(bytes, min(steps[i], count[i]))
		}
		// A piece is read as one request into its own buffer: chunks
		// that land there whole decode in place (zarr.ReadCostInto).
		return bytes, satAdd(bytes, pieceCost(a, start, count, steps, axis))
	}
	for axis := range rank {
		for i := 0; i < axis; i++ {
			steps[i] = grid[i]
		}
		ch := grid[axis]
		steps[axis] = ch
		bytes, cost := measure(axis)
		if bytes > maxBytes || cost > maxCost {
			continue
		}
		// Grow the run along the split axis as far as the limits allow.
		lo, hi := int64(1), (count[axis]+ch-1)/ch+1
		for lo < hi {
			k := lo + (hi-lo+1)/2
			steps[axis] = k * ch
			if b, c := measure(axis); b <= maxBytes && c <= maxCost {
				lo = k
			} else {
				hi = k - 1
			}
		}
		steps[axis] = lo * ch
		bytes, cost = measure(axis)
		return piecePlan{axis: axis, steps: steps, bytes: bytes, cost: cost}
	}
	axis := rank - 1
	for i := range rank {
		steps[i] = grid[i]
	}
	bytes, cost := measure(axis)
	return piecePlan{axis: axis, steps: steps, bytes: bytes, cost: cost}
}

// pieceCost is the most memory the Read of any piece of the region holds
// (zarr.ReadCostInto), the region cut along the axes up to axis at
// multiples of steps. Pieces are the product of their cuts along each
// axis, and a piece costs the more the more chunks it spans and the fewer
// land whole in it. Before the split axis a step is one chunk cell, so
// every piece spans one chunk there, and one that cuts a chunk (an edge
// piece of a region off the grid or at the array's edge) has none land
// whole: it costs its full ReadCost, at least what any piece spanning the
// same chunks elsewhere costs. Along those axes the worst cut is then an
// edge that cuts a chunk, if any, which serves every piece: three pieces
// bound them all, taking along the split axis the first cut, the last
// and a full one, so three ReadCostInto calls at most. A full piece spans
// the same inner cells wherever it starts, but a sharded array's pieces
// start at multiples of the step, not of the shard, and one may span a
// shard more than the piece at 0 (that shard's index and bookkeeping):
// the full one is priced where it spans the most (fullAt).
func pieceCost(a *zarr.Array, start, count, steps []int64, axis int) int64 {
	ps := append([]int64(nil), start...)
	pc := append([]int64(nil), count...)
	for i := range axis {
		ps[i], pc[i] = firstCut(start[i], count[i], steps[i])
		if pc[i] == steps[i] {
			ps[i], pc[i] = lastCut(start[i], count[i], steps[i])
		}
	}
	first, n := firstCut(start[axis], count[axis], steps[axis])
	last, m := lastCut(start[axis], count[axis], steps[axis])
	cuts := [][2]int64{{fullAt(steps[axis], a.Chunks[axis]), min(steps[axis], count[axis])}, {first, n}, {last, m}}
	if first == last {
		cuts = cuts[:2] // one cut along the split axis: the first is the last
	}
	var cost int64
	for _, c := range cuts {
		ps[axis], pc[axis] = c[0], c[1]
		cost = max(cost, a.ReadCostInto(ps, pc))
	}
	return cost
}

// fullAt is where a piece of step elements, cut at a multiple of step,
// spans the most chunks of extent chunk (a shard's, for a sharded array):
// piece starts fall at the multiples of gcd(step, chunk) within a chunk,
// and the latest of them, chunk-gcd, leaves the piece the most to cross.
// On an unsharded array steps are whole chunks, so it is 0.
func fullAt(step, chunk int64) int64 {
	g, r := step, chunk
	for r != 0 {
		g, r = r, g%r
	}
	return chunk - g
}

// firstCut is the first piece's start and count along an axis of the
// region start, count cut at multiples of step.
func firstCut(start, count, step int64) (int64, int64) {
	return start, min((start/step+1)*step, start+count) - start
}

// lastCut is the last piece's start and count along such an axis.
func lastCut(start, count, step int64) (int64, int64) {
	at := max((start+count-1)/step*step, start)
	return at, start + count - at
}

// count is the number of pieces of the region.
func (p piecePlan) count(start, count []int64) int64 {
	if p.axis < 0 {
		return 1
	}
	n := int64(1)
	for d := 0; d <= p.axis; d++ {
		n = satMul(n, (start[d]+count[d]-1)/p.steps[d]-start[d]/p.steps[d]+1)
	}
	return n
}

// pieces calls fn with the start and count of every piece, in C order.
func (p piecePlan) pieces(start, count []int64, fn func(ps, pc []int64) error) error {
	ps := append([]int64(nil), start...)
	pc := append([]int64(nil), count...)
	if p.axis < 0 {
		return fn(ps, pc)
	}
	var walk func(d int) error
	walk = func(d int) error {
		if d > p.axis {
			return fn(ps, pc)
		}
		end := start[d] + count[d]
		for at := start[d]; at < end; {
			next := min((at/p.steps[d]+1)*p.steps[d], end)
			ps[d], pc[d] = at, next-at
			if err := walk(d + 1); err != nil {
				return err
			}
			at = next
		}
		ps[d], pc[d] = start[d], count[d]
		return nil
	}
	return walk(0)
}

// writePiece writes a piece's C-order bytes (buf, shaped pc) to where they
// belong in the region's output at base: runs that are contiguous in both,
// merged where the output continues.
func writePiece(w io.WriterAt, base int64, start, count, ps, pc []int64, axis int, itemsize int64, buf []byte) error {
	if axis < 0 {
		_, err := w.WriteAt(buf, base)
		return err
	}
	stride := strides(count, itemsize)
	run := pc[axis] * stride[axis]
	var pendOff, pendBuf, pendLen int64 = 0, 0, 0
	flush := func() error {
		if pendLen == 0 {
			return nil
		}
		_, err := w.WriteAt(buf[pendBuf:pendBuf+pendLen], base+pendOff)
		return err
	}
	t := make([]int64, axis) // index within the piece along the axes before axis
	for pos := int64(0); pos < int64(len(buf)); pos += run {
		off := (ps[axis] - start[axis]) * stride[axis]
		for d := range axis {
			off += (ps[d] - start[d] + t[d]) * stride[d]
		}
		if pendLen > 0 && off == pendOff+pendLen {
			pendLen += run
		} else {
			if err := flush(); err != nil {
				return err
			}
			pendOff, pendBuf, pendLen = off, pos, run
		}
		for d := axis - 1; d >= 0; d-- {
			if t[d]++; t[d] < pc[d] {
				break
			}
			t[d] = 0
		}
	}
	return flush()
}

// strides is the byte strides of a C-order region of count elements of
// itemsize bytes.
func strides(count []int64, itemsize int64) []int64 {
	stride := make([]int64, len(count))
	s := itemsize
	for d := len(count) - 1; d >= 0; d-- {
		stride[d] = s
		s *= count[d]
	}
	return stride
}

// offsetIn is where a piece starting at ps begins in the C-order output of
// the region starting at start, whose byte strides are stride.
func offsetIn(stride, start, ps []int64) int64 {
	var off int64
	for d := range stride {
		off += (ps[d] - start[d]) * stride[d]
	}
	return off
}

// readRegion reads the region of a into w at base (Align), piece by piece,
// holding at most the plan's memory, acquired from the budget first.
func (r run) readRegion(ctx context.Context, w io.WriterAt, base int64, a *zarr.Array, start, count []int64) error {
	return r.readRegionAs(ctx, w, base, a, start, count, a.DType)
}

// readRegionAs is readRegion writing elements of type to (zarr.Cast): each
// piece is cast into a second buffer, which the budget is charged for too.
func (r run) readRegionAs(ctx context.Context, w io.WriterAt, base int64, a *zarr.Array, start, count []int64, to zarr.DType) error {
	if satMul(prod(count), int64(a.DType.Size)) == 0 {
		return nil
	}
	p, direct, castBytes := r.regionPlan(w, base, a, start, count, to)
	cast := !zarr.SameValues(a.DType, to)
	release, err := r.acquire(ctx, regionHolds(p, direct, castBytes), "region of array "+a.Path)
	if err != nil {
		return err
	}
	if direct != nil {
		// Each piece is read into its part of the output, one Read at a
		// time as into a piece buffer: chunks that land whole decode in
		// place there (on a GPU filling a ring slot, straight into the
		// slot).
		defer release()
		stride := strides(count, int64(a.DType.Size))
		return p.pieces(start, count, func(ps, pc []int64) error {
			off, n := offsetIn(stride, start, ps), prod(pc)*int64(a.DType.Size)
			return r.r.Read(ctx, r.pin, []zarr.Request{{Array: a, Start: ps, Count: pc, Dst: direct[off : off+n : off+n]}})
		})
	}
	defer release()
	buf := r.slab(p.bytes)
	defer r.freeSlab(buf)
	var out []byte
	if cast {
		out = r.scratch(castBytes)
		defer r.freeScratch(out)
	}
	return p.pieces(start, count, func(ps, pc []int64) error {
		n := prod(pc) * int64(a.DType.Size)
		dst := buf[:n]
		req := []zarr.Request{{Array: a, Start: ps, Count: pc, Dst: dst}}
		if err := r.r.Read(ctx, r.pin, req); err != nil {
			return err
		}
		if cast {
			m := prod(pc) * int64(to.Size)
			zarr.Cast(out[:m], to, dst, a.DType)
			dst = out[:m]
		}
		if err := writePiece(w, base, start, count, ps, pc, p.axis, int64(to.Size), dst); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	})
}

// bufferWriter is a writer over a buffer that a region may be read
// straight into (FillInto's dataWriter): buffer returns the part that
// the writer's bytes off..off+n are, or nil.
type bufferWriter interface {
	buffer(off, n int64) []byte
}

// regionPlan is how readRegionAs reads the region into w at base: its
// pieces; direct, the part of w's buffer that the region, of its own
// type, is read straight into, piece by piece, where every piece lands
// there as one run (contiguous; nil when w lends no buffer); and the
// bytes of its cast buffer. What the read holds is regionHolds.
func (r run) regionPlan(w io.WriterAt, base int64, a *zarr.Array, start, count []int64, to zarr.DType) (p piecePlan, direct []byte, castBytes int64) {
	p = planPieces(a, start, count, r.pieceBytes(), r.pieceCost())
	if !zarr.SameValues(a.DType, to) {
		return p, nil, p.bytes / int64(a.DType.Size) * int64(to.Size)
	}
	if bw, ok := w.(bufferWriter); ok && p.contiguous(start, count) {
		direct = bw.buffer(base, prod(count)*int64(a.DType.Size))
	}
	return p, direct, 0
}

// regionHolds is what readRegionAs holds under its regionPlan, besides
// w's buffer: the plan's cost and the cast's, less the piece buffer that
// a region read straight into w's buffer does without (that buffer is the
// caller's: a Drainer's is charged by fillOne).
func regionHolds(p piecePlan, direct []byte, castBytes int64) int64 {
	n := satAdd(p.cost, castBytes)
	if direct != nil {
		n -= p.bytes
	}
	return n
}

// regionCost is what readRegionAs holds reading the region into w at
// base, besides w's buffer.
func (r run) regionCost(w io.WriterAt, base int64, a *zarr.Array, start, count []int64, to zarr.DType) int64 {
	if satMul(prod(count), int64(a.DType.Size)) == 0 {
		return 0
	}
	return regionHolds(r.regionPlan(w, base, a, start, count, to))
}

// contiguous reports whether every piece of the region start, count lands
// in the region's C-order output as one run. A piece is one run there when,
// for some axis k, it is one element thick along the axes before k and
// spans the region along those after it. The plan's pieces span the region
// along the axes after the split axis; along an axis up to it, all of
// them do where the region lies within one step, and all of them are one
// element thick where thin says so. Pieces are the product of their cuts
// along each axis, so every piece is one run exactly when one k serves
// them all: the first axis along which they are not all thin.
func (p piecePlan) contiguous(start, count []int64) bool {
	k := 0
	for k < p.axis && p.thin(k, start, count) {
		k++
	}
	for d := k + 1; d <= p.axis; d++ {
		if start[d]/p.steps[d] != (start[d]+count[d]-1)/p.steps[d] {
			return false
		}
	}
	return true
}

// thin reports whether every piece of the region is one element thick
// along axis d (< p.axis, cut at multiples of steps[d]).
func (p piecePlan) thin(d int, start, count []int64) bool {
	s := p.steps[d]
	return count[d] == 1 || s == 1 || count[d] == 2 && start[d]%s == s-1
}

func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > (1<<63-1)/b {
		return 1<<63 - 1
	}
	return a * b
}

func satAdd(a, b int64) int64 {
	if a > (1<<63-1)-b {
		return 1<<63 - 1
	}
	return a + b
}
