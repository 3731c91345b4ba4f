package layout

import (
	"context"
	"fmt"
	"io"
	"strconv"
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
	// Built by hand: every open computes it.
	buf := make([]byte, 0, 96+len(b.arr.Path)+len(b.dataHash)+24*len(b.start))
	buf = append(buf, "region\x00"...)
	buf = append(buf, b.arr.Path...)
	buf = append(buf, 0)
	buf = append(buf, b.dataHash...)
	buf = append(buf, "\x00align="...)
	buf = strconv.AppendInt(buf, b.opts.Align, 10)
	for _, v := range [][]int64{b.start, b.count} {
		buf = append(buf, 0, '[')
		for i, x := range v {
			if i > 0 {
				buf = append(buf, ' ')
			}
			buf = strconv.AppendInt(buf, x, 10)
		}
		buf = append(buf, ']')
	}
	return string(buf)
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

// Fill writes the header, then the region, read in pieces that fit the
// memory limits (see planPieces).
func (b *regionBlob) Fill(ctx context.Context, w io.WriterAt) error {
	if _, err := w.WriteAt(b.header, 0); err != nil {
		return fmt.Errorf("%s: write header: %w", b.path, err)
	}
	if err := b.opts.readRegion(ctx, w, b.opts.Align, b.arr, b.start, b.count); err != nil {
		return fmt.Errorf("%s: %w", b.path, err)
	}
	return nil
}
