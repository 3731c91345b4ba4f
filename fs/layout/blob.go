package layout

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/zarrfs/zarrfs/zarr"
)

// regionBlob is a blob holding one rectangular region of one array: a sample
// (the array at index K along the sample dimension, that dimension dropped)
// or a whole array. Both are the region's C-order bytes, so one type serves.
type regionBlob struct {
	opts         Options
	arr          *zarr.Array
	path         string
	header       []byte
	size         int64
	start, count []int64
	dataHash     string // arr.DataHash along the sample axis (-1 for a whole array)
}

var _ Blob = (*regionBlob)(nil)

func (b *regionBlob) Path() string   { return b.path }
func (b *regionBlob) Size() int64    { return b.size }
func (b *regionBlob) Header() []byte { return b.header }

func (b *regionBlob) Sources() []zarr.Request {
	return []zarr.Request{{Array: b.arr, Start: b.start, Count: b.count}}
}

func (b *regionBlob) Inputs() string {
	return fmt.Sprintf("region\x00%s\x00%s\x00align=%d\x00%v\x00%v", b.arr.Path, b.dataHash, b.opts.Align, b.start, b.count)
}

// slabPool holds read buffers between fills, so a steady stream of fills
// allocates nothing per blob.
var slabPool sync.Pool

func getSlab(n int64) []byte {
	if p, ok := slabPool.Get().(*[]byte); ok && int64(cap(*p)) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putSlab(b []byte) { slabPool.Put(&b) }

// slab returns a fill's buffer: lent by the reader's memory when it lends.
func (o Options) slab(n int64) []byte {
	if o.memory != nil && n > 0 {
		return o.memory.HostAlloc(int(n))
	}
	return getSlab(n)
}

func (o Options) freeSlab(b []byte) {
	if o.memory != nil {
		o.memory.HostFree(b)
		return
	}
	putSlab(b)
}

// Fill writes the header, then the region in slabs. A slab is a run of whole
// chunk rows along the outermost axis with more than one element, so every
// chunk lands in exactly one slab and is decoded once per Fill, and the slab's
// bytes are contiguous in the output.
func (b *regionBlob) Fill(ctx context.Context, w io.WriterAt) error {
	if _, err := w.WriteAt(b.header, 0); err != nil {
		return fmt.Errorf("%s: write header: %w", b.path, err)
	}
	itemsize := int64(b.arr.DType.Size)
	total := prod(b.count) * itemsize
	if total == 0 {
		return nil
	}
	axis := -1
	for i, c := range b.count {
		if c > 1 {
			axis = i
			break
		}
	}
	rows, rowBytes := int64(1), total
	if axis >= 0 {
		rows = b.count[axis]
		rowBytes = total / rows
	}
	per := rows
	if axis >= 0 && total > b.opts.SlabBytes {
		chunk := int64(1)
		if axis < len(b.arr.Chunks) && b.arr.Chunks[axis] > 0 {
			chunk = b.arr.Chunks[axis]
		}
		per = max(b.opts.SlabBytes/rowBytes/chunk, 1) * chunk
	}
	buf := b.opts.slab(min(per, rows) * rowBytes)
	defer b.opts.freeSlab(buf)

	start := append([]int64(nil), b.start...)
	count := append([]int64(nil), b.count...)
	for r := int64(0); r < rows; {
		n := rows - r
		if axis >= 0 && per < rows {
			// Cut at the next chunk boundary in array coordinates.
			abs := b.start[axis] + r
			next := (abs/per + 1) * per
			n = min(next-abs, rows-r)
			start[axis], count[axis] = abs, n
		}
		dst := buf[:n*rowBytes]
		req := []zarr.Request{{Array: b.arr, Start: start, Count: count, Dst: dst}}
		if err := b.opts.Reader.Read(ctx, req); err != nil {
			return fmt.Errorf("%s: %w", b.path, err)
		}
		if _, err := w.WriteAt(dst, b.opts.Align+r*rowBytes); err != nil {
			return fmt.Errorf("%s: write: %w", b.path, err)
		}
		r += n
	}
	return nil
}
