package layout

import (
	"strconv"

	"github.com/zarrfs/zarrfs/zarr"
)

// RegionBlob is a blob holding one rectangular region of one array: a
// sample (the array at index K along the sample dimension, that dimension
// dropped) or a whole array. Both are the region's C-order bytes, so one
// type serves.
type RegionBlob struct {
	align        int64
	arr          *zarr.Array
	path         string
	header       []byte
	size         int64
	start, count []int64
	dataHash     string // arr.DataHash along the sample axis (-1 for a whole array)
}

var _ Blob = (*RegionBlob)(nil)

func (b *RegionBlob) Path() string   { return b.path }
func (b *RegionBlob) Size() int64    { return b.size }
func (b *RegionBlob) Header() []byte { return b.header }

// Region is the region the blob holds, after its header: a Request
// template (Dst is nil). The caller must not modify its slices.
func (b *RegionBlob) Region() zarr.Request {
	return zarr.Request{Array: b.arr, Start: b.start, Count: b.count}
}

func (b *RegionBlob) Sources() []zarr.Request {
	return []zarr.Request{{Array: b.arr, Start: b.start, Count: b.count}}
}

func (b *RegionBlob) Inputs() string {
	// Built by hand: every open computes it.
	buf := make([]byte, 0, 96+len(b.arr.Path)+len(b.dataHash)+24*len(b.start))
	buf = append(buf, "region\x00"...)
	buf = append(buf, b.arr.Path...)
	buf = append(buf, 0)
	buf = append(buf, b.dataHash...)
	buf = append(buf, "\x00align="...)
	buf = strconv.AppendInt(buf, b.align, 10)
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
