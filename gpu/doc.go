// Package gpu decodes batches of Zarr chunks on an NVIDIA GPU with nvCOMP,
// loaded at run time so that one statically linked binary serves CPU and GPU
// nodes alike.
//
// The one idea: a batch of compressed chunks crosses to the GPU once and
// comes back once. DecodeBatch parses each chunk's framing on the CPU
// (numcodecs LZ4 size header, gzip and zlib wrappers, blosc frames),
// packs every compressed piece into one pinned host buffer, copies it to
// the device in one transfer, decodes with one batched nvCOMP call per
// algorithm (zstd, LZ4, deflate, snappy), undoes blosc's byte and bit
// shuffles and, on request, big-endian byte order with our own kernels, and
// copies every decoded chunk back in one transfer through pinned staging.
// Device and pinned buffers are kept and grown between batches, within
// Options.MaxBatchBytes.
//
// Host copies cost as much as PCIe: packing the compressed bytes into
// staging and copying the decoded bytes out of it move every byte through
// host memory twice more. So the Decoder lends pinned host memory
// (HostAlloc, codec.HostMemory; hostmem.go): a job whose Src lies in it
// crosses to the device straight from there, and one whose Dst lies in it
// comes back straight into it. The zarr package reads compressed chunks
// into that memory and the layout's fills decode into it, so a mount's
// chunks skip both copies. Pieces that land misaligned for nvCOMP are
// first copied into aligned slots on the device.
//
// The CUDA driver (libcuda.so.1) and nvCOMP (libnvcomp.so, found where
// the caller's Libraries say (the command passes ZARRFS_NVCOMP_LIB and the
// Python environment), on the loader path or in a Python site-packages
// folder holding the nvidia-libnvcomp wheel) are bound with purego: no cgo. Probe
// reports what was found, or why nothing was; New fails with an error
// wrapping ErrNoGPU on a machine without them. The kernels are PTX
// (kernels/kernels.cu, compiled with nvcc and checked in) embedded in the
// binary and loaded with cuModuleLoadData; a kernel added to kernels.cu is
// used only once its PTX is checked in (ptxHas), what it does staying on
// the host until then.
//
// Errors are per job, as codec.BatchDecoder wants: a chunk the GPU path does
// not decode (blosc with blosclz, empty chunks, chunks beyond the memory
// bound) gets an Err wrapping codec.ErrUnsupported, so the caller decodes it
// on the CPU; a chunk the host checks find damaged, or whose gzip CRC-32,
// zlib Adler-32 or zstd content checksum does not match what nvCOMP
// decoded, gets one wrapping codec.ErrCorrupt while the rest of the batch
// succeeds.
//
// The GPU accepts a chunk only if the CPU decoder (codec.Decode) would
// accept the same bytes and decode them to the same output. nvCOMP's
// success does not show that: it decodes truncated and bit-flipped LZ4
// blocks without complaint, checks no checksum, and documents damaged
// input as undefined behaviour. So every chunk is checked before nvCOMP
// reads it (prep.go, validate.go), and per codec:
//
//   - LZ4 (numcodecs framing, and blosc's lz4 and lz4hc streams): exact.
//     lz4Check walks every block's tokens, lengths and offsets as the CPU
//     decoder reads them, copying nothing: it passes a block only if that
//     decoder accepts it and it decodes to exactly the expected length, so
//     any decoder writes the same bytes. Blocks the CPU decoder accepts but
//     that break LZ4's end-of-block rules (no encoder writes them, and fast
//     decoders may rely on them) go to the CPU. With Options.WalkOnDevice
//     the walk runs on the device instead (kernels.cu's lz4_walk, lz4Check
//     rule for rule), one thread per block, before nvCOMP in the same
//     stream: a block it rejects is swapped in nvCOMP's arrays for an
//     empty one, so nvCOMP never reads it, and its chunk goes to the CPU,
//     which calls it corrupt (Stats.WalkRejected).
//   - blosc framing: exact. codec.ParseBlosc is the CPU decoder's own
//     reading of the header (version, flags, typesize, nbytes, blocksize,
//     cbytes), block table and stream size prefixes; nbytes must equal
//     len(Dst). Memcpyed frames and stored streams are copied as the CPU
//     copies them.
//   - zstd: a content checksum, when the frame has one, verifies what
//     nvCOMP decoded: on the host, or for a frame decoded into device
//     memory the host never reads (Ring.Decode), on the device
//     (kernels.cu's xxh64_check, once the PTX has it; devhash.go), the
//     host comparing the sums. The host checks the frame, block, literals and
//     sequences headers, which keeps most damage from the device, but
//     damage inside the entropy-coded data passes them, and a check that
//     could tell would cost a decode. So zstd frames without a checksum,
//     chunks of several frames and blosc zstd streams (decoded into device
//     scratch the host never sees) go to the CPU, unless Options.Unverified.
//   - gzip, zlib and blosc zlib streams: the host computes their CRC-32
//     (and the gzip size) or Adler-32 over what nvCOMP decoded, one pass
//     (checksum.go); a blosc chunk's shuffled zlib streams decode into a
//     scratch slot the round copies back, so the host checks the streams'
//     own bytes. A gzip mismatch is corrupt; a zlib one goes to the CPU,
//     which decides (where a deflate stream ends, and so where its
//     Adler-32 sits, only a decode tells, and the CPU decoder accepts
//     bytes after the trailer). The checksums do not make deflate exact:
//     damage that leaves the decoded bytes as they were but breaks a rule
//     the CPU decoder enforces (a stored block's length check, a Huffman
//     tree that is over-full but whose spare codes are never used, bytes
//     inserted between the deflate stream and its trailer) passes them.
//     All deflate goes to the CPU unless Options.Deflate.
//   - blosc snappy: the CPU decoder has none, so nothing to hold nvCOMP to;
//     a full walk of every stream's tags proves it in bounds. To the CPU
//     (which refuses it) unless Options.Unverified.
//   - blosc blosclz: no GPU decoder; the CPU.
//
// What the host checks pass and nvCOMP then fails, or decodes to another
// size, goes to the CPU (ErrUnsupported; Stats.Disagreed counts it): for
// the exact codecs the CPU decoder accepts it, and for the others only it
// can tell. Stats counts what the Decoder decoded, found corrupt and left
// to the CPU.
//
// Some damaged input makes nvCOMP's kernels fault (seen with damaged zstd
// and snappy streams inside blosc frames); the checks above keep most of it
// from the device, but damage inside zstd's entropy-coded data (a match
// offset beyond the history, say) may still fault, with Options.Unverified
// or a checksummed frame. Such a fault poisons the CUDA context: the rounds
// on the device fail, every job wrapping ErrUnsupported so its caller
// retries it on the CPU; the next round resets the primary context, and
// when the driver keeps the error for the life of the process (as CUDA 13
// does) the Decoder turns the GPU path off, logs it once, and sends every
// later job to the CPU. It never returns wrong bytes for a fault.
//
// Other damage makes a kernel loop for good (seen with a blosc zstd chunk
// under Options.Unverified; the host's zstd header checks, which run in
// every mode, do not catch it, since it lies in the entropy-coded data).
// A watchdog (watchdog.go) gives every round a deadline
// (Options.RoundTimeout, longer for larger rounds): past it, every caller
// waiting on the device gets its jobs back for the CPU at once, wrapping
// ErrHung and ErrUnsupported, the Decoder takes no more work (Retired),
// and Close frees nothing the device may still use. Decoded bytes reach
// a caller's pinned Dst only after the round is seen to be done, so a
// device that finishes after its callers were released never writes
// their memory.
//
// nvCOMP 6.0's deflate decoder ignores the output capacity on some damaged
// streams: it reports an error but has written past the end (25 KB past a
// 16.8 KB chunk, 5.5 MB past a 4 MB one, measured on an H200), into the
// next chunk's bytes. Deflate outputs are therefore fenced (see
// fenceGuard): each decodes into a slot of its own behind all other
// output, followed by a guard the device fills with a pattern and the host
// checks; an overrun marks its chunk corrupt and the deflate chunks after
// it ErrUnsupported, and one through the whole tail guard turns the GPU
// path off. Deflate decoding on the GPU is still off unless
// Options.Deflate asks for it.
//
// Concurrency: a Decoder is safe for concurrent use, and concurrent callers
// share the device rather than take turns. Each DecodeBatch reads its jobs'
// framing on its own goroutine and queues them; a submitter goroutine packs
// whatever is queued, from any number of callers with the same elemSize,
// into the next round as soon as one of the two buffer sets is free, and a
// completer goroutine waits for each round and copies its chunks out to
// their callers (both use Options.CopyWorkers goroutines for the copies, so
// one round is packed while another is copied out). Options.Streams rounds
// are in flight at once, each on its own CUDA stream, so that one round's
// host-to-device copy, another's decoding and a third's copy back
// overlap. A caller returns when all its own jobs are done. So the small batches of concurrent readers (a
// sample of a 20-channel view is 20 chunks) decode as one large round,
// which nvCOMP needs to fill a GPU. A caller whose context ends returns at
// once: its jobs still queued are dropped, those on the device are decoded
// but not copied out, and the decoder neither reads nor writes its jobs
// after its DecodeBatch returns (for jobs in pinned memory, which the
// device copies asynchronously, it first waits for their round). Use one Decoder per GPU; Close stops its
// goroutines.
package gpu
