// Package zarr reads Zarr v2 and v3 stores: it parses metadata into one model
// (shape, chunk grid, data type, fill value, dimension names, attributes,
// codec pipeline) and reads rectangular regions of arrays into C-order,
// little-endian buffers. It knows nothing of FUSE, caches or files on disk.
//
// A Hierarchy and its Arrays are immutable once opened and safe for
// concurrent use. Read may be called from many goroutines; the chunks of one
// call are fetched concurrently and decompressed as one batch by the
// configured codec.BatchDecoder.
package zarr

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/objectstore"
)

// ErrChecksum is returned (wrapped) when a crc32c codec's checksum does not match.
var ErrChecksum = errors.New("checksum mismatch")

// ErrNoMetadata is returned (wrapped) by Open when the store's root holds
// no Zarr metadata at all (and Options.EmptyWhenGone is not set).
var ErrNoMetadata = errors.New("no Zarr metadata")

// Options configure Open. The zero value is valid.
type Options struct {
	// Decoder decompresses batches of chunks: the process's one decoding
	// pipeline (package decode), which owns its workers and devices and
	// sends to the CPU what a GPU refuses. Nil means codec.Inline: chunks
	// decode in the goroutine that reads them, and the Hierarchy starts no
	// workers.
	Decoder codec.BatchDecoder
	// Memory, when set, lends the buffers compressed chunks are read into
	// (and, through Hierarchy.Memory, the buffers fills decode into): the
	// GPU's pinned memory, which the device copies without staging. Nil
	// means the Decoder's, when it lends memory, else memory the store
	// allocates for each chunk.
	Memory codec.HostMemory
	// Host, when set, lends the buffers chunks decode into where they do
	// not decode in place (a step of a pipeline of several, a chunk the
	// requests share or use in part), which the decoded-chunk cache may
	// keep: host memory no device copies (decode.Pipeline.Host), since the
	// cache may keep it long. Each buffer goes back once neither the Read
	// nor the cache holds it. Nil means memory allocated for each chunk.
	Host codec.HostMemory
	// Fetchers bounds the source requests in flight per Read call.
	// Zero means 16.
	Fetchers int
	// Logger receives warnings (unsupported arrays). Nil discards them.
	Logger *slog.Logger
	// ChunkCacheBytes bounds an in-memory cache of decoded chunks that a
	// Read used only in part, so that the next samples out of the same
	// chunk (a chunk of 10 time steps serves 10 sample files) do not decode
	// it again. Zero means 256 MiB; negative disables it.
	ChunkCacheBytes int64
	// SourceCache, when set, keeps the compressed bytes read from the store
	// (for remote stores: the disk cache's chunk tier). Read consults it
	// before fetching, and stores bytes only after every chunk of the call
	// decoded and passed its checks, so a corrupt response is never kept.
	// Keys name the object's version (objectstore.Versioned), so the bytes
	// under a key never change; an array with a listing (Hierarchy.List)
	// finds the bytes of the listed version without a request.
	SourceCache SourceCache
	// EmptyWhenGone opens a store whose root holds no Zarr metadata at all
	// (deleted, emptied) as a hierarchy with no arrays and Vanished set,
	// rather than failing: a mount that re-reads its store's metadata
	// then serves what the store holds now, nothing, as it does for an
	// array deleted. Failures to read (a source down) still fail Open.
	EmptyWhenGone bool
	// Limits bound the metadata Open reads and parses (MetadataLimits);
	// the zero value means the documented defaults.
	Limits MetadataLimits
	// LazyVersions bounds the versions the Hierarchy's local lazy listings
	// keep in all (Listing.Bounded): zero means DefaultLazyVersions, negative none.
	LazyVersions int
	// Partial says when a Read fetches and decodes only the part of a
	// chunk it needs (blosc blocks, ranges of uncompressed bytes): the zero
	// value, PartialAuto, when it pays (docs/sources.md says the rule).
	Partial PartialMode
	// Stats, when set, receives the counts of the Hierarchy's work, so
	// that hierarchies opened one after another (a mount that re-reads
	// metadata) add to one set of counters. Nil: the Hierarchy's own.
	Stats *Stats
}

// SourceCache holds compressed source bytes by key. Implementations must be
// safe for concurrent use; Put may drop entries (budget) at will and must
// not keep b after it returns (the reader reuses the buffer); Get returns
// a slice the caller owns.
type SourceCache interface {
	Get(key string) ([]byte, bool)
	Put(key string, b []byte)
}

// StoreHolder is a SourceCache that can tell whether it holds any bytes
// of the Hierarchy's store (cache.ChunkTier.HoldsStore). A lazy listing of
// a remote store (HTTP, GCS arrays of many chunks) made while it does asks
// the version of each chunk it has not learnt before the chunk is read
// (one HEAD or metadata request), so that the cache answers without the
// chunk's bytes being fetched: the chunks were kept under versions an
// earlier listing learnt (`zarrfs warm --compressed`, or a mount's reads
// before a restart or a metadata refresh). Otherwise such a chunk is
// fetched, its version learnt from the response, which costs no request
// more for a chunk the cache cannot hold. An array's first listing asks
// first only if the cache held the store's bytes when the hierarchy made
// its first listing: chunks of other arrays that the hierarchy's own
// reads kept since were learnt by listings of their own, and a cold
// mount's first epoch would pay a request more for every chunk.
type StoreHolder interface {
	HoldsStore() bool
}

// SourceCacheInto is a SourceCache that can read a key's bytes into the
// caller's memory: GetInto calls alloc (when not nil) at most once, only
// when it holds the key, with the bytes' length n, and returns them in
// what alloc returned when that has the capacity (else in memory of its
// own). A Read then reads a whole compressed chunk from the cache straight
// into the memory it would fetch it into (Options.Memory: the GPU's pinned
// memory), exactly its size, with no copy after the read; a miss lends
// nothing. Memory from alloc that the result does not lie in (a miss
// after all: damage found in the read) is the caller's to give back.
type SourceCacheInto interface {
	SourceCache
	GetInto(key string, alloc func(n int) []byte) ([]byte, bool)
}

// Hierarchy is an opened store: every array found, supported or not.
type Hierarchy struct {
	Store objectstore.Store
	// Arrays sorted by Path; includes unsupported arrays (Array.Unsupported != "").
	Arrays []*Array
	// Groups holds the path of every group ("" for the root) and its attributes.
	Groups map[string]map[string]any
	// Vanished is set when the root held no metadata and
	// Options.EmptyWhenGone made an empty hierarchy of it.
	Vanished bool

	opts   Options
	chunks *chunkCache
	mem    codec.HostMemory // lends the buffers compressed chunks are read into; nil: the store's
	host   codec.HostMemory // lends the buffers chunks decode into (Options.Host); nil: allocated
	stats  *Stats
	// lazyKept counts the versions the lazy listings of its arrays keep.
	lazyKept atomic.Int64
	// heldFirst is whether the source cache held bytes of the store
	// when the hierarchy made its first lazy listing (StoreHolder),
	// asked once: what this hierarchy's own reads kept since does not
	// count for an array's first listing.
	heldFirst     bool
	heldFirstOnce sync.Once
	// metaChecks holds, by key, the last read of each metadata document
	// that a Read finding a chunk missing made (*metaCheck).
	metaChecks sync.Map
}

// Array is one Zarr array.
type Array struct {
	// Path is the array's store path, "/"-separated, "" for a root array.
	Path string
	// ZarrFormat is 2 or 3.
	ZarrFormat int
	Shape      []int64
	// Chunks is the (outer) chunk shape: for a sharded array, the shard shape.
	Chunks []int64
	// DType is the source data type. Read always produces little-endian.
	DType DType
	// Dims holds one name per dimension ("" when the store names none).
	Dims []string
	// Attributes are the user attributes (v2 .zattrs less _ARRAY_DIMENSIONS),
	// those that fit Options.Limits.Attributes.
	Attributes map[string]any
	// AttributesLeftOut names, sorted, the attributes the limit left out.
	AttributesLeftOut []string
	// FillValue is the fill value as JSON would carry it: a float64, int64,
	// uint64, bool, or one of the strings "NaN", "Infinity", "-Infinity".
	FillValue any
	// Codecs names the codec pipeline, outermost first (for inspect).
	Codecs []string
	// InnerChunks and InnerCodecs describe a sharded array's innermost
	// chunks (nested shards followed down): their shape and their codecs,
	// outermost first. Nil for an array without sharding_indexed.
	InnerChunks []int64
	InnerCodecs []string
	// MetaHash is a hex SHA-256 of the array's metadata documents; any change
	// of metadata changes it. DataHash leaves out what does not change the
	// bytes of the chunks already written.
	MetaHash string
	// Unsupported is empty for a readable array, otherwise the reason it is
	// left out ("codec 'bitround' is not supported").
	Unsupported string

	h         *Hierarchy
	doc       []byte // the array's metadata document (v3 zarr.json, v2 .zarray)
	listing   arrayListing
	keyPrefix string // "c" for v3 default chunk keys
	keySep    string // "/" or "."
	pipe      *pipeline
	fill      []byte // one element, little-endian
	// consolidated is the key of the consolidated metadata doc came from
	// ("" for the array's own document).
	consolidated string
}

// Request asks for one rectangular region of an array.
type Request struct {
	Array *Array
	// Start and Count give the region, one entry per dimension.
	Start, Count []int64
	// Dst receives the region in C order, little-endian; its length must be
	// product(Count) * DType.Size.
	Dst []byte
}
