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
// in pieces of at most SlabBytes instead of being allocated whole.

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
		// The cost of a full piece: aligned to the grid, so it touches the
		// most chunks any piece does.
		ps := append([]int64(nil), start...)
		pc := append([]int64(nil), count...)
		for i := 0; i <= axis; i++ {
			pc[i] = min(steps[i], count[i])
			ps[i] = 0
			bytes = satMul(bytes, pc[i])
		}
		// A piece is read as one request into its own buffer: chunks
		// that land there whole decode in place (zarr.ReadCostInto).
		return bytes, satAdd(bytes, a.ReadCostInto(ps, pc))
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
	rank := len(count)
	if axis < 0 {
		_, err := w.WriteAt(buf, base)
		return err
	}
	stride := make([]int64, rank) // output strides in bytes
	s := itemsize
	for d := rank - 1; d >= 0; d-- {
		stride[d] = s
		s *= count[d]
	}
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
	release, err := r.acquire(ctx, satAdd(p.cost, castBytes), "region of array "+a.Path)
	if err != nil {
		return err
	}
	if direct != nil {
		// Chunks that land whole decode in place there: on a GPU
		// filling a ring slot, straight into the slot.
		defer release()
		return r.r.Read(ctx, r.pin, []zarr.Request{{Array: a, Start: start, Count: count, Dst: direct}})
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
// pieces; direct, the part of w's buffer that a region of one piece, of
// its own type, is read straight into instead of a piece buffer (nil when
// w lends none); and the bytes of its cast buffer. It holds the plan's
// cost (direct counted as the piece buffer it replaces) and the cast's.
func (r run) regionPlan(w io.WriterAt, base int64, a *zarr.Array, start, count []int64, to zarr.DType) (p piecePlan, direct []byte, castBytes int64) {
	p = planPieces(a, start, count, r.pieceBytes(), r.pieceCost())
	if !zarr.SameValues(a.DType, to) {
		return p, nil, p.bytes / int64(a.DType.Size) * int64(to.Size)
	}
	if bw, ok := w.(bufferWriter); ok && p.whole(start, count) {
		direct = bw.buffer(base, prod(count)*int64(a.DType.Size))
	}
	return p, direct, 0
}

// regionCost is what readRegionAs holds reading the region into w at
// base, besides w's buffer.
func (r run) regionCost(w io.WriterAt, base int64, a *zarr.Array, start, count []int64, to zarr.DType) int64 {
	if satMul(prod(count), int64(a.DType.Size)) == 0 {
		return 0
	}
	p, direct, castBytes := r.regionPlan(w, base, a, start, count, to)
	return satAdd(p.cost, castBytes) - int64(len(direct))
}

// whole reports whether the region start, count is one piece of the plan.
func (p piecePlan) whole(start, count []int64) bool {
	for d := 0; d <= p.axis; d++ {
		if start[d]/p.steps[d] != (start[d]+count[d]-1)/p.steps[d] {
			return false
		}
	}
	return true
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
