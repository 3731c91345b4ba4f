package gpu

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// emuXXH64 is kernels.cu's xxh64_check for one chunk, step for step: each
// of the four lanes (a thread each on the device) runs its accumulator over
// every whole 32-byte stripe, then lane 0 merges them and hashes the tail
// (xxh64_finish). The device loads a lane's words XXH_G stripes ahead of
// its rounds; the rounds run in stripe order either way, as here.
func emuXXH64(p []byte) uint64 {
	// Variables, not constants: the C arithmetic wraps, Go's constants do not.
	var (
		p1 uint64 = 11400714785074694791
		p2 uint64 = 14029467366897019727
		p3 uint64 = 1609587929392839161
		p4 uint64 = 9650029242287828579
		p5 uint64 = 2870177450012600261
	)
	round := func(acc, in uint64) uint64 {
		acc += in * p2
		return bits.RotateLeft64(acc, 31) * p1
	}
	read64 := func(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
	n := uint64(len(p))
	var v [4]uint64
	for lane := range uint64(4) {
		acc := [4]uint64{p1 + p2, p2, 0, 0 - p1}[lane]
		stripes := n / 32
		q := p[min(8*lane, n):] // read only over whole stripes
		for s := range stripes {
			acc = round(acc, read64(q[32*s:]))
		}
		v[lane] = acc
	}
	var h uint64
	if n >= 32 {
		h = bits.RotateLeft64(v[0], 1) + bits.RotateLeft64(v[1], 7) + bits.RotateLeft64(v[2], 12) + bits.RotateLeft64(v[3], 18)
		for i := range 4 {
			h ^= round(0, v[i])
			h = h*p1 + p4
		}
	} else {
		h = p5
	}
	h += n
	i := n / 32 * 32
	for ; i+8 <= n; i += 8 {
		h ^= round(0, read64(p[i:]))
		h = bits.RotateLeft64(h, 27)*p1 + p4
	}
	if i+4 <= n {
		h ^= uint64(binary.LittleEndian.Uint32(p[i:])) * p1
		h = bits.RotateLeft64(h, 23)*p2 + p3
		i += 4
	}
	for ; i < n; i++ {
		h ^= uint64(p[i]) * p5
		h = bits.RotateLeft64(h, 11) * p1
	}
	h ^= h >> 33
	h *= p2
	h ^= h >> 29
	h *= p3
	h ^= h >> 32
	return h
}

// The device's XXH64 is XXH64: every length up to a few stripes past the
// unrolled runs (each tail path, each count of leftover stripes), large
// chunks, at every alignment of their start, of random and of constant
// bytes.
func TestEmulatedXXH64(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 1))
	buf := make([]byte, 3<<20+64)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	zeros := make([]byte, 4096)
	var lens []int
	for n := range 400 {
		lens = append(lens, n)
	}
	lens = append(lens, 1023, 1024, 1025, 4096+17, 1<<16, 1<<20+5, 3<<20+3)
	for i := 0; i < 200; i++ {
		lens = append(lens, rng.IntN(200000))
	}
	for _, n := range lens {
		off := rng.IntN(61)
		b := buf[off : off+n]
		if got, want := emuXXH64(b), xxhash.Sum64(b); got != want {
			t.Fatalf("%d bytes at offset %d: %016x, xxhash %016x", n, off, got, want)
		}
		if n <= len(zeros) {
			if got, want := emuXXH64(zeros[:n]), xxhash.Sum64(zeros[:n]); got != want {
				t.Fatalf("%d zero bytes: %016x, xxhash %016x", n, got, want)
			}
		}
	}
}
