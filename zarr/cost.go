package zarr

import "math"

// Per-chunk bookkeeping a Read holds besides the bytes: for an outer chunk
// a goroutine stack, its leaf, needs and key strings; for an inner chunk of
// a shard the same without the stack.
const (
	outerOverhead = 4 << 10
	innerOverhead = 1 << 10
)

// ReadCost bounds the memory a Read of the region [start, start+count)
// holds besides its destination: the decoded and the compressed buffers of
// every chunk (or inner chunk of a shard) the region touches, the shard
// indexes, and per-chunk bookkeeping. It comes from the metadata alone, so
// a caller checks it against a memory budget before it reads; a store's
// data can make a Read exceed it only by the slack MaxEncodedBytes allows a
// compressed chunk over its decoded size. The result saturates at
// math.MaxInt64.
func (a *Array) ReadCost(start, count []int64) int64 {
	if a == nil || a.pipe == nil || len(start) != len(a.Chunks) || len(count) != len(a.Chunks) {
		return 0
	}
	for _, c := range count {
		if c <= 0 {
			return 0
		}
	}
	return pipeCost(a.pipe, a.Chunks, start, count, int64(a.DType.Size), outerOverhead)
}

// ReadCostInto is ReadCost for a Read whose destination is the region
// itself, one request over it: a chunk that lies wholly inside the region
// and lands there as one contiguous run decodes straight into the
// destination (inPlace), so it costs its compressed bytes only, not its
// decoded buffer too. On a regular grid every chunk has the chunk shape,
// so whether one lands as a run is the same for all of them (runIn, the
// rule inPlace applies): those of a region whose inner dimensions each
// hold one chunk exactly, when the chunks are one element thick along the
// dimensions before them (a sample's region of a (time, level, y, x) array
// chunked (1, L, y, x), or several levels of it selected together).
// Sharded arrays and arrays with a transpose codec cost what ReadCost says.
func (a *Array) ReadCostInto(start, count []int64) int64 {
	full := a.ReadCost(start, count)
	if full == 0 || full == math.MaxInt64 || a.pipe.shard != nil || a.pipe.transpose != nil {
		return full
	}
	zero := make([]int64, len(count))
	if _, ok := runIn(box{lo: zero, hi: a.Chunks}, zero, count, 1); !ok {
		return full
	}
	inside := int64(1) // chunks wholly inside the region
	for d, c := range a.Chunks {
		lo, hi := (start[d]+c-1)/c, (start[d]+count[d])/c // chunks [lo, hi) along d
		if hi <= lo {
			return full
		}
		inside *= hi - lo
	}
	// ReadCost charges each chunk its decoded size and its compressed
	// bound; one decoded in place holds only the second.
	return full - inside*product(a.Chunks)*int64(a.DType.Size)
}

// ReadGrid is the grid a Read decodes by: the chunk shape, or for a
// sharded array the shape of the chunks inside its shards, each of which a
// Read fetches and decodes on its own. A region cut along it costs no more
// than the cells it touches.
func (a *Array) ReadGrid() []int64 {
	if a.pipe != nil && a.pipe.shard != nil {
		return a.pipe.shard.inner
	}
	return a.Chunks
}

// pipeCost is ReadCost for chunks shaped cell under pipeline p.
func pipeCost(p *pipeline, cell, start, count []int64, itemsize, overhead int64) int64 {
	n := spanned(cell, start, count)
	if p.shard == nil {
		// Decoded and compressed buffers; a compressed chunk takes about
		// its decoded size at most (MaxEncodedBytes is the hard limit).
		// A chunk decoded in several steps (deflate, then shuffle) holds
		// one buffer between them as well (decode gives it back once the
		// next step has read it).
		unit := satMul(product(cell), itemsize)
		per := satAdd(satAdd(unit, unit+unit/8), overhead)
		if p.steps() > 1 {
			per = satAdd(per, unit)
		}
		return satMul(n, per)
	}
	s := p.shard
	entries := int64(1)
	for d := range cell {
		entries = satMul(entries, cell[d]/s.inner[d])
	}
	index := satAdd(satMul(entries, 16), 4)
	// The inner grid is aligned with the shards, so the inner chunks the
	// region touches are those of the inner grid over the whole array.
	inner := pipeCost(s.codecs, s.inner, start, count, itemsize, innerOverhead)
	if s.codecs.shard != nil {
		// A nested shard's bytes are read whole before its inner chunks.
		inner = satAdd(inner, satMul(spanned(s.inner, start, count), satMul(product(s.inner), itemsize)))
	}
	return satAdd(satMul(n, satAdd(index, overhead)), inner)
}

// spanned is the number of cells of a grid shaped cell that the region
// touches.
func spanned(cell, start, count []int64) int64 {
	n := int64(1)
	for d := range cell {
		if cell[d] <= 0 {
			return 0
		}
		lo := start[d] / cell[d]
		hi := (start[d] + count[d] - 1) / cell[d]
		n = satMul(n, hi-lo+1)
	}
	return n
}

// maxEncoded is the largest compressed chunk accepted for a chunk that
// decodes to unit bytes: every codec zarrfs reads expands incompressible
// data by far less than an eighth (framing, block headers, checksums).
func maxEncoded(unit int64) int64 {
	return satAdd(unit+unit/8, 64<<10)
}

// MaxEncodedBytes is the largest compressed (stored) chunk a read of a
// accepts; a larger object is refused before it is read.
func (a *Array) MaxEncodedBytes() int64 {
	return maxEncoded(satMul(product(a.Chunks), int64(a.DType.Size)))
}

func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
