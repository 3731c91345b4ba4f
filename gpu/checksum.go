package gpu

import (
	"fmt"
	"hash"
	"hash/adler32"
	"hash/crc32"

	"github.com/cespare/xxhash/v2"

	"github.com/zarrfs/zarrfs/codec"
)

// This file checks, on the host, the checksums that the compressed
// formats carry over their decoded bytes: nvCOMP checks none of them. One
// pass over the decoded bytes per checksum, while they are in staging or
// just written to the caller's memory.

// newSum returns the running checksum of kind.
func newSum(kind checkKind) hash.Hash {
	switch kind {
	case checkCRC32:
		return crc32.NewIEEE()
	case checkAdler32:
		return adler32.New()
	case checkXXH64:
		return xxhash.New()
	}
	return nil
}

// sum32 is what a trailer of kind holds: the checksum, or for zstd the low
// 32 bits of XXH64.
func sum32(h hash.Hash) uint32 {
	if x, ok := h.(*xxhash.Digest); ok {
		return uint32(x.Sum64())
	}
	return h.(hash.Hash32).Sum32()
}

// mismatch is the verdict on a checksum that does not match its trailer.
// A gzip trailer sits at the end of the chunk and a zstd checksum at the
// end of its frame, so a mismatch means damage the CPU decoder sees as
// well: corrupt. A zlib stream's Adler-32 follows the deflate stream, and
// where that ends only a decode tells: the CPU decoder accepts bytes after
// the trailer, which put another four bytes where the host reads it. So a
// zlib mismatch (standalone or inside blosc) goes to the CPU, which
// decides: the GPU then never calls corrupt what the CPU decodes, and a
// damaged stream fails there as it would have.
func mismatch(kind checkKind, what string, got, want uint32) error {
	class := codec.ErrCorrupt
	if kind == checkAdler32 {
		class = codec.ErrUnsupported
	}
	return fmt.Errorf("%s%s %08x, trailer says %08x: %w", what, kindNames[kind], got, want, class)
}

var kindNames = [...]string{checkCRC32: "CRC-32", checkAdler32: "Adler-32", checkXXH64: "XXH64"}

// checkSum verifies kind's checksum over b[off:off+n]. With elemSize > 1
// the bytes of b were byte swapped in elements of elemSize from b's start
// (the chunk's), and the checksum covers them as they were before.
func checkSum(kind checkKind, want uint32, b []byte, off, n int64, elemSize int, what string) error {
	if kind == checkNone {
		return nil
	}
	h := newSum(kind)
	if elemSize <= 1 {
		h.Write(b[off : off+n])
	} else {
		writeUnswapped(h, b, off, n, int64(elemSize))
	}
	if got := sum32(h); got != want {
		return mismatch(kind, what, got, want)
	}
	return nil
}

// writeUnswapped writes b[off:off+n] to h with the elements of size e
// (counted from b's start) byte swapped back, through a small buffer.
func writeUnswapped(h hash.Hash, b []byte, off, n, e int64) {
	var buf [64 << 10]byte
	step := int64(len(buf)) / e * e
	lo, end := off-off%e, off+n
	for p := lo; p < end; p += step {
		q := min(p+step, alignUp(end, e), int64(len(b)))
		t := buf[:q-p]
		for i := int64(0); i+e <= int64(len(t)); i += e {
			for k := range e {
				t[i+k] = b[p+i+e-1-k]
			}
		}
		if rem := int64(len(t)) % e; rem != 0 {
			copy(t[int64(len(t))-rem:], b[q-rem:q]) // a partial last element is not swapped
		}
		h.Write(t[max(off-p, 0) : min(end, q)-p])
	}
}

// verifyDecoded checks a decoded chunk against the checksums its framing
// carries: out is the chunk as the device decoded it (byte swapped in
// elements of elemSize when elemSize > 1), pre, for a shuffled blosc chunk
// with checked streams, its bytes before unshuffling.
func (p *prepared) verifyDecoded(out, pre []byte, elemSize int) error {
	if err := checkSum(p.check, p.want, out, 0, int64(len(out)), elemSize, ""); err != nil {
		return err
	}
	for _, s := range p.sums {
		b, e := out, elemSize
		if p.shuffle != nil {
			// Outside the region the device byte swaps.
			b, e = pre, 0
		}
		if int64(len(b)) < s.off+s.n {
			return fmt.Errorf("blosc stream at %d: its decoded bytes did not come back to the host: %w", s.off, codec.ErrUnsupported)
		}
		if err := checkSum(checkAdler32, s.want, b, s.off, s.n, e, fmt.Sprintf("blosc zlib stream at %d: ", s.off)); err != nil {
			return err
		}
	}
	return nil
}
