// Package codec decompresses Zarr chunks: the bytes-to-bytes codecs of Zarr
// v2 compressors and v3 codec pipelines (zstd, gzip, zlib, lz4 with the
// numcodecs framing, blosc). It knows nothing of arrays or stores.
//
// Decompression is batched: a caller hands a whole set of chunks (every chunk
// one blob fill or one warm batch needs) to a BatchDecoder at once, so the
// CPU decoder can spread them over its workers and the GPU decoder (package
// gpu) can decode them in one nvCOMP call. Every decoder is safe for
// concurrent use; a Job belongs to one caller until DecodeBatch returns.
package codec

import (
	"context"
	"errors"

	"github.com/zarrfs/zarrfs/internal/memory"
)

// Name identifies a decompression codec.
type Name string

// The codecs a Job may name. The same names serve Zarr v2 compressor ids and
// Zarr v3 codec names.
const (
	Zstd  Name = "zstd"  // zstd frames (with or without checksum)
	Gzip  Name = "gzip"  // RFC 1952 gzip stream
	Zlib  Name = "zlib"  // RFC 1950 zlib stream
	LZ4   Name = "lz4"   // numcodecs LZ4: 4-byte little-endian decoded size, then one LZ4 block
	Blosc Name = "blosc" // a Blosc 1 frame (any inner codec, shuffle, split blocks)
)

// ErrCorrupt is returned (wrapped) when data is not what its format says:
// compressed input that is malformed or decodes to a size other than the
// one expected, and (from the packages that read them) a chunk, shard or
// metadata file that cannot be parsed.
var ErrCorrupt = errors.New("corrupt data")

// ErrUnsupported is returned (wrapped) for a codec or a codec option this
// package cannot decode (for example blosc's snappy inner codec), and
// (from package zarr) for any feature of an array zarrfs does not read.
var ErrUnsupported = errors.New("unsupported")

// ErrClosed is returned (wrapped) by DecodeBatch of a BatchDecoder that
// was closed: the CPU decoder, a GPU, the process's pipeline.
var ErrClosed = errors.New("decoder closed")

// Job is one chunk to decompress.
type Job struct {
	Codec Name
	// Src is the compressed chunk. Decoders only read it.
	Src []byte
	// Dst receives the decompressed bytes. Its length is the exact decoded
	// size the array metadata implies: a decoder fills all of it and fails
	// the job with ErrCorrupt if the data decodes to any other size. It
	// never writes past len(Dst) and never allocates more than that on
	// behalf of the input, whatever the input's headers claim.
	Dst []byte
	// Place, where a reader sets it (for a Placer), is where the decoded
	// bytes are wanted: each Segment a range of them and the memory it
	// belongs in (the steps of a chunk of several time steps that a read
	// takes a few of). A decoder that writes those ranges there itself
	// instead of Dst (a GPU decoding into device memory that the
	// Segments' Dst stand for) sets Placed, and the reader copies
	// nothing; where it does not, it fills Dst, from which the reader
	// copies them.
	Place  []Segment
	Placed bool
	// Parts, Segments and Size describe a partial job (BloscPart, RawPart,
	// partial.go): the fetched byte ranges of the stored chunk, the decoded
	// ranges to produce and where, and the chunk's whole decoded size.
	// Src and Dst are then empty.
	Parts    []Part
	Segments []Segment
	Size     int64
	// Err is set by the decoder: nil on success.
	Err error
}

// BatchDecoder decompresses a batch of jobs. It returns a non-nil error only
// when the batch as a whole could not be attempted (a cancelled context, a
// device failure); per-chunk failures are reported in each Job's Err. A
// decoder that cannot take a job's codec sets that job's Err to wrap
// ErrUnsupported, so a caller may retry those jobs elsewhere.
type BatchDecoder interface {
	DecodeBatch(ctx context.Context, jobs []Job) error
}

// A Placer is a BatchDecoder that may write a job's decoded bytes where
// the reader wants them itself (Job.Place): a reader offers Place to it
// alone, sparing other decoders the bookkeeping.
type Placer interface {
	BatchDecoder
	Places() bool
}

// HostMemory is implemented by batch decoders that decode faster from and
// into memory they lend: a GPU decoder's pinned host memory, which the
// device copies directly, without staging. HostAlloc returns n bytes
// (ordinary memory when none is left to lend); HostFree gives back a
// buffer HostAlloc returned, as returned, once no DecodeBatch uses it, and
// ignores any other memory.
//
// It is the process's one kind of memory lender (memory.Lender).
type HostMemory = memory.Lender
