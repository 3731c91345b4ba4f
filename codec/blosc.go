package codec

import (
	"encoding/binary"
	"fmt"
)

// Blosc 1 frames (c-blosc 1.x, as numcodecs and tensorstore write them for
// the Zarr v2 "blosc" compressor and the Zarr v3 "blosc" codec):
//
//	byte 0      format version (2; 1 is read too)
//	byte 1      inner codec format version (1)
//	byte 2      flags: 0x01 byte shuffle, 0x02 memcpyed, 0x04 bit shuffle,
//	            0x08 reserved, 0x10 do not split, bits 5-7 inner codec
//	byte 3      typesize
//	bytes 4-7   nbytes, the decoded size (little endian, as are all below)
//	bytes 8-11  blocksize
//	bytes 12-15 cbytes, the frame size
//	then        unless memcpyed: one int32 per block, the offset of the
//	            block's first stream in the frame
//
// The decoded buffer is cut into blocks of blocksize bytes (the last one
// shorter when blocksize does not divide nbytes). Each block is shuffled on
// its own, then compressed either whole or, when split, as typesize streams
// of blocksize/typesize bytes (all of byte 0 of the block's elements, then
// byte 1, ...). A stream is an int32 compressed size followed by that many
// bytes; a size equal to the stream's decoded size means the bytes are
// stored raw. A memcpyed frame stores the decoded bytes after the header,
// unshuffled.

// BloscShuffle is the shuffle filter a blosc frame's blocks went through.
type BloscShuffle uint8

// Shuffle filters of blosc frames.
const (
	NoShuffle   BloscShuffle = iota // blocks hold the elements as they are
	ByteShuffle                     // undo with Unshuffle, block by block
	BitShuffle                      // undo with BitUnshuffle, block by block
)

func (s BloscShuffle) String() string {
	switch s {
	case NoShuffle:
		return "noshuffle"
	case ByteShuffle:
		return "shuffle"
	case BitShuffle:
		return "bitshuffle"
	}
	return fmt.Sprintf("BloscShuffle(%d)", uint8(s))
}

const (
	bloscHeaderSize  = 16
	bloscMaxSplits   = 16  // c-blosc's MAX_SPLITS
	bloscMinBuffer   = 128 // c-blosc's MIN_BUFFERSIZE
	bloscShuffleFlag = 0x01
	bloscMemcpyFlag  = 0x02
	bloscBitFlag     = 0x04
	bloscFutureFlag  = 0x08
	bloscNoSplitFlag = 0x10
)

// Inner codec codes (flags bits 5-7).
const (
	bloscBlosclz = 0
	bloscLZ4     = 1 // lz4 and lz4hc share the format
	bloscSnappy  = 2
	bloscZlib    = 3
	bloscZstd    = 4
)

var bloscCompressorNames = [...]string{"blosclz", "lz4", "snappy", "zlib", "zstd"}

// BloscFrame is a parsed blosc frame: what a decoder needs to decode its
// streams, in any order or all at once, and then unshuffle.
//
// Decoding a frame: for every stream, decode Src (or copy it, when Raw) into
// the stream's DstLen bytes at DstOff of a buffer of NBytes bytes; then, for
// every block i, unshuffle that buffer's Block(i) range into the same range
// of the output (Unshuffle for ByteShuffle, BitUnshuffle for BitShuffle, a
// plain copy for NoShuffle, in which case streams may be decoded straight
// into the output).
type BloscFrame struct {
	Typesize  int // element size the shuffle used, 1-255
	NBytes    int // decoded size
	BlockSize int // bytes per block; the last block may be shorter
	// Shuffle is the filter to undo. It is ByteShuffle only for typesize > 1
	// and NoShuffle for a memcpyed frame, whatever the flags say, because
	// that is what blosc applies.
	Shuffle  BloscShuffle
	Memcpyed bool // the frame stores the decoded bytes as they are
	// Compressor is the inner codec: "blosclz", "lz4" (also written by
	// lz4hc), "zlib", "zstd" or "snappy" (which this package does not
	// decode). Each compressed stream is one raw block or frame of it: an
	// LZ4 block without size prefix, a zlib (RFC 1950) stream, a zstd frame.
	Compressor string
	// Streams in frame order: block 0's streams first. A memcpyed frame has
	// one raw stream covering everything.
	Streams []BloscStream
}

// BloscStream is one independently compressed piece of a blosc frame.
type BloscStream struct {
	Src    []byte // compressed bytes (a slice of the frame, not a copy)
	DstOff int    // where its output starts in the decoded, still shuffled buffer
	DstLen int    // exact decoded size
	Raw    bool   // Src is stored uncompressed (len(Src) == DstLen)
}

// NumBlocks returns the number of blocks of the frame.
func (f *BloscFrame) NumBlocks() int {
	if f.BlockSize <= 0 {
		return 0
	}
	return (f.NBytes + f.BlockSize - 1) / f.BlockSize
}

// Block returns the byte range [off, off+n) of block i in the decoded
// buffer: the unit each shuffle works on.
func (f *BloscFrame) Block(i int) (off, n int) {
	off = i * f.BlockSize
	return off, min(f.BlockSize, f.NBytes-off)
}

// Unshuffle undoes the frame's shuffle block by block, from shuffled (the
// decoded streams) into dst; both must be NBytes long and not overlap.
func (f *BloscFrame) Unshuffle(dst, shuffled []byte) error {
	if len(dst) != f.NBytes || len(shuffled) != f.NBytes {
		return fmt.Errorf("blosc: unshuffle of %d bytes into %d, frame has %d: %w",
			len(shuffled), len(dst), f.NBytes, ErrCorrupt)
	}
	for i := range f.NumBlocks() {
		off, n := f.Block(i)
		unshuffleBlock(f.Shuffle, dst[off:off+n], shuffled[off:off+n], f.Typesize, len(dst) >= streamStoreMin)
	}
	return nil
}

// streamStoreMin is the smallest destination a byte unshuffle writes with
// non-temporal stores (unshuffleTo): a chunk decoded into its place in a
// sample larger than a core's cache, which is read again only when the
// sample is written out, after its other chunks. The stores skip the read
// of each destination line, which makes the unshuffle into memory and a
// whole field's decode faster (BenchmarkUnshuffleStream; BENCHMARKS.md);
// a smaller destination is likely still in the cache when it is read.
const streamStoreMin = 2 << 20

func unshuffleBlock(s BloscShuffle, dst, src []byte, typesize int, stream bool) {
	switch s {
	case ByteShuffle:
		unshuffleTo(dst, src, typesize, stream)
	case BitShuffle:
		_ = BitUnshuffle(dst, src, typesize) // lengths equal, typesize > 0
	default:
		copy(dst, src)
	}
}

// bloscHeader is a validated frame header. Parsing it allocates nothing, so
// the CPU decoder walks the streams block by block without building a
// BloscFrame.
type bloscHeader struct {
	src       []byte // the frame: src[:cbytes]
	typesize  int
	nbytes    int
	blocksize int
	nblocks   int
	shuffle   BloscShuffle
	memcpyed  bool
	noSplit   bool
	comp      int
}

func parseBloscHeader(src []byte) (bloscHeader, error) {
	return parseBloscFields(src, len(src))
}

// parseBloscFields validates the header at the start of src, of a frame of
// which avail bytes exist (len(src) when src is the whole frame; more when
// src is its first bytes and the rest is fetched block by block). h.src
// holds what src has of the frame.
func parseBloscFields(src []byte, avail int) (bloscHeader, error) {
	var h bloscHeader
	if len(src) < bloscHeaderSize {
		return h, fmt.Errorf("blosc: frame of %d bytes, shorter than its header: %w", len(src), ErrCorrupt)
	}
	version, versionlz, flags := src[0], src[1], src[2]
	if version != 1 && version != 2 {
		return h, fmt.Errorf("blosc: format version %d (only Blosc 1 frames, versions 1 and 2): %w", version, ErrUnsupported)
	}
	if flags&bloscFutureFlag != 0 {
		return h, fmt.Errorf("blosc: reserved flag 0x08 set: %w", ErrUnsupported)
	}
	h.typesize = int(src[3])
	h.nbytes = int(int32(binary.LittleEndian.Uint32(src[4:])))
	h.blocksize = int(int32(binary.LittleEndian.Uint32(src[8:])))
	cbytes := int(int32(binary.LittleEndian.Uint32(src[12:])))
	if h.typesize == 0 {
		return h, fmt.Errorf("blosc: typesize 0: %w", ErrCorrupt)
	}
	if h.nbytes < 0 || cbytes < bloscHeaderSize || cbytes > avail {
		return h, fmt.Errorf("blosc: header claims %d bytes decoded from %d, frame has %d: %w",
			h.nbytes, cbytes, avail, ErrCorrupt)
	}
	h.src = src[:min(cbytes, len(src))]
	h.memcpyed = flags&bloscMemcpyFlag != 0
	h.noSplit = flags&bloscNoSplitFlag != 0
	h.comp = int(flags >> 5)
	switch {
	case h.memcpyed:
		h.shuffle = NoShuffle
	case flags&bloscShuffleFlag != 0 && h.typesize > 1:
		h.shuffle = ByteShuffle
	case flags&bloscBitFlag != 0:
		h.shuffle = BitShuffle
	}
	if h.nbytes == 0 {
		return h, nil // c-blosc stops here: nothing to decode
	}
	if h.blocksize <= 0 || h.blocksize > h.nbytes {
		return h, fmt.Errorf("blosc: blocksize %d for %d bytes: %w", h.blocksize, h.nbytes, ErrCorrupt)
	}
	h.nblocks = (h.nbytes + h.blocksize - 1) / h.blocksize
	if h.memcpyed {
		if cbytes != h.nbytes+bloscHeaderSize {
			return h, fmt.Errorf("blosc: memcpyed frame of %d bytes holds %d: %w", cbytes, h.nbytes, ErrCorrupt)
		}
		return h, nil
	}
	if h.comp >= len(bloscCompressorNames) {
		return h, fmt.Errorf("blosc: inner codec code %d: %w", h.comp, ErrUnsupported)
	}
	if versionlz != 1 {
		return h, fmt.Errorf("blosc: %s format version %d: %w", bloscCompressorNames[h.comp], versionlz, ErrUnsupported)
	}
	if h.nblocks > (cbytes-bloscHeaderSize)/4 {
		return h, fmt.Errorf("blosc: %d blocks do not fit a frame of %d bytes: %w", h.nblocks, cbytes, ErrCorrupt)
	}
	return h, nil
}

// block returns block i's range in the decoded buffer.
func (h *bloscHeader) block(i int) (off, n int) {
	off = i * h.blocksize
	return off, min(h.blocksize, h.nbytes-off)
}

// splits returns how many streams block i of n bytes has. This is c-blosc's
// decoder rule, which also covers frames written before the "do not split"
// flag existed: those split every full block whose typesize is at most 16
// and that holds at least 128 elements; the leftover last block is never
// split.
func (h *bloscHeader) splits(i, n int) int {
	leftover := i == h.nblocks-1 && n < h.blocksize
	if !h.noSplit && h.typesize <= bloscMaxSplits && n/h.typesize >= bloscMinBuffer && !leftover {
		return h.typesize
	}
	return 1
}

// blockStart returns the offset of block i's first stream.
func (h *bloscHeader) blockStart(i int) (int, error) {
	pos := int(int32(binary.LittleEndian.Uint32(h.src[bloscHeaderSize+4*i:])))
	if pos < bloscHeaderSize+4*h.nblocks || pos > len(h.src)-4 {
		return 0, fmt.Errorf("blosc: block %d starts at %d of %d bytes: %w", i, pos, len(h.src), ErrCorrupt)
	}
	return pos, nil
}

// stream reads the stream at pos that decodes to n bytes: its compressed
// bytes, whether they are raw, and the position after it.
func (h *bloscHeader) stream(pos, n int) (s []byte, raw bool, next int, err error) {
	if pos < 0 || pos > len(h.src)-4 {
		return nil, false, 0, fmt.Errorf("blosc: stream at %d of %d bytes: %w", pos, len(h.src), ErrCorrupt)
	}
	cs := int(int32(binary.LittleEndian.Uint32(h.src[pos:])))
	pos += 4
	if cs < 0 || cs > len(h.src)-pos {
		return nil, false, 0, fmt.Errorf("blosc: stream at %d claims %d bytes, %d left: %w", pos-4, cs, len(h.src)-pos, ErrCorrupt)
	}
	return h.src[pos : pos+cs], cs == n, pos + cs, nil
}

// ParseBlosc validates a blosc frame's header and block table and lists its
// streams, without decoding anything. It allocates the Streams slice (one
// entry per stream, at most len(src)/4), nothing else. Errors wrap
// ErrCorrupt for a malformed frame (one Decode rejects too) and
// ErrUnsupported for a frame from another format version or an unknown
// inner codec, or one whose blocks share streams so much that listing
// them would take more memory than the frame; a snappy frame parses
// (Compressor "snappy") although this package cannot decode its streams.
func ParseBlosc(src []byte) (*BloscFrame, error) {
	h, err := parseBloscHeader(src)
	if err != nil {
		return nil, err
	}
	f := &BloscFrame{
		Typesize:  h.typesize,
		NBytes:    h.nbytes,
		BlockSize: h.blocksize,
		Shuffle:   h.shuffle,
		Memcpyed:  h.memcpyed,
	}
	if h.comp < len(bloscCompressorNames) {
		f.Compressor = bloscCompressorNames[h.comp]
	}
	if h.nbytes == 0 {
		return f, nil
	}
	if h.memcpyed {
		f.Streams = []BloscStream{{Src: h.src[bloscHeaderSize:], DstLen: h.nbytes, Raw: true}}
		return f, nil
	}
	// Count first, so the slice is allocated once and never beyond what the
	// frame really holds.
	count := 0
	for i := 0; i < h.nblocks; i++ {
		_, n := h.block(i)
		count += h.splits(i, n)
	}
	if count > len(h.src)/4 {
		// Only blocks that share streams get here (every stream takes at
		// least its 4-byte size). Such a frame is corrupt if its table or a
		// size prefix is; otherwise only decoding its streams can tell, so
		// it is left to Decode.
		if err := h.walk(func(BloscStream) {}); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("blosc: %d streams listed in a frame of %d bytes: %w", count, len(h.src), ErrUnsupported)
	}
	f.Streams = make([]BloscStream, 0, count)
	if err := h.walk(func(s BloscStream) { f.Streams = append(f.Streams, s) }); err != nil {
		return nil, err
	}
	return f, nil
}

// walk checks every block's split, its entry in the block table and its
// streams' size prefixes, in frame order, as decodeBlosc does, and hands
// each stream to fn.
func (h *bloscHeader) walk(fn func(BloscStream)) error {
	for i := 0; i < h.nblocks; i++ {
		off, n := h.block(i)
		ns := h.splits(i, n)
		if n%ns != 0 {
			return fmt.Errorf("blosc: block %d of %d bytes split in %d streams: %w", i, n, ns, ErrCorrupt)
		}
		ne := n / ns
		pos, err := h.blockStart(i)
		if err != nil {
			return err
		}
		for j := 0; j < ns; j++ {
			s, raw, next, err := h.stream(pos, ne)
			if err != nil {
				return fmt.Errorf("block %d: %w", i, err)
			}
			fn(BloscStream{Src: s, DstOff: off + j*ne, DstLen: ne, Raw: raw})
			pos = next
		}
	}
	return nil
}

// decodeBlosc decodes a blosc frame into dst, block by block: each block's
// streams go straight to dst when there is no shuffle to undo, else to a
// scratch block that is then unshuffled into dst.
func (d *decoder) decodeBlosc(dst, src []byte) error {
	h, err := parseBloscHeader(src)
	if err != nil {
		return err
	}
	if h.nbytes != len(dst) {
		return fmt.Errorf("blosc: frame decodes to %d bytes, want %d: %w", h.nbytes, len(dst), ErrCorrupt)
	}
	if h.nbytes == 0 {
		return nil
	}
	if h.memcpyed {
		copy(dst, h.src[bloscHeaderSize:])
		return nil
	}
	return d.decodeBloscBlocks(&h, dst, 0, h.nblocks)
}

// decodeBloscBlocks decodes blocks [from, to) of the whole frame h (parsed,
// not memcpyed, decoding to len(dst) bytes) into their places in dst.
// Blocks are independent, so ranges of one frame may decode on several
// goroutines, each with a decoder of its own.
func (d *decoder) decodeBloscBlocks(h *bloscHeader, dst []byte, from, to int) error {
	for i := from; i < to; i++ {
		off, n := h.block(i)
		pos, err := h.blockStart(i)
		if err != nil {
			return err
		}
		if err := d.decodeBlock(h, h.src[pos:], pos, i, dst[off:off+n], len(dst) >= streamStoreMin); err != nil {
			return err
		}
	}
	return nil
}

// decodeBlock decodes block i into out (its n bytes) from view, the
// frame's bytes from offset pos on, where the block's streams start: to
// out when there is no shuffle to undo, else to scratch that is then
// unshuffled into out, past the cache when stream is set (unshuffleTo; the
// caller's destination is at least streamStoreMin). Streams are read from
// view alone, so a partial frame whose view ends early fails rather than
// reading on.
func (d *decoder) decodeBlock(h *bloscHeader, view []byte, pos, i int, out []byte, stream bool) error {
	n := len(out)
	shuffled := h.shuffle == ByteShuffle || (h.shuffle == BitShuffle && n >= h.typesize)
	tmp := out
	if shuffled {
		tmp = d.scratch(n)
	}
	ns := h.splits(i, n)
	if n%ns != 0 {
		return fmt.Errorf("blosc: block %d of %d bytes split in %d streams: %w", i, n, ns, ErrCorrupt)
	}
	ne := n / ns
	rel := 0
	for j := 0; j < ns; j++ {
		s, raw, next, err := streamIn(view, rel, ne)
		if err != nil {
			return fmt.Errorf("blosc: block %d: stream at %d: %w", i, pos+rel, err)
		}
		part := tmp[j*ne : (j+1)*ne]
		if raw {
			copy(part, s)
		} else if err := d.decodeBloscStream(h.comp, part, s); err != nil {
			return fmt.Errorf("blosc: block %d stream %d: %w", i, j, err)
		}
		rel = next
	}
	if shuffled {
		unshuffleBlock(h.shuffle, out, tmp, h.typesize, stream)
	}
	return nil
}

// streamIn reads the stream at rel of view that decodes to n bytes: its
// compressed bytes, whether they are raw, and the position after it.
func streamIn(view []byte, rel, n int) (s []byte, raw bool, next int, err error) {
	if rel < 0 || rel > len(view)-4 {
		return nil, false, 0, fmt.Errorf("%d bytes left, fewer than a stream's size: %w", len(view)-rel, ErrCorrupt)
	}
	cs := int(int32(binary.LittleEndian.Uint32(view[rel:])))
	rel += 4
	if cs < 0 || cs > len(view)-rel {
		return nil, false, 0, fmt.Errorf("claims %d bytes, %d left: %w", cs, len(view)-rel, ErrCorrupt)
	}
	return view[rel : rel+cs], cs == n, rel + cs, nil
}

// decodeBloscStream decodes one compressed stream into exactly len(dst)
// bytes.
func (d *decoder) decodeBloscStream(comp int, dst, src []byte) error {
	switch comp {
	case bloscBlosclz:
		if got := blosclzDecode(dst, src); got != len(dst) {
			return fmt.Errorf("blosclz stream does not decode to %d bytes: %w", len(dst), ErrCorrupt)
		}
		return nil
	case bloscLZ4:
		return decodeLZ4Block(dst, src)
	case bloscZlib:
		return d.decodeZlib(dst, src)
	case bloscZstd:
		return d.decodeZstd(dst, src)
	}
	return fmt.Errorf("inner codec code %d: %w", comp, ErrUnsupported)
}
