package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// zstdFrame is one zstd frame of a chunk: its bytes and its declared
// decoded size (-1 when the header does not give it).
type zstdFrame struct {
	src      []byte
	size     int64
	checksum bool // the frame ends with a content checksum
}

var errZstdDict = errors.New("zstd frame needs a dictionary")

// zstdForCPU reports whether zstdFrames' err means a stream the GPU path
// does not take but the CPU may decode (a dictionary, entropy tables the
// host cannot read), rather than a damaged one.
func zstdForCPU(err error) bool { return err == errZstdDict || errors.Is(err, errZstdTables) }

// zstdFrames walks the frames of a zstd stream by their headers and block
// headers, without decoding: nvCOMP decodes one frame per chunk, so a chunk
// of several frames becomes several pieces, and skippable frames are
// dropped. It costs a few bytes of reading per 128 KiB block.
func zstdFrames(src []byte) ([]zstdFrame, error) {
	var frames []zstdFrame
	for p := 0; p < len(src); {
		if len(src)-p < 8 {
			return nil, fmt.Errorf("%d trailing bytes after frame %d", len(src)-p, len(frames))
		}
		magic := binary.LittleEndian.Uint32(src[p:])
		if magic&0xfffffff0 == 0x184d2a50 { // skippable frame
			n := int(binary.LittleEndian.Uint32(src[p+4:]))
			if n > len(src)-p-8 {
				return nil, fmt.Errorf("skippable frame of %d bytes overruns the chunk", n)
			}
			p += 8 + n
			continue
		}
		if magic != 0xfd2fb528 {
			return nil, fmt.Errorf("bad zstd magic %08x at %d", magic, p)
		}
		start := p
		fhd := src[p+4]
		p += 5
		if fhd&0x08 != 0 {
			return nil, fmt.Errorf("reserved bit set in frame header")
		}
		single := fhd&0x20 != 0
		if !single {
			p++ // window descriptor
		}
		didSize := [4]int{0, 1, 2, 4}[fhd&3]
		fcsSize := [4]int{0, 2, 4, 8}[fhd>>6]
		if fcsSize == 0 && single {
			fcsSize = 1
		}
		if p+didSize+fcsSize > len(src) {
			return nil, fmt.Errorf("frame header truncated")
		}
		var did uint64
		for i := range didSize {
			did |= uint64(src[p+i]) << (8 * i)
		}
		if did != 0 {
			return nil, errZstdDict
		}
		p += didSize
		size := int64(-1)
		if fcsSize > 0 {
			var v uint64
			for i := range fcsSize {
				v |= uint64(src[p+i]) << (8 * i)
			}
			if fcsSize == 2 {
				v += 256
			}
			if v > 1<<40 {
				return nil, fmt.Errorf("frame claims %d decoded bytes", v)
			}
			size = int64(v)
		}
		p += fcsSize
		var st zstdBlockState
		var decoded int64 // lower bound: raw and RLE blocks, literals
		for last := false; !last; {
			if p+3 > len(src) {
				return nil, fmt.Errorf("block header truncated at %d", p)
			}
			h := uint32(src[p]) | uint32(src[p+1])<<8 | uint32(src[p+2])<<16
			p += 3
			last = h&1 != 0
			n := int(h >> 3)
			if n > zstdMaxBlock {
				return nil, fmt.Errorf("block of %d bytes at %d exceeds the 128 KiB block limit", n, p-3)
			}
			var out int
			switch (h >> 1) & 3 {
			case 0: // raw block
				out = n
			case 1: // RLE block: one byte, repeated n times
				out, n = n, 1
			case 2:
				if n > len(src)-p {
					return nil, fmt.Errorf("block of %d bytes overruns the chunk", n)
				}
				lits, err := st.check(src[p : p+n])
				if err != nil {
					return nil, fmt.Errorf("compressed block at %d: %w", p-3, err)
				}
				out = lits
			case 3:
				return nil, fmt.Errorf("reserved block type at %d", p-3)
			}
			if n > len(src)-p {
				return nil, fmt.Errorf("block of %d bytes overruns the chunk", n)
			}
			p += n
			decoded += int64(out)
		}
		if size >= 0 && decoded > size {
			return nil, fmt.Errorf("blocks hold at least %d decoded bytes, the header says %d", decoded, size)
		}
		if fhd&0x04 != 0 { // content checksum
			if p+4 > len(src) {
				return nil, fmt.Errorf("checksum truncated")
			}
			p += 4
		}
		frames = append(frames, zstdFrame{src: src[start:p], size: size, checksum: fhd&0x04 != 0})
	}
	if len(frames) == 0 {
		return nil, fmt.Errorf("no zstd frame")
	}
	return frames, nil
}
