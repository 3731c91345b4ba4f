package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// Decode decompresses one chunk src, compressed with codec name, into dst.
// It fills exactly len(dst) bytes or returns an error wrapping ErrCorrupt
// (malformed input, or input that decodes to any other size) or
// ErrUnsupported (an unknown codec, a blosc inner codec or format this
// package does not decode). Whatever the input's headers claim, it never
// writes past len(dst) and allocates at most about len(dst) bytes of
// scratch (reused across calls), so hostile input cannot exhaust memory. On
// error the contents of dst are unspecified. Safe for concurrent use.
func Decode(name Name, dst, src []byte) error {
	d := decoderPool.Get().(*decoder)
	err := d.decode(name, dst, src)
	d.release()
	decoderPool.Put(d)
	return err
}

// decoderPool holds the per-goroutine state of Decode callers; workers of a
// CPU decoder own one decoder each instead.
var decoderPool = sync.Pool{New: func() any { return newDecoder() }}

// maxKeptScratch bounds the scratch block a pooled decoder keeps between
// calls: blosc blocks are at most 1 MiB as c-blosc writes them, so larger
// scratch only serves unusual frames and is given back to the GC.
const maxKeptScratch = 8 << 20

// decoder is the reusable state of one decoding goroutine: readers and
// decoders that are expensive to create, and a scratch block for blosc.
// It is not safe for concurrent use.
type decoder struct {
	tmp  []byte
	blk  []byte // a partial read's block decoded for segments that take part of it, or a stream's skipped bytes
	zstd *zstd.Decoder
	zc   *zstdCtx // libzstd's context, made at the first chunk it decodes (libzstd.go)
	gz   *gzip.Reader
	zl   io.ReadCloser
	br   bytes.Reader
	one  [1]byte
}

func newDecoder() *decoder {
	// One block decoder per decoder, used only through DecodeAll, so no
	// goroutines are started and an unreferenced decoder is simply
	// collected. The cap limit makes DecodeAll decode into dst's capacity
	// and fail rather than grow it; MaxMemory is a second, absolute bound.
	z, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(false),
		zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxMemory(1<<31))
	if err != nil {
		panic("codec: zstd.NewReader with static options: " + err.Error())
	}
	return &decoder{zstd: z}
}

// scratch returns a scratch buffer of n bytes.
func (d *decoder) scratch(n int) []byte {
	if cap(d.tmp) < n {
		d.tmp = make([]byte, n)
	}
	return d.tmp[:n]
}

// release drops references to the caller's buffers and oversized scratch.
func (d *decoder) release() {
	d.br.Reset(nil)
	if cap(d.tmp) > maxKeptScratch {
		d.tmp = nil
	}
	if cap(d.blk) > maxKeptScratch {
		d.blk = nil
	}
}

// DecodeJob decodes one job as a CPU decoder's worker does: Decode for a
// whole chunk, or the Segments of a partial one (BloscPart, RawPart). The
// job's Err is left alone.
func DecodeJob(j *Job) error {
	d := decoderPool.Get().(*decoder)
	err := d.job(j)
	d.release()
	decoderPool.Put(d)
	return err
}

func (d *decoder) job(j *Job) error {
	if IsPartial(j.Codec) {
		return d.decodePartial(j)
	}
	return d.decode(j.Codec, j.Dst, j.Src)
}

func (d *decoder) decode(name Name, dst, src []byte) error {
	switch name {
	case Zstd:
		return d.decodeZstd(dst, src)
	case Gzip:
		return d.decodeGzip(dst, src)
	case Zlib:
		return d.decodeZlib(dst, src)
	case LZ4:
		return decodeLZ4(dst, src)
	case Blosc:
		return d.decodeBlosc(dst, src)
	}
	return d.decodeFiltered(name, dst, src) // filters.go
}

// decodeZstd decodes one or more zstd frames into exactly dst. Frame
// checksums, when present, are verified. Chunks of nativeZstdMin bytes or
// more that are zstd and skippable frames end to end go through libzstd
// where it is used (libzstd.go).
func (d *decoder) decodeZstd(dst, src []byte) error {
	if len(dst) < nativeZstdMin {
		return d.decodeZstdGo(dst, src)
	}
	if d.zc == nil {
		d.zc = newZstdCtx() // nil again without libzstd: nativeZstd answers once
	}
	return d.decodeZstdNative(dst, src)
}

// decodeZstdNative is decodeZstd through libzstd for input that is zstd
// and skippable frames end to end, and through the Go decoder for the
// rest and wherever libzstd is not used.
func (d *decoder) decodeZstdNative(dst, src []byte) error {
	if _, frames := walkZstd(src); d.zc != nil && frames {
		return d.zc.decode(dst, src)
	}
	return d.decodeZstdGo(dst, src)
}

// decodeZstdGo is decodeZstd through the Go decoder.
func (d *decoder) decodeZstdGo(dst, src []byte) error {
	// Capacity len(dst): DecodeAll may only write where the caller allows.
	out, err := d.zstd.DecodeAll(src, dst[:0:len(dst)])
	if err != nil {
		return fmt.Errorf("zstd: %w: %w", ErrCorrupt, err)
	}
	if len(out) != len(dst) {
		return fmt.Errorf("zstd: decodes to %d bytes, want %d: %w", len(out), len(dst), ErrCorrupt)
	}
	if len(out) > 0 && &out[0] != &dst[0] {
		// Cannot happen with the cap limit; never return data that is not
		// in dst.
		return fmt.Errorf("zstd: decoder reallocated its output: %w", ErrCorrupt)
	}
	return nil
}

// emptyZlib is a valid zlib stream of no data, used once to create the
// reusable zlib reader (zlib.NewReader insists on a valid header).
var emptyZlib = []byte{0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01}

func (d *decoder) decodeZlib(dst, src []byte) error {
	d.br.Reset(src)
	var err error
	if d.zl == nil {
		if d.zl, err = zlib.NewReader(bytes.NewReader(emptyZlib)); err != nil {
			panic("codec: zlib reader of a static stream: " + err.Error())
		}
	}
	if err = d.zl.(zlib.Resetter).Reset(&d.br, nil); err != nil {
		return fmt.Errorf("zlib: %w: %w", ErrCorrupt, err)
	}
	if err := d.readExactly(d.zl, dst); err != nil {
		return fmt.Errorf("zlib: %w", err)
	}
	return nil
}

// decodeGzip decodes a gzip stream, of one member or several concatenated.
func (d *decoder) decodeGzip(dst, src []byte) error {
	d.br.Reset(src)
	if d.gz == nil {
		d.gz = new(gzip.Reader)
	}
	if err := d.gz.Reset(&d.br); err != nil {
		return fmt.Errorf("gzip: %w: %w", ErrCorrupt, err)
	}
	if err := d.readExactly(d.gz, dst); err != nil {
		return fmt.Errorf("gzip: %w", err)
	}
	return nil
}

// readExactly fills dst from r and checks that r then ends: reading on to
// EOF is also what verifies the stream's checksum.
func (d *decoder) readExactly(r io.Reader, dst []byte) error {
	if _, err := io.ReadFull(r, dst); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return fmt.Errorf("decodes to fewer than %d bytes: %w", len(dst), ErrCorrupt)
		}
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	for {
		n, err := r.Read(d.one[:])
		if n > 0 {
			return fmt.Errorf("decodes to more than %d bytes: %w", len(dst), ErrCorrupt)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
	}
}

// decodeLZ4 decodes numcodecs' LZ4 framing: the decoded size as a 4-byte
// little-endian integer, then one LZ4 block.
func decodeLZ4(dst, src []byte) error {
	if len(src) < 4 {
		return fmt.Errorf("lz4: %d bytes, shorter than the size header: %w", len(src), ErrCorrupt)
	}
	size := int(int32(binary.LittleEndian.Uint32(src)))
	if size != len(dst) {
		return fmt.Errorf("lz4: header says %d bytes, want %d: %w", size, len(dst), ErrCorrupt)
	}
	if size == 0 {
		return nil
	}
	return decodeLZ4Block(dst, src[4:])
}

// decodeLZ4Block decodes one raw LZ4 block into exactly dst.
func decodeLZ4Block(dst, src []byte) error {
	n, err := lz4.UncompressBlock(src, dst)
	if err != nil {
		return fmt.Errorf("lz4: %w: %w", ErrCorrupt, err)
	}
	if n != len(dst) {
		return fmt.Errorf("lz4: block decodes to %d bytes, want %d: %w", n, len(dst), ErrCorrupt)
	}
	return nil
}
