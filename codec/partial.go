package codec

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"slices"
	"sort"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Partial reads decode only part of a chunk from only part of its stored
// bytes. A blosc frame compresses its blocks independently and says where
// each starts (the offsets after its 16-byte header), so the blocks that
// hold a selection can be fetched and decoded alone; bytes without
// compression are their own decoded bytes.
//
// A zstd stream has no such table, but its decoder can stop once the
// selection's last byte is out: a selection of a chunk's first levels
// decodes only those. Only a stream without checksums is stopped early:
// a checksum at its end is what catches damage that decodes silently, so a
// checksummed stream is decoded whole, as its whole read would be (gzip
// and zlib always carry one, and are never read in part).
//
// A partial Job names BloscPart or RawPart, carries the fetched byte ranges
// of the stored chunk in Parts and the decoded ranges to produce in
// Segments; Src and Dst are unused. A stream's partial job (ZstdPart)
// carries the whole stored chunk in Src and the decoded ranges in
// Segments, which must not overlap. Only the CPU decodes
// partial jobs (a GPU decoder refuses them with ErrUnsupported, as any
// codec it lacks).
const (
	BloscPart Name = "blosc-part" // some blocks of a blosc frame; Parts[0] holds its header and block table
	RawPart   Name = "raw-part"   // ranges of a chunk stored without compression
	ZstdPart  Name = "zstd-part"  // a zstd chunk decoded up to its selection's last byte
)

// IsPartial reports whether name is a codec of partial reads.
func IsPartial(name Name) bool {
	switch name {
	case BloscPart, RawPart, ZstdPart:
		return true
	}
	return false
}

// StreamPart returns the partial codec that decodes a prefix of a chunk
// compressed with name, and whether name is a stream that allows it.
func StreamPart(name Name) (Name, bool) {
	if name == Zstd {
		return ZstdPart, true
	}
	return "", false
}

// Part is a fetched byte range of a stored chunk: bytes [Off, Off+len(B)).
type Part struct {
	Off int64
	B   []byte
}

// Segment is a decoded byte range of a chunk, [Off, Off+len(Dst)), and the
// memory it is decoded into.
type Segment struct {
	Off int64
	Dst []byte
}

// Range is a byte range [Off, Off+N) of a stored chunk, to fetch.
type Range struct{ Off, N int64 }

// BloscIndex is what a blosc frame's first bytes say about its blocks:
// where each is stored, so that the blocks holding a decoded range can be
// fetched alone.
type BloscIndex struct {
	h      bloscHeader
	cbytes int
	// end[i] is where block i's stored bytes end: the next block's start in
	// frame order (blocks may be stored out of order when c-blosc
	// compresses with threads), or the frame's end.
	start, end []int
}

// bloscIndexMin is the least prefix ParseBloscIndex accepts: the header.
const bloscIndexMin = bloscHeaderSize

// ParseBloscIndex reads the header and block table of a blosc frame from
// its first bytes. need is the prefix length the table takes: when it is
// more than len(prefix), nothing else is returned and the caller reads
// that much and asks again. Errors are those of Decode for a malformed
// header or table, checked as far as the prefix allows (a block offset
// past the frame's end, a frame larger than its decoded size allows are
// refused here; whether the object really holds cbytes bytes is for the
// ranged reads to find out).
func ParseBloscIndex(prefix []byte, nbytes int) (x *BloscIndex, need int, err error) {
	if len(prefix) < bloscIndexMin {
		return nil, bloscIndexMin, nil
	}
	cbytes := int(int32(binary.LittleEndian.Uint32(prefix[12:])))
	if cbytes < bloscHeaderSize || cbytes > nbytes+nbytes/8+(64<<10) {
		return nil, 0, fmt.Errorf("blosc: header claims a frame of %d bytes for %d decoded: %w", cbytes, nbytes, ErrCorrupt)
	}
	if len(prefix) > cbytes {
		prefix = prefix[:cbytes]
	}
	h, err := parseBloscFields(prefix, cbytes)
	if err != nil {
		return nil, 0, err
	}
	if h.nbytes != nbytes {
		return nil, 0, fmt.Errorf("blosc: frame decodes to %d bytes, want %d: %w", h.nbytes, nbytes, ErrCorrupt)
	}
	x = &BloscIndex{h: h, cbytes: cbytes}
	if h.nbytes == 0 || h.memcpyed {
		return x, bloscHeaderSize, nil
	}
	need = bloscHeaderSize + 4*h.nblocks
	if len(prefix) < need {
		return nil, need, nil
	}
	x.start = make([]int, h.nblocks)
	for i := range x.start {
		pos := int(int32(binary.LittleEndian.Uint32(prefix[bloscHeaderSize+4*i:])))
		if pos < need || pos > cbytes-4 {
			return nil, 0, fmt.Errorf("blosc: block %d starts at %d of %d bytes: %w", i, pos, cbytes, ErrCorrupt)
		}
		x.start[i] = pos
	}
	order := make([]int, h.nblocks)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return x.start[order[a]] < x.start[order[b]] })
	x.end = make([]int, h.nblocks)
	next := cbytes
	for k := len(order) - 1; k >= 0; k-- {
		i := order[k]
		x.end[i] = next
		if k > 0 && x.start[order[k-1]] < x.start[i] {
			next = x.start[i]
		}
	}
	return x, need, nil
}

// CBytes is the frame's stored size, as its header says.
func (x *BloscIndex) CBytes() int64 { return int64(x.cbytes) }

// Ranges returns the stored byte ranges that hold the decoded ranges segs
// (Off and len(Dst) only are read), sorted and merged where they touch or
// lie at most gap bytes apart. A memcpyed frame stores each decoded byte
// 16 bytes further on.
func (x *BloscIndex) Ranges(segs []Segment, gap int64) []Range {
	var rs []Range
	if x.h.nbytes == 0 {
		return nil
	}
	if x.h.memcpyed {
		for _, s := range segs {
			if len(s.Dst) > 0 {
				rs = append(rs, Range{bloscHeaderSize + s.Off, int64(len(s.Dst))})
			}
		}
		return mergeRanges(rs, gap)
	}
	bs := int64(x.h.blocksize)
	seen := make(map[int]bool)
	for _, s := range segs {
		if len(s.Dst) == 0 {
			continue
		}
		for b := s.Off / bs; b <= (s.Off+int64(len(s.Dst))-1)/bs && b < int64(x.h.nblocks); b++ {
			if !seen[int(b)] {
				seen[int(b)] = true
				rs = append(rs, Range{int64(x.start[b]), int64(x.end[b] - x.start[b])})
			}
		}
	}
	return mergeRanges(rs, gap)
}

// MergeRanges sorts ranges and merges those that overlap, touch, or lie at
// most gap bytes apart.
func MergeRanges(rs []Range, gap int64) []Range { return mergeRanges(rs, gap) }

func mergeRanges(rs []Range, gap int64) []Range {
	slices.SortFunc(rs, func(a, b Range) int { return cmp.Compare(a.Off, b.Off) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && r.Off <= out[n-1].Off+out[n-1].N+gap {
			out[n-1].N = max(out[n-1].N, r.Off+r.N-out[n-1].Off)
			continue
		}
		out = append(out, r)
	}
	return out
}

// parts finds stored bytes among the fetched parts.
type parts []Part

// at returns the fetched bytes from stored offset off to the end of the
// part holding it that reaches furthest (parts may overlap: the prefix
// read for the index and the first block's range), or an error when off
// was not fetched.
func (ps parts) at(off int64) ([]byte, error) {
	var best []byte
	for _, p := range ps {
		if p.Off > off {
			break
		}
		if end := p.Off + int64(len(p.B)); end > off && end-off > int64(len(best)) {
			best = p.B[off-p.Off:]
		}
	}
	if best == nil {
		return nil, fmt.Errorf("stored byte %d was not fetched: %w", off, ErrCorrupt)
	}
	return best, nil
}

// get returns stored bytes [off, off+n), which one part must hold.
func (ps parts) get(off, n int64) ([]byte, error) {
	b, err := ps.at(off)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) < n {
		return nil, fmt.Errorf("stored bytes %d+%d were not fetched: %w", off, n, ErrCorrupt)
	}
	return b[:n], nil
}

func sortedParts(p []Part) parts {
	ps := parts(slices.Clone(p))
	slices.SortFunc(ps, func(a, b Part) int { return cmp.Compare(a.Off, b.Off) })
	return ps
}

// decodePartial decodes a partial job.
func (d *decoder) decodePartial(j *Job) error {
	if j.Codec == ZstdPart {
		return d.decodeStreamPart(j)
	}
	ps := sortedParts(j.Parts)
	if j.Codec == RawPart {
		for _, s := range j.Segments {
			b, err := ps.get(s.Off, int64(len(s.Dst)))
			if err != nil {
				return fmt.Errorf("raw-part: %w", err)
			}
			copy(s.Dst, b)
		}
		return nil
	}
	if len(ps) == 0 || ps[0].Off != 0 {
		return fmt.Errorf("blosc: partial frame without its header: %w", ErrCorrupt)
	}
	nbytes := int(j.Size)
	x, need, err := ParseBloscIndex(ps[0].B, nbytes)
	if err != nil {
		return err
	}
	if x == nil {
		return fmt.Errorf("blosc: header and block table take %d bytes, %d fetched: %w", need, len(ps[0].B), ErrCorrupt)
	}
	for _, s := range j.Segments {
		if s.Off < 0 || s.Off+int64(len(s.Dst)) > int64(nbytes) {
			return fmt.Errorf("blosc: decoded range %d+%d outside a %d-byte frame: %w", s.Off, len(s.Dst), nbytes, ErrCorrupt)
		}
	}
	if x.h.memcpyed {
		for _, s := range j.Segments {
			b, err := ps.get(bloscHeaderSize+s.Off, int64(len(s.Dst)))
			if err != nil {
				return fmt.Errorf("blosc: memcpyed frame: %w", err)
			}
			copy(s.Dst, b)
		}
		return nil
	}
	// Segments in decoded order, so a block that two of them share is
	// decoded once.
	segs := slices.Clone(j.Segments)
	slices.SortStableFunc(segs, func(a, b Segment) int { return cmp.Compare(a.Off, b.Off) })
	bs := int64(x.h.blocksize)
	cur := -1 // the block held in d.blk
	for _, s := range segs {
		end := s.Off + int64(len(s.Dst))
		for b := s.Off / bs; s.Off < end && b <= (end-1)/bs; b++ {
			bo, n := x.h.block(int(b))
			lo, hi := max(s.Off, int64(bo)), min(end, int64(bo+n))
			if int(b) != cur && lo == int64(bo) && hi == int64(bo+n) {
				// The whole block lands in this segment: straight there.
				if err := d.decodeBlockFrom(&x.h, ps, x.start[b], int(b), s.Dst[lo-s.Off:hi-s.Off], len(s.Dst) >= streamStoreMin); err != nil {
					return err
				}
				continue
			}
			if int(b) != cur {
				if cap(d.blk) < n {
					d.blk = make([]byte, n)
				}
				if err := d.decodeBlockFrom(&x.h, ps, x.start[b], int(b), d.blk[:n], false); err != nil {
					cur = -1
					return err
				}
				cur = int(b)
			}
			copy(s.Dst[lo-s.Off:hi-s.Off], d.blk[lo-int64(bo):hi-int64(bo)])
		}
	}
	return nil
}

// decodeBlockFrom decodes block i, whose streams start at stored offset
// pos, from the fetched parts into out (the block's n bytes); stream as
// decodeBlock's.
func (d *decoder) decodeBlockFrom(h *bloscHeader, ps parts, pos, i int, out []byte, stream bool) error {
	view, err := ps.at(int64(pos))
	if err != nil {
		return fmt.Errorf("blosc: block %d: %w", i, err)
	}
	return d.decodeBlock(h, view, pos, i, out, stream)
}

// streamSkip is the scratch a stream's bytes before a segment are decoded
// into and dropped.
const streamSkip = 1 << 20

// decodeStreamPart decodes a zstd stream from its start up to the last
// byte of its segments, each decoded straight into its memory, and stops
// there; what is decoded is what a whole decode would give, or an error.
// A stream with a checksum (ZstdChecksummed), or one whose window is
// larger than the chunk (written by a streaming compressor that did not
// know the size), is decoded whole into scratch instead, with every check
// of a whole decode.
func (d *decoder) decodeStreamPart(j *Job) error {
	segs := slices.Clone(j.Segments)
	slices.SortStableFunc(segs, func(a, b Segment) int { return cmp.Compare(a.Off, b.Off) })
	pos := int64(0)
	for _, s := range segs {
		if s.Off < pos || s.Off < 0 || s.Off+int64(len(s.Dst)) > j.Size {
			// The caller's mistake, not the chunk's: no ErrCorrupt.
			return fmt.Errorf("%s: segment %d+%d overlaps another or lies outside %d bytes", j.Codec, s.Off, len(s.Dst), j.Size)
		}
		pos = s.Off + int64(len(s.Dst))
	}
	if !ZstdChecksummed(j.Src) {
		err := d.streamSegments(j, segs)
		if !errors.Is(err, zstd.ErrWindowSizeExceeded) && !errors.Is(err, zstd.ErrDecoderSizeExceeded) {
			return err
		}
	}
	buf := d.scratch(int(j.Size))
	if err := d.decodeZstd(buf, j.Src); err != nil {
		return err
	}
	for _, s := range segs {
		copy(s.Dst, buf[s.Off:])
	}
	return nil
}

// streamSegments decodes the stream of j into segs, sorted and apart.
func (d *decoder) streamSegments(j *Job, segs []Segment) error {
	z, class := getStreamDecoder(j.Size)
	d.br.Reset(j.Src)
	defer func() {
		z.Reset(nil)
		putStreamDecoder(z, class)
		d.br.Reset(nil)
	}()
	if err := z.Reset(&d.br); err != nil {
		return fmt.Errorf("zstd: %w: %w", ErrCorrupt, err)
	}
	pos := int64(0)
	for _, s := range segs {
		for pos < s.Off {
			n := min(s.Off-pos, streamSkip)
			if cap(d.blk) < int(n) {
				d.blk = make([]byte, min(streamSkip, j.Size))
			}
			if err := readFull(z, d.blk[:n]); err != nil {
				return err
			}
			pos += n
		}
		if err := readFull(z, s.Dst); err != nil {
			return err
		}
		pos += int64(len(s.Dst))
	}
	return nil
}

// readFull fills b from a zstd stream.
func readFull(r io.Reader, b []byte) error {
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return fmt.Errorf("zstd: stream ends early: %w", ErrCorrupt)
		}
		return fmt.Errorf("zstd: %w: %w", ErrCorrupt, err)
	}
	return nil
}

// ZstdChecksummed reports whether any frame of src carries a content
// checksum, walking the frames' headers and block headers without
// decoding (a few bytes per 128 KiB block): a checksum is what catches
// damage that decodes without error, so such a stream is only decoded
// whole. Input it cannot walk counts as checksummed, for the whole decode
// to refuse it with its own error.
func ZstdChecksummed(src []byte) bool {
	checked, ok := walkZstd(src)
	return checked || !ok
}

// walkZstd walks src as zstd frames and skippable frames end to end,
// reading their headers and block headers, not their contents: ok says
// src is nothing but such frames (no legacy frame, no trailing bytes, no
// block reaching past the end), checked that one of them declares a
// content checksum.
func walkZstd(src []byte) (checked, ok bool) {
	for len(src) > 0 {
		if len(src) < 8 {
			return checked, false
		}
		magic := binary.LittleEndian.Uint32(src)
		if magic&0xFFFFFFF0 == 0x184D2A50 { // a skippable frame
			n := uint64(binary.LittleEndian.Uint32(src[4:]))
			if n > uint64(len(src)-8) {
				return checked, false
			}
			src = src[8+n:]
			continue
		}
		if magic != 0xFD2FB528 {
			return checked, false
		}
		fhd := src[4]
		sum := fhd&0x04 != 0
		checked = checked || sum
		single := fhd&0x20 != 0
		pos := 5
		if !single {
			pos++ // the window descriptor
		}
		pos += [4]int{0, 1, 2, 4}[fhd&3] // the dictionary id
		pos += [4]int{0, 2, 4, 8}[fhd>>6]
		if fhd>>6 == 0 && single {
			pos++
		}
		for {
			if pos+3 > len(src) {
				return checked, false
			}
			bh := uint32(src[pos]) | uint32(src[pos+1])<<8 | uint32(src[pos+2])<<16
			size := int(bh >> 3)
			switch (bh >> 1) & 3 {
			case 1: // RLE: one byte stored
				size = 1
			case 3:
				return checked, false
			}
			pos += 3 + size
			if bh&1 != 0 {
				break
			}
		}
		if sum {
			pos += 4
		}
		if pos > len(src) {
			return checked, false
		}
		src = src[pos:]
	}
	return checked, true
}

// Stream decoders are pooled by the power of two their window may reach:
// a decoder keeps its window's memory, as large as the chunks it decodes,
// which a fresh one would allocate and clear for every chunk. A pool's
// idle decoders go with the collector's next cycles.
var streamDecoders [48]sync.Pool

func streamClass(size int64) int {
	c := bits.Len64(uint64(max(size, zstd.MinWindowSize) - 1))
	return min(c, len(streamDecoders)-1)
}

// getStreamDecoder returns a synchronous zstd stream decoder whose window
// is bounded by the power of two at or above size, and its class.
func getStreamDecoder(size int64) (*zstd.Decoder, int) {
	c := streamClass(size)
	if z, ok := streamDecoders[c].Get().(*zstd.Decoder); ok {
		return z, c
	}
	limit := uint64(1) << c
	z, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(false),
		zstd.WithDecoderMaxWindow(limit),
		zstd.WithDecoderMaxMemory(limit))
	if err != nil {
		panic("codec: zstd.NewReader with static options: " + err.Error())
	}
	return z, c
}

func putStreamDecoder(z *zstd.Decoder, class int) { streamDecoders[class].Put(z) }
