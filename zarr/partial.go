package zarr

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/parallel"
	"github.com/zarrfs/zarrfs/objectstore"
)

// Partial reads. A training view takes a few levels of a chunk that holds
// them all (ARCO-ERA5's (1, 37, 721, 1440)); a blosc frame compresses its
// blocks independently and its first bytes say where each is stored, so
// the blocks that hold the selected bytes are fetched with ranged reads
// and decoded alone, straight into the requests' memory. A chunk stored
// without compression is read by the ranges the selection covers. A zstd
// chunk without checksums is fetched whole and decoded up to the
// selection's last byte. Other codecs, and chunks with a checksum (a
// crc32c codec, a zstd frame's, gzip's and zlib's, whose check needs every
// byte), are read whole.

// PartialMode says when a Read fetches and decodes only the part of a
// chunk it needs.
type PartialMode int

const (
	// PartialAuto reads part of a chunk when it pays (partialPays).
	PartialAuto PartialMode = iota
	// PartialNever reads every chunk whole (the peer partial reads are
	// measured against).
	PartialNever
	// PartialAlways reads part of every chunk whose codecs allow it,
	// however small the chunk or large the part.
	PartialAlways
)

// When a partial read pays: the chunk decodes to at least partialMinBytes
// (below that, a request's latency costs more than the bytes it saves),
// and the selection is at most partialRemote of the chunk's decoded bytes
// on a remote store (a ranged read costs what a whole one does but for
// its bytes) or partialLocal on a local one (where a whole read is
// cheap and what partial reads save is mostly decoding).
const (
	partialMinBytes = 1 << 20
	partialRemote   = 0.75
	partialLocal    = 0.5
	// partialStream: a stream is decoded in part when its selection ends
	// within this share of the chunk's decoded bytes.
	partialStream = 0.75
	// partialGap: stored ranges at most this far apart are read as one.
	partialGap = 64 << 10
	// partialMaxSegments bounds the pieces one chunk's selection is cut
	// into (a region that is not contiguous along the chunk's inner
	// dimensions is many rows); past it the chunk is read whole.
	partialMaxSegments = 1 << 14
	// bloscIndexGuess is the block size the first ranged read of a blosc
	// chunk assumes to cover its header and block table in one request:
	// c-blosc's automatic blocks are larger for the chunks partial reads
	// are for; smaller blocks cost one more request.
	bloscIndexGuess = 16 << 10
	bloscIndexMax   = 256 << 10
)

// partial is the part of a leaf a Read fetches and decodes.
type partial struct {
	codec codec.Name
	segs  []codec.Segment // decoded ranges, each into a request's memory
	bytes int64           // their total
	parts []codec.Part    // the fetched stored ranges
	// stream: the chunk is fetched whole and decoded up to its selection's
	// last byte (codec.StreamPart) unless it carries a checksum
	// (attachStream); its Src is the leaf's enc.
	stream bool
	puts   []sourcePut // fetched bytes to keep in the source cache once decoded
}

type sourcePut struct {
	key string
	b   []byte
}

// errReadWhole: the chunk turned out too small for its first ranged read;
// it is read whole instead.
var errReadWhole = errors.New("read the chunk whole")

// chunkRange is where a leaf's stored bytes are: a whole object of a store
// (size -1: unknown), or the range [base, base+size) of a shard.
type chunkRange struct {
	src        storeSource
	base, size int64
}

func (c chunkRange) rng(ctx context.Context, off, n int64) ([]byte, string, string, error) {
	if c.size >= 0 && off+n > c.size {
		return nil, "", "", fmt.Errorf("%w: range %d+%d past the end of a %d-byte inner chunk", codec.ErrCorrupt, off, n, c.size)
	}
	return c.src.rngV(ctx, c.base+off, n)
}

// planPartial returns the partial read of leaf l, or nil when it is read
// whole: when its codecs do not allow a partial read, or, in PartialAuto,
// when it does not pay.
func (st *readState) planPartial(l *leaf) *partial {
	mode := st.h.opts.Partial
	if mode == PartialNever || l.pipe.transpose != nil || l.pipe.shard != nil {
		return nil
	}
	var name codec.Name
	stream := false
	switch {
	case len(l.pipe.bb) == 0:
		name = codec.RawPart
	case len(l.pipe.bb) == 1 && l.pipe.bb[0].name == codec.Blosc && !l.pipe.bb[0].crc32c:
		name = codec.BloscPart
	case len(l.pipe.bb) == 1 && !l.pipe.bb[0].crc32c:
		if name, stream = codec.StreamPart(l.pipe.bb[0].name); !stream {
			return nil
		}
	default:
		return nil
	}
	unit := product(l.shape) * int64(l.arr.DType.Size)
	if mode == PartialAuto && unit < partialMinBytes {
		return nil
	}
	segs, total, ok := st.segments(l)
	if !ok || total >= unit {
		return nil
	}
	if stream {
		// Fetched whole, decoded up to the selection's last byte.
		end, ok := streamEnd(segs)
		if !ok || (mode == PartialAuto && (float64(end) > partialStream*float64(unit) || !l.takesOuter())) {
			return nil
		}
		return &partial{codec: name, segs: segs, bytes: total, stream: true}
	}
	if mode == PartialAuto && !partialPays(total, unit, objectstore.IsLocal(st.h.Store)) {
		return nil
	}
	return &partial{codec: name, segs: segs, bytes: total}
}

// partialPays is the rule for PartialAuto: the selection's share of the
// chunk's decoded bytes.
func partialPays(need, unit int64, local bool) bool {
	limit := partialRemote
	if local {
		limit = partialLocal
	}
	return float64(need) <= limit*float64(unit)
}

// segments cuts every need of l into runs contiguous both in the decoded
// chunk and in the request's destination, each a segment decoded straight
// into that destination. ok is false when there would be too many.
func (st *readState) segments(l *leaf) (segs []codec.Segment, total int64, ok bool) {
	rank := len(l.shape)
	itemsize := int64(l.arr.DType.Size)
	ls := strides(l.shape, itemsize)
	for _, nd := range l.needs {
		r := st.reqs[nd.req]
		rs := strides(r.Count, itemsize)
		ext := make([]int64, rank)
		for d := range rank {
			ext[d] = nd.box.hi[d] - nd.box.lo[d]
		}
		// k: the innermost dimension past which the box spans both the
		// chunk and the request whole.
		k := -1
		for d := rank - 1; d >= 0; d-- {
			if ext[d] != l.shape[d] || ext[d] != r.Count[d] {
				k = d
				break
			}
		}
		run := itemsize
		for d := max(k, 0); d < rank; d++ {
			run *= ext[d]
		}
		if rank == 0 {
			k = 0
		}
		outer := int64(1)
		for d := 0; d < max(k, 0); d++ {
			outer *= ext[d]
		}
		if int64(len(segs))+outer > partialMaxSegments {
			return nil, 0, false
		}
		lo := make([]int64, max(k, 0))
		hi := make([]int64, max(k, 0))
		for d := range lo {
			lo[d], hi[d] = nd.box.lo[d], nd.box.hi[d]
		}
		each := func(c []int64) {
			so, do := int64(0), int64(0)
			for d := range rank {
				x := nd.box.lo[d]
				if d < len(c) {
					x = c[d]
				}
				so += (x - l.origin[d]) * ls[d]
				do += (x - r.Start[d]) * rs[d]
			}
			segs = append(segs, codec.Segment{Off: so, Dst: r.Dst[do : do+run]})
			total += run
		}
		if len(lo) == 0 {
			each(nil)
		} else {
			forEach(lo, hi, each)
		}
	}
	return segs, total, len(segs) > 0
}

// readPartial fetches what l.part needs of the chunk at c: for blosc, its
// header and block table, then the blocks holding the segments; for raw
// bytes, the segments' own ranges. Adjacent ranges are read as one.
func (st *readState) readPartial(ctx context.Context, l *leaf, c chunkRange) error {
	p := l.part
	unit := product(l.shape) * int64(l.arr.DType.Size)
	var vers []string
	keep := func(off int64, b []byte, fresh, ver string) {
		p.parts = append(p.parts, codec.Part{Off: off, B: b})
		if fresh != "" {
			p.puts = append(p.puts, sourcePut{fresh, b})
		}
		vers = append(vers, ver)
	}
	var ranges []codec.Range
	switch p.codec {
	case codec.RawPart:
		for _, s := range p.segs {
			ranges = append(ranges, codec.Range{Off: s.Off, N: int64(len(s.Dst))})
		}
		ranges = codec.MergeRanges(ranges, partialGap)
	case codec.BloscPart:
		n := min(int64(16+4*((unit+bloscIndexGuess-1)/bloscIndexGuess)), bloscIndexMax)
		if c.size >= 0 {
			n = min(n, c.size)
		}
		b, fresh, ver, err := c.rng(ctx, 0, n)
		if errors.Is(err, objectstore.ErrRange) && c.size < 0 {
			return errReadWhole // an object smaller than the guess: tiny, read it whole
		}
		if err != nil {
			return err
		}
		vers = append(vers, ver)
		if fresh != "" {
			p.puts = append(p.puts, sourcePut{fresh, b})
		}
		x, need, err := codec.ParseBloscIndex(b, int(unit))
		if err == nil && x == nil {
			// Smaller blocks than guessed: the table runs on.
			more, fresh, ver, err := c.rng(ctx, n, int64(need)-n)
			if errors.Is(err, objectstore.ErrRange) {
				return fmt.Errorf("%w: a blosc block table of %d bytes runs past the end of the chunk: %w", codec.ErrCorrupt, need, err)
			}
			if err != nil {
				return err
			}
			vers = append(vers, ver)
			if fresh != "" {
				p.puts = append(p.puts, sourcePut{fresh, more})
			}
			b = append(append(make([]byte, 0, need), b...), more...)
			x, _, err = codec.ParseBloscIndex(b, int(unit))
		}
		if err != nil {
			return err
		}
		if x == nil {
			return fmt.Errorf("%w: blosc block table not read", codec.ErrCorrupt)
		}
		if c.size >= 0 && x.CBytes() > c.size {
			return fmt.Errorf("%w: blosc header claims a frame of %d bytes in an inner chunk of %d", codec.ErrCorrupt, x.CBytes(), c.size)
		}
		// The header and table are Parts[0], whole, as the decoder wants.
		p.parts = append(p.parts, codec.Part{Off: 0, B: b})
		ranges = x.Ranges(p.segs, partialGap)
		// What the first read already holds is not read again.
		ranges = dropHeld(ranges, int64(len(b)))
	}
	var mu sync.Mutex
	errs := make([]error, len(ranges))
	parallel.For(len(ranges), st.h.opts.Fetchers, func(i int) {
		r := ranges[i]
		b, fresh, ver, err := c.rng(ctx, r.Off, r.N)
		switch {
		case errors.Is(err, objectstore.ErrRange):
			err = fmt.Errorf("%w: bytes %d+%d the chunk's header points to lie past its end: %w", codec.ErrCorrupt, r.Off, r.N, err)
		case err == nil && int64(len(b)) != r.N:
			err = fmt.Errorf("%w: ranged read of %d+%d returned %d bytes", codec.ErrCorrupt, r.Off, r.N, len(b))
		}
		if err != nil {
			errs[i] = err
			return
		}
		mu.Lock()
		keep(r.Off, b, fresh, ver)
		mu.Unlock()
	})
	if err := errors.Join(errs...); err != nil {
		if objectstore.IsNotFound(err) {
			return fmt.Errorf("%w: chunk vanished while reading its parts", codec.ErrCorrupt)
		}
		return err
	}
	// Every piece of one version: a chunk rewritten between two ranged
	// reads is never decoded from both.
	v0 := ""
	for _, v := range vers {
		switch {
		case v == "":
		case v0 == "":
			v0 = v
		case v != v0:
			return fmt.Errorf("%w: parts read from versions %s and %s", ErrChanged, v0, v)
		}
	}
	return nil
}

// dropHeld drops the ranges that lie wholly within the first n bytes
// (already read); one that runs past them is read whole, since a block's
// streams are decoded from one piece.
func dropHeld(rs []codec.Range, n int64) []codec.Range {
	out := rs[:0]
	for _, r := range rs {
		if r.Off+r.N > n {
			out = append(out, r)
		}
	}
	return out
}

// tryPartial reads leaf l partially as p (planPartial) says, unless p is
// nil or a stream's, and adds it to the read: done reports that it did
// (or that the chunk is missing). A chunk too small for the first ranged
// read is left to the whole read.
func (st *readState) tryPartial(ctx context.Context, l *leaf, p *partial, c chunkRange) (done bool, err error) {
	if p == nil || p.stream {
		return false, nil // a stream is fetched whole (attachStream)
	}
	l.part = p
	switch err := st.readPartial(ctx, l, c); {
	case err == nil:
		st.h.stats.ChunksPartial.Add(1)
	case errors.Is(err, errReadWhole):
		l.part = nil
		return false, nil
	case objectstore.IsNotFound(err) && c.size < 0:
		l.part, l.missing, l.absent, l.listedAbsent = nil, true, true, errors.Is(err, errNotListed)
	default:
		if errors.Is(err, objectstore.ErrRange) {
			err = fmt.Errorf("%w: %w", codec.ErrCorrupt, err)
		}
		return false, &ChunkError{Array: l.arr.Path, Key: l.key, Err: err}
	}
	st.add(l)
	return true, nil
}

// partialJob is the decoding job of a partial leaf.
func (l *leaf) partialJob() codec.Job {
	j := codec.Job{Codec: l.part.codec, Parts: l.part.parts, Segments: l.part.segs, Size: product(l.shape) * int64(l.arr.DType.Size)}
	if l.part.stream {
		j.Src = l.enc
	}
	return j
}

// streamEnd returns where the last of segs ends in the decoded chunk, and
// false when two of them overlap (a stream is decoded once, front to
// back, each byte into one place).
func streamEnd(segs []codec.Segment) (int64, bool) {
	s := slices.Clone(segs)
	slices.SortFunc(s, func(a, b codec.Segment) int { return cmp.Compare(a.Off, b.Off) })
	end := int64(0)
	for _, g := range s {
		if g.Off < end {
			return 0, false
		}
		end = g.Off + int64(len(g.Dst))
	}
	return end, true
}

// takesOuter reports whether every need of l spans the chunk's first
// dimension within the array: what a read leaves of it is then along
// inner dimensions (levels a view does not take) rather than the next
// samples', which a whole decode would keep in the chunk cache for them.
func (l *leaf) takesOuter() bool {
	if len(l.shape) == 0 {
		return false
	}
	hi := min(l.origin[0]+l.shape[0], l.arr.Shape[0])
	for _, nd := range l.needs {
		if nd.box.lo[0] != l.origin[0] || nd.box.hi[0] != hi {
			return false
		}
	}
	return true
}

// attachStream makes l, fetched whole, a stream's partial read when its
// plan says so and the stream carries no checksum (which only a whole
// decode checks: it is read whole, as if not planned).
func (st *readState) attachStream(l *leaf, p *partial) {
	if p != nil && p.stream && l.enc != nil && !codec.ZstdChecksummed(l.enc) {
		l.part = p
		st.h.stats.ChunksPartial.Add(1)
	}
}
