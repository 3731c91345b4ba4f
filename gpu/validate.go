package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/huff0"

	"github.com/zarrfs/zarrfs/codec"
)

// This file holds the checks a compressed stream passes on the CPU before
// nvCOMP sees it. nvCOMP treats damaged input as undefined behaviour: it
// decodes damaged LZ4 blocks without an error, and some damaged zstd and
// snappy streams make its kernels fault, which ends GPU decoding for the
// process (a CUDA context does not survive a fault). A stream these checks
// reject is reported as corrupt and never reaches the device. The LZ4 walk
// is exact (what it passes, the CPU decoder accepts); the zstd checks read
// headers and entropy table descriptions only, a few dozen bytes per block
// of 128 KiB of output (a block whose tables do not read as tables goes to
// the CPU, which decides); the snappy walk proves a stream in bounds. None
// of them writes anything.

// zstdMaxBlock is Block_Maximum_Size's upper bound (RFC 8878, 3.1.1.2).
const zstdMaxBlock = 128 << 10

// zstdBlockState carries, through the blocks of one frame, which entropy
// tables earlier blocks defined: a block may reuse them (treeless literals,
// repeat mode) only if one did.
type zstdBlockState struct {
	huf bool
	seq [3]bool // literal lengths, offsets, match lengths
}

var errZstdBlock = errors.New("malformed zstd block")

// errZstdTables is a block whose entropy tables do not read as tables: a
// Huffman tree description whose weights, decoded, give more than 11 bits
// a code (or no power of two), an FSE table description of the sequences
// past its bounds. nvCOMP builds its tables from these unchecked and
// faults past them (a damaged chunk's tree ended GPU decoding for the
// process on the H100), so the chunk goes to the CPU, whose verdict it
// gets.
var errZstdTables = errors.New("entropy tables the host cannot read")

// huffScratch keeps the tree reader's tables between chunks.
var huffScratch = sync.Pool{New: func() any { return new(huff0.Scratch) }}

// huffTreeOK reads a Huffman tree description (RFC 8878, 4.2.1) as
// klauspost/compress's decoder does: weights, FSE-coded or not, that
// make a tree of at most 11 bits a code.
func huffTreeOK(desc []byte) bool {
	s := huffScratch.Get().(*huff0.Scratch)
	s2, _, err := huff0.ReadTable(desc, s)
	if s2 != nil {
		huffScratch.Put(s2)
	}
	return err == nil
}

// check reads the headers of one compressed block (RFC 8878, 3.1.1.3):
// the literals section header and, for Huffman-coded literals, the tree
// description's size and the end marker of each stream; the sequences
// section header, its compression modes and the end marker of its
// bitstream. It returns the literals' decoded size.
func (st *zstdBlockState) check(b []byte) (int, error) {
	regen, n, err := st.checkLiterals(b)
	if err != nil {
		return 0, err
	}
	if err := st.checkSequences(b[n:]); err != nil {
		return 0, err
	}
	return regen, nil
}

func badBlock(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errZstdBlock, fmt.Sprintf(format, args...))
}

// checkLiterals reads a block's literals section: it returns the literals'
// decoded size and the section's size in b.
func (st *zstdBlockState) checkLiterals(b []byte) (regen, size int, err error) {
	if len(b) < 2 {
		return 0, 0, badBlock("%d bytes", len(b))
	}
	b0 := int(b[0])
	typ, sf := b0&3, (b0>>2)&3
	var comp, hdr, streams int
	switch typ {
	case 0, 1: // raw or RLE literals
		switch sf {
		case 0, 2:
			hdr, regen = 1, b0>>3
		case 1:
			hdr, regen = 2, b0>>4+int(b[1])<<4
		case 3:
			if len(b) < 3 {
				return 0, 0, badBlock("literals header truncated")
			}
			hdr, regen = 3, b0>>4+int(b[1])<<4+int(b[2])<<12
		}
		comp = regen
		if typ == 1 {
			comp = 1
		}
	default: // Huffman-coded literals, with a new tree (2) or the last one (3)
		hdr, streams = 3+max(sf-1, 0), 4
		if sf == 0 {
			streams = 1
		}
		if len(b) < hdr {
			return 0, 0, badBlock("literals header truncated")
		}
		switch sf {
		case 0, 1:
			regen, comp = b0>>4+int(b[1]&0x3f)<<4, int(b[1])>>6+int(b[2])<<2
		case 2:
			regen, comp = b0>>4+int(b[1])<<4+int(b[2]&3)<<12, int(b[2])>>2+int(b[3])<<6
		case 3:
			regen, comp = b0>>4+int(b[1])<<4+int(b[2]&0x3f)<<12, int(b[2])>>6+int(b[3])<<2+int(b[4])<<10
		}
		if typ == 3 && !st.huf {
			return 0, 0, badBlock("treeless literals with no earlier Huffman tree")
		}
	}
	if regen > zstdMaxBlock {
		return 0, 0, badBlock("%d literal bytes", regen)
	}
	if hdr+comp > len(b) {
		return 0, 0, badBlock("literals section of %d bytes in a %d-byte block", hdr+comp, len(b))
	}
	if streams > 0 {
		lit := b[hdr : hdr+comp]
		if typ == 2 {
			// Tree description: FSE-coded weights (first byte < 128, its
			// value is their size) or 4-bit weights.
			if len(lit) == 0 {
				return 0, 0, badBlock("empty Huffman literals")
			}
			n := 1 + int(lit[0])
			if lit[0] >= 128 {
				n = 1 + (int(lit[0])-127+1)/2
			}
			if n > len(lit) {
				return 0, 0, badBlock("Huffman tree description of %d bytes in %d", n, len(lit))
			}
			if !huffTreeOK(lit[:n]) {
				return 0, 0, errZstdTables
			}
			lit = lit[n:]
			st.huf = true
		}
		ends := []int{len(lit)}
		if streams == 4 {
			if len(lit) < 6 {
				return 0, 0, badBlock("4-stream literals without a jump table")
			}
			s1, s2, s3 := int(binary.LittleEndian.Uint16(lit)), int(binary.LittleEndian.Uint16(lit[2:])), int(binary.LittleEndian.Uint16(lit[4:]))
			if 6+s1+s2+s3 >= len(lit) || s1 == 0 || s2 == 0 || s3 == 0 {
				return 0, 0, badBlock("jump table %d+%d+%d in %d bytes", s1, s2, s3, len(lit)-6)
			}
			ends = []int{6 + s1, 6 + s1 + s2, 6 + s1 + s2 + s3, len(lit)}
		}
		for _, e := range ends {
			// Every Huffman bitstream ends in a byte holding its end mark.
			if e == 0 || lit[e-1] == 0 {
				return 0, 0, badBlock("literals stream without its end mark")
			}
		}
	}
	return regen, hdr + comp, nil
}

// checkSequences reads a block's sequences section, seq (the rest of the
// block after its literals).
func (st *zstdBlockState) checkSequences(seq []byte) error {
	if len(seq) == 0 {
		return badBlock("no sequences section")
	}
	nseq, sh := int(seq[0]), 1
	switch {
	case nseq == 0:
		if len(seq) != 1 {
			return badBlock("%d bytes after a sequences section of no sequences", len(seq)-1)
		}
		return nil
	case nseq == 255:
		if len(seq) < 3 {
			return badBlock("sequences header truncated")
		}
		nseq, sh = int(seq[1])+int(seq[2])<<8+0x7f00, 3
	case nseq >= 128:
		if len(seq) < 2 {
			return badBlock("sequences header truncated")
		}
		nseq, sh = (nseq-128)<<8+int(seq[1]), 2
	}
	if len(seq) < sh+1 {
		return badBlock("no compression modes")
	}
	modes := seq[sh]
	if modes&3 != 0 {
		return badBlock("reserved bits in the compression modes")
	}
	q := sh + 1
	for i, t := range seqTables {
		switch (modes >> (6 - 2*i)) & 3 {
		case 1: // RLE: one symbol
			if q >= len(seq) || int(seq[q]) > t.maxSymbol {
				return fmt.Errorf("%w: %s RLE symbol missing or past %d", errZstdTables, t.name, t.maxSymbol)
			}
			q++
			st.seq[i] = true
		case 2: // FSE table description
			n, err := fseTableSize(seq[q:], t.maxSymbol, t.maxLog)
			if err != nil {
				return fmt.Errorf("%w: %s table: %v", errZstdTables, t.name, err)
			}
			q += n
			st.seq[i] = true
		case 3: // repeat
			if !st.seq[i] {
				return badBlock("repeat mode with no earlier table")
			}
		default:
			st.seq[i] = true
		}
	}
	// The bitstream runs to the end of the block and ends in a byte holding
	// its end mark.
	if q >= len(seq) || seq[len(seq)-1] == 0 {
		return badBlock("sequences bitstream without its end mark")
	}
	return nil
}

// seqTables are the sequences section's three codes, in their order:
// their largest symbol and accuracy log (RFC 8878, 3.1.1.3.2.2; offsets
// to code 30, as the CPU's decoder for small chunks, klauspost/compress,
// reads them: code 31, which libzstd takes, goes to the CPU).
var seqTables = [3]struct {
	name              string
	maxSymbol, maxLog int
}{{"literal lengths", 35, 9}, {"offsets", 30, 8}, {"match lengths", 52, 9}}

// fseTableSize reads an FSE table description (RFC 8878, 4.1.1) at the
// start of b, as the CPU decoder reads it, and returns its size in bytes:
// an accuracy log above maxLog, a symbol above maxSymbol, probabilities
// that do not add up to the table, or a description running past b fail
// it, as they fail the decoder. nvCOMP builds its tables from these
// without checking them, as it does the Huffman trees (one of which made
// it fault on the H100). The bits past b read as zeros.
func fseTableSize(b []byte, maxSymbol, maxLog int) (int, error) {
	pos := 0 // bits read
	// peek returns the 32 bits from pos.
	peek := func() uint32 {
		var v uint64
		for k := range 8 {
			if i := pos/8 + k; i < len(b) {
				v |= uint64(b[i]) << (8 * k)
			}
		}
		return uint32(v >> (pos % 8))
	}
	acc := int(peek()&0xf) + 5
	pos += 4
	if acc > maxLog {
		return 0, fmt.Errorf("accuracy log %d past %d", acc, maxLog)
	}
	remaining := 1<<acc + 1
	threshold := 1 << acc
	nbBits := acc + 1
	symbol := 0
	previous0 := false
	for remaining > 1 && symbol <= maxSymbol {
		if previous0 {
			// Runs of zero probabilities: 2-bit repeat flags, 3 each while 3.
			for {
				r := peek() & 3
				pos += 2
				symbol += int(r)
				if r != 3 {
					break
				}
				if symbol > maxSymbol {
					break
				}
			}
			if symbol > maxSymbol {
				break
			}
		}
		v := peek()
		most := 2*threshold - 1 - remaining
		var count int
		if int(v&uint32(threshold-1)) < most {
			count = int(v & uint32(threshold-1))
			pos += nbBits - 1
		} else {
			count = int(v & uint32(2*threshold-1))
			if count >= threshold {
				count -= most
			}
			pos += nbBits
		}
		count-- // probability -1: "less than 1"
		if count < 0 {
			remaining--
		} else {
			remaining -= count
		}
		symbol++
		previous0 = count == 0
		for remaining < threshold && threshold > 1 {
			nbBits--
			threshold >>= 1
		}
	}
	switch {
	case remaining != 1:
		return 0, fmt.Errorf("probabilities past the table of %d (or symbols past %d)", 1<<acc, maxSymbol)
	case symbol > maxSymbol+1:
		return 0, fmt.Errorf("symbols past %d", maxSymbol)
	case (pos+7)/8 > len(b):
		return 0, fmt.Errorf("description of %d bits in %d bytes", pos, len(b))
	case symbol < 2 || len(b) < 4:
		// Legal, but klauspost/compress, the CPU's decoder for small
		// chunks, refuses a table of one symbol (encoders write RLE) and
		// a description with fewer than 4 bytes after it in the block.
		return 0, fmt.Errorf("a table of %d symbol(s) in %d bytes: the CPU decides", symbol, len(b))
	}
	return (pos + 7) / 8, nil
}

// snappyCheck walks a raw snappy stream's tags without copying anything
// and fails unless it decodes to exactly n bytes with every copy reading
// bytes already written: a stream that passes cannot make a decoder read
// or write out of bounds.
func snappyCheck(src []byte, n int64) error {
	v, k := binary.Uvarint(src)
	if k <= 0 || v > 1<<32-1 {
		return errors.New("snappy length header unreadable")
	}
	if int64(v) != n {
		return fmt.Errorf("snappy header says %d decoded bytes, expected %d", v, n)
	}
	var pos int64
	for p := k; p < len(src); {
		tag := src[p]
		p++
		var length, off int64
		switch tag & 3 {
		case 0: // literal
			m := int(tag >> 2)
			if m >= 60 {
				nb := m - 59
				if p+nb > len(src) {
					return fmt.Errorf("snappy literal length truncated at %d", p)
				}
				var x int64
				for i := range nb {
					x |= int64(src[p+i]) << (8 * i)
				}
				p += nb
				length = x + 1
			} else {
				length = int64(m) + 1
			}
			if length > int64(len(src)-p) {
				return fmt.Errorf("snappy literal of %d bytes overruns the stream at %d", length, p)
			}
			p += int(length)
			pos += length
			if pos > n {
				return fmt.Errorf("snappy stream decodes past %d bytes", n)
			}
			continue
		case 1:
			if p+1 > len(src) {
				return fmt.Errorf("snappy copy truncated at %d", p)
			}
			length, off = 4+int64(tag>>2&7), int64(tag&0xe0)<<3|int64(src[p])
			p++
		case 2:
			if p+2 > len(src) {
				return fmt.Errorf("snappy copy truncated at %d", p)
			}
			length, off = 1+int64(tag>>2), int64(binary.LittleEndian.Uint16(src[p:]))
			p += 2
		case 3:
			if p+4 > len(src) {
				return fmt.Errorf("snappy copy truncated at %d", p)
			}
			length, off = 1+int64(tag>>2), int64(binary.LittleEndian.Uint32(src[p:]))
			p += 4
		}
		if off == 0 || off > pos {
			return fmt.Errorf("snappy copy from offset %d with %d bytes written", off, pos)
		}
		pos += length
		if pos > n {
			return fmt.Errorf("snappy stream decodes past %d bytes", n)
		}
	}
	if pos != n {
		return fmt.Errorf("snappy stream decodes to %d bytes, expected %d", pos, n)
	}
	return nil
}

// lz4Check walks one raw LZ4 block that must decode to exactly n bytes the
// way zarrfs's CPU decoder (pierrec/lz4's UncompressBlock, behind
// codec.Decode) reads it, reading only the tokens, lengths and offsets and
// copying nothing. It returns nil when that decoder accepts the block and
// an error wrapping codec.ErrCorrupt when it rejects it: a literal run or
// length byte past the end of the block, a match offset of zero or before
// the first byte, anything decoding past n bytes, input that ends after
// the literals with a match length left or inside an offset, or a block
// that decodes to fewer than n bytes. Any LZ4 decoder that decodes a block
// passing these checks writes the same n bytes, so nvCOMP's success is no
// longer what accepts a chunk.
//
// The CPU decoder also accepts blocks that break the format's end-of-block
// rules (the last sequence is literals only, the last five bytes are
// literals, no match starts within the last twelve), which every LZ4
// encoder keeps and which fast decoders such as nvCOMP's may rely on to
// copy in wide words. For those it returns an error wrapping
// codec.ErrUnsupported: they go to the CPU, which decides as it always
// does.
func lz4Check(src []byte, n int64) error {
	if len(src) == 0 {
		return fmt.Errorf("empty LZ4 block for %d bytes: %w", n, codec.ErrCorrupt)
	}
	var (
		si        int   // input position
		di        int64 // bytes decoded so far
		lastMatch = int64(-1)
		lastLen   int64
		endsInLit bool
	)
	for si < len(src) {
		tok := src[si]
		si++
		lit := int64(tok >> 4)
		if lit == 15 {
			var ok bool
			if lit, si, ok = lz4Length(src, si, lit); !ok {
				return lz4Bad("literal length runs past the block's end", si, di)
			}
		}
		if lit > int64(len(src)-si) {
			return lz4Bad(fmt.Sprintf("literal run of %d bytes overruns the block", lit), si, di)
		}
		if lit > n-di {
			return lz4Bad(fmt.Sprintf("literal run of %d bytes decodes past %d bytes", lit, n), si, di)
		}
		si += int(lit)
		di += lit
		if si == len(src) {
			if tok&15 != 0 {
				return lz4Bad("block ends with a match length and no offset", si, di)
			}
			endsInLit = true
			break
		}
		if len(src)-si < 2 {
			return lz4Bad("match offset truncated", si, di)
		}
		off := int64(src[si]) | int64(src[si+1])<<8
		si += 2
		if off == 0 || off > di {
			return lz4Bad(fmt.Sprintf("match offset %d", off), si, di)
		}
		ml := int64(tok&15) + 4
		if tok&15 == 15 {
			var ok bool
			if ml, si, ok = lz4Length(src, si, ml); !ok {
				return lz4Bad("match length runs past the block's end", si, di)
			}
		}
		if ml > n-di {
			return lz4Bad(fmt.Sprintf("match of %d bytes decodes past %d bytes", ml, n), si, di)
		}
		lastMatch, lastLen = di, ml
		di += ml
	}
	if di != n {
		return fmt.Errorf("LZ4 block decodes to %d bytes, expected %d: %w", di, n, codec.ErrCorrupt)
	}
	if lastMatch >= 0 && (!endsInLit || lastMatch > n-12 || lastMatch+lastLen > n-5) {
		return fmt.Errorf("LZ4 block breaks the end-of-block rules (last match at %d of %d bytes, %d long; ends in literals: %v): %w",
			lastMatch, n, lastLen, endsInLit, codec.ErrUnsupported)
	}
	return nil
}

// lz4Length adds to v the length bytes at src[si:] (255 means: another
// follows) and returns it with the position after them; ok is false when
// the block ends first.
func lz4Length(src []byte, si int, v int64) (_ int64, _ int, ok bool) {
	for si < len(src) {
		x := src[si]
		si++
		v += int64(x)
		if x != 255 {
			return v, si, true
		}
	}
	return v, si, false
}

func lz4Bad(what string, si int, di int64) error {
	return fmt.Errorf("LZ4 block: %s (input byte %d, output byte %d): %w", what, si, di, codec.ErrCorrupt)
}
