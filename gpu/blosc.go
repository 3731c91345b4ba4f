package gpu

import (
	"fmt"

	"github.com/zarrfs/zarrfs/codec"
)

// bloscAlgos maps a blosc inner codec to the nvCOMP algorithm that decodes
// its streams. blosclz has no GPU decoder: those frames go to the CPU.
var bloscAlgos = map[string]int{
	"lz4":    algoLZ4,
	"zstd":   algoZstd,
	"zlib":   algoDeflate, // zlib streams: header and trailer stripped below
	"snappy": algoSnappy,
}

// prepareBlosc parses the frame on the CPU (codec.ParseBlosc) and turns
// every compressed stream into an nvCOMP piece and every stored one into a
// raw piece; shuffled frames decode into scratch and are unshuffled by the
// kernel, block by block.
func prepareBlosc(j *codec.Job) prepared {
	f, err := codec.ParseBlosc(j.Src)
	if err != nil {
		return prepared{err: fmt.Errorf("gpu: blosc chunk: %w", err)}
	}
	if f.NBytes != len(j.Dst) {
		return corrupt(j, "frame decodes to %d bytes, expected %d", f.NBytes, len(j.Dst))
	}
	algo, ok := bloscAlgos[f.Compressor]
	if !ok && !f.Memcpyed {
		return prepared{err: fmt.Errorf("gpu: blosc chunk: inner codec %q has no GPU decoder: %w", f.Compressor, codec.ErrUnsupported)}
	}
	p := prepared{pieces: make([]piece, 0, len(f.Streams))}
	for i, s := range f.Streams {
		pc := piece{algo: algo, src: s.Src, off: int64(s.DstOff), n: int64(s.DstLen)}
		switch {
		case s.Raw:
			pc.algo = rawPiece
		case f.Compressor == "zlib":
			body, adler, err := zlibBody(s.Src)
			if err != nil {
				if err == errZlibDict {
					return prepared{err: fmt.Errorf("gpu: blosc chunk: stream %d: %v: %w", i, err, codec.ErrUnsupported)}
				}
				return corrupt(j, "stream %d: %v", i, err)
			}
			// nvCOMP checks no Adler-32; the host does, over the stream's
			// decoded bytes as they are before unshuffling (settle).
			pc.src = body
			p.sums = append(p.sums, streamSum{off: pc.off, n: pc.n, want: adler})
		case f.Compressor == "zstd":
			// A damaged zstd stream can make nvCOMP fault; the frame and
			// block headers are checked here (see validate.go).
			frames, err := zstdFrames(s.Src)
			switch {
			case zstdForCPU(err):
				return prepared{err: fmt.Errorf("gpu: blosc chunk: stream %d: %w: %w", i, err, codec.ErrUnsupported)}
			case err != nil:
				return corrupt(j, "stream %d: %v", i, err)
			case len(frames) != 1:
				// Blosc writes one frame per stream; the CPU decides.
				return prepared{err: fmt.Errorf("gpu: blosc chunk: stream %d holds %d zstd frames: %w", i, len(frames), codec.ErrUnsupported)}
			case frames[0].size >= 0 && frames[0].size != pc.n:
				return corrupt(j, "stream %d: zstd frame says %d decoded bytes, expected %d", i, frames[0].size, pc.n)
			case frames[0].checksum:
				// Blosc writes its frames without a checksum; one that has
				// a checksum (another writer, or damage to the frame's
				// header) is verified by the CPU, which can.
				return prepared{err: fmt.Errorf("gpu: blosc chunk: stream %d: a zstd frame with a checksum, which the GPU cannot verify inside blosc: %w", i, codec.ErrUnsupported)}
			}
			pc.src = frames[0].src
			// The stream decodes into device scratch that the host never
			// sees before unshuffling, so no checksum can verify it.
			p.unverified = "blosc zstd streams (no checksum the host can verify)"
		case f.Compressor == "snappy":
			// Damaged snappy streams can make nvCOMP fault; a full walk of
			// the tags proves the stream in bounds (see validate.go).
			if err := snappyCheck(s.Src, pc.n); err != nil {
				return corrupt(j, "stream %d: %v", i, err)
			}
			p.unverified = "blosc snappy streams (the CPU decoder has no snappy)"
		}
		p.pieces = append(p.pieces, pc)
	}
	switch f.Shuffle {
	case codec.ByteShuffle, codec.BitShuffle:
		if f.BlockSize%f.Typesize != 0 {
			// Blosc writes block sizes that are multiples of the typesize;
			// the kernel relies on it. Anything else goes to the CPU.
			return prepared{err: fmt.Errorf("gpu: blosc chunk: blocksize %d is not a multiple of typesize %d: %w",
				f.BlockSize, f.Typesize, codec.ErrUnsupported)}
		}
		mode := uint32(modeByteShuffle)
		if f.Shuffle == codec.BitShuffle {
			mode = modeBitShuffle
		}
		// Blosc 1 frames (format versions 1 and 2, all ParseBlosc takes)
		// leave a block whose element count is not a multiple of 8 as it
		// is rather than bit-shuffling most of it: BitRound 0.
		p.shuffle = &shuffleDesc{NBytes: uint64(f.NBytes), BlockSize: uint32(f.BlockSize),
			TypeSize: uint32(f.Typesize), Mode: mode}
	}
	return p
}
