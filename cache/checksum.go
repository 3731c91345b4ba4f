package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/cespare/xxhash/v2"
	"github.com/zeebo/xxh3"
)

// A journal record holds a checksum of its file's bytes, of one of two
// kinds:
//
//   - xxh64 of the whole file, as journals before version 3 hold;
//   - a segment hash ("tree"): the file cut at every segSize bytes of its
//     offsets, each segment hashed with XXH3-64, and XXH3-64 of the file's
//     size (8 bytes, little-endian) followed by the segments' hashes (8
//     bytes each, little-endian, in order).
//
// The segment hash is what version 3 writes. A fill writes a blob in
// pieces and hashes each piece just after the kernel copied it, while it
// is in the core's cache (hashPiece): XXH3 hashes a segment handed whole in
// one call about twice as fast as xxh64 hashes the same bytes
// (BenchmarkChecksum; BENCHMARKS.md), and the hash is a fair share of a
// fill's CPU on few cores. A running XXH3 over the whole
// file would copy every byte into its stripe buffer first, which costs
// what it saves. Records of journals before version 3 keep their xxh64,
// which verifies as before; an instance that joins a journal of version 2,
// which older releases share, writes xxh64 (see Cache.treeSums).

// segSize is the segment of the segment hash: a piece of a fill's write
// (hashPiece), so that each piece after the first is whole segments.
const segSize = hashPiece

// checksum is a record's checksum: its value, and whether it is a segment
// hash (else xxh64).
type checksum struct {
	v    uint64
	tree bool
}

// hasher is a running checksum of bytes handed in order.
type hasher interface {
	Write(p []byte) (int, error)
	sum() checksum
}

// newHasher returns a running segment hash, or an xxh64.
func newHasher(tree bool) hasher {
	if tree {
		return &treeHash{}
	}
	return xxh64Hash{xxhash.New()}
}

type xxh64Hash struct{ *xxhash.Digest }

func (h xxh64Hash) sum() checksum { return checksum{v: h.Sum64()} }

// treeHash is the segment hash of the bytes written to it.
type treeHash struct {
	n      int64        // bytes written
	part   *xxh3.Hasher // the current segment, when it comes in pieces
	hashes []byte       // the finished segments' hashes
}

func (t *treeHash) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		at := int(t.n % segSize)
		take := min(segSize-at, len(p))
		if at == 0 && take == segSize {
			t.hashes = binary.LittleEndian.AppendUint64(t.hashes, xxh3.Hash(p[:take]))
		} else {
			if t.part == nil {
				t.part = xxh3.New()
			}
			if at == 0 {
				t.part.Reset()
			}
			t.part.Write(p[:take])
			if at+take == segSize {
				t.hashes = binary.LittleEndian.AppendUint64(t.hashes, t.part.Sum64())
			}
		}
		t.n += int64(take)
		p = p[take:]
	}
	return n, nil
}

func (t *treeHash) sum() checksum {
	hashes := t.hashes
	if t.n%segSize != 0 {
		hashes = binary.LittleEndian.AppendUint64(hashes, t.part.Sum64()) // the last, short segment
	}
	return segmentSum(t.n, hashes)
}

// segmentSum is the segment hash of n bytes whose segments hash to hashes.
func segmentSum(n int64, hashes []byte) checksum {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(hashes)), uint64(n))
	return checksum{v: xxh3.Hash(append(b, hashes...)), tree: true}
}

// sumOf is the checksum of data, of the kind tree says.
func sumOf(data []byte, tree bool) checksum {
	if !tree {
		return checksum{v: xxhash.Sum64(data)}
	}
	hashes := make([]byte, 0, 8*(len(data)/segSize+1))
	for off := 0; off < len(data); off += segSize {
		hashes = binary.LittleEndian.AppendUint64(hashes, xxh3.Hash(data[off:min(off+segSize, len(data))]))
	}
	return segmentSum(int64(len(data)), hashes)
}

// hashFile returns the checksum of the first size bytes of f, of the kind
// tree says, read with ReadAt into buf (a multiple of segSize, so that
// segments are hashed whole).
func hashFile(f *os.File, size int64, buf []byte, tree bool) (checksum, error) {
	h := newHasher(tree)
	var off int64
	for off < size {
		n := int64(len(buf))
		if size-off < n {
			n = size - off
		}
		m, err := f.ReadAt(buf[:n], off)
		h.Write(buf[:m])
		off += int64(m)
		if err != nil && !(errors.Is(err, io.EOF) && off == size) {
			return checksum{}, fmt.Errorf("%s: %w", f.Name(), err)
		}
	}
	return h.sum(), nil
}
