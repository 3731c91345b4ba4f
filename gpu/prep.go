package gpu

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
)

// This file is the CPU half of a batch: it reads each chunk's framing
// (numcodecs LZ4 header, gzip and zlib wrappers, blosc frames) and turns
// the chunk into pieces nvCOMP decodes, and lays a batch out in the input
// and output buffers. It touches no device, so it is tested without a GPU.

// piece is one part of a chunk's decoded bytes: either an nvCOMP input
// (algo >= 0) or bytes stored raw (algo == rawPiece) copied by a kernel.
type piece struct {
	algo int
	src  []byte
	off  int64 // where the decoded bytes go, from the start of the chunk's target
	n    int64 // decoded length
}

const rawPiece = -1

type checkKind uint8

const (
	checkNone    checkKind = iota
	checkCRC32             // gzip: CRC-32 (IEEE) of the decoded bytes
	checkAdler32           // zlib: Adler-32 of the decoded bytes
	checkXXH64             // zstd content checksum: low 32 bits of XXH64
)

// streamSum is the Adler-32 trailer of one zlib stream inside a blosc
// frame, and where the stream's decoded bytes lie in the frame before
// unshuffling.
type streamSum struct {
	off, n int64
	want   uint32
}

// prepared is one job after its framing has been read.
type prepared struct {
	pieces []piece
	// shuffle, when set, means the pieces decode into a scratch area that
	// the unshuffle kernel then turns into the chunk's bytes.
	shuffle *shuffleDesc
	check   checkKind
	want    uint32
	// sums are checksums over parts of the decoded bytes: each zlib stream
	// of a blosc chunk carries the Adler-32 of what it decodes to, which
	// lies at [off, off+n) of the frame before unshuffling (the round
	// brings those bytes back to the host too, see layout.preAt).
	sums []streamSum
	// walkDevice: the job's LZ4 blocks were not walked on the host
	// (frame, not prepare): the round walks them on the device
	// (lz4_check) before nvCOMP reads them. Set by the caller.
	walkDevice bool
	// devHash: the job's zstd frame is held to its content checksum on the
	// device (xxh64_check), its decoded bytes going to device memory the
	// host never reads (Ring.Decode); set by the caller.
	devHash bool
	// unverified, when set, says why the host cannot hold nvCOMP's verdict
	// on this job to the CPU decoder's: zstd streams whose decoded bytes
	// no checksum verifies (the host checks of zstd are structural only),
	// or snappy streams, which the CPU decoder does not decode at all.
	// Such jobs decode on the GPU only with Options.Unverified.
	unverified string
	err        error
}

// prepare reads one job's framing and checks its streams on the host
// (frame, checkStreams): what it accepts, the CPU decoder accepts too, for
// every codec whose checks are exact (see the package doc). Errors wrap
// codec.ErrCorrupt for input the CPU decoder rejects as well, and
// codec.ErrUnsupported for what the GPU path does not decode (the CPU
// then takes the job).
func prepare(j *codec.Job) prepared {
	p := frame(j)
	if p.err == nil {
		p.err = checkStreams(j, p.pieces)
	}
	return p
}

// checkStreams walks every LZ4 piece of a framed job (lz4Check): nvCOMP's
// LZ4 decoder succeeds on damaged blocks that the CPU decoder rejects
// (a truncated block, a flipped bit), so its success does not decide.
func checkStreams(j *codec.Job, pieces []piece) error {
	for i, pc := range pieces {
		if pc.algo != algoLZ4 {
			continue
		}
		if err := lz4Check(pc.src, pc.n); err != nil {
			if len(pieces) == 1 {
				return fmt.Errorf("gpu: %s chunk: %w", j.Codec, err)
			}
			return fmt.Errorf("gpu: %s chunk: stream %d: %w", j.Codec, i, err)
		}
	}
	return nil
}

// frame reads one job's framing and turns it into pieces, with the zstd
// and snappy checks that keep nvCOMP's kernels from faulting, but without
// checkStreams' walk of LZ4 blocks.
func frame(j *codec.Job) prepared {
	n := int64(len(j.Dst))
	if n == 0 {
		// nvCOMP rejects empty chunks; the CPU handles them trivially.
		return prepared{err: fmt.Errorf("gpu: %s chunk decoding to 0 bytes: %w", j.Codec, codec.ErrUnsupported)}
	}
	switch j.Codec {
	case codec.Zstd:
		frames, err := zstdFrames(j.Src)
		if zstdForCPU(err) {
			return prepared{err: fmt.Errorf("gpu: zstd chunk: %w: %w", err, codec.ErrUnsupported)}
		}
		if err != nil {
			return corrupt(j, "%v", err)
		}
		if len(frames) == 1 {
			if s := frames[0].size; s >= 0 && s != n {
				return corrupt(j, "frame header says %d decoded bytes, expected %d", s, n)
			}
			p := prepared{pieces: []piece{{algo: algoZstd, src: frames[0].src, n: n}}, unverified: "zstd frame without a content checksum"}
			// nvCOMP does not check the frame's content checksum; the host
			// does, while copying the chunk out.
			if f := frames[0].src; f[4]&0x04 != 0 {
				p.check, p.want = checkXXH64, binary.LittleEndian.Uint32(f[len(f)-4:])
				p.unverified = ""
			}
			return p
		}
		// Several frames: each becomes a piece at its offset, which needs
		// every frame's decoded size.
		p := prepared{pieces: make([]piece, 0, len(frames)), unverified: "zstd chunk of several frames (no checksum checked)"}
		var off int64
		for _, f := range frames {
			if f.size < 0 {
				return prepared{err: fmt.Errorf("gpu: zstd chunk of %d frames without content sizes: %w", len(frames), codec.ErrUnsupported)}
			}
			if f.size > 0 {
				p.pieces = append(p.pieces, piece{algo: algoZstd, src: f.src, off: off, n: f.size})
			}
			off += f.size
		}
		if off != n {
			return corrupt(j, "frames hold %d decoded bytes, expected %d", off, n)
		}
		return p
	case codec.LZ4:
		// numcodecs framing: decoded size (uint32 LE), then one raw block.
		if len(j.Src) < 4 {
			return corrupt(j, "%d bytes is too short for the LZ4 size header", len(j.Src))
		}
		if got := int64(binary.LittleEndian.Uint32(j.Src)); got != n {
			return corrupt(j, "LZ4 header says %d decoded bytes, expected %d", got, n)
		}
		return prepared{pieces: []piece{{algo: algoLZ4, src: j.Src[4:], n: n}}}
	case codec.Gzip:
		body, crc, size, err := gzipBody(j.Src)
		if err != nil {
			return corrupt(j, "%v", err)
		}
		if int64(size) != n&0xffffffff {
			// Corrupt, or a file of several gzip members (the trailer then
			// holds the last member's size): the CPU decoder tells which.
			return prepared{err: fmt.Errorf("gpu: gzip chunk: trailer says %d decoded bytes, expected %d (several members?): %w",
				size, n, codec.ErrUnsupported)}
		}
		return prepared{pieces: []piece{{algo: algoDeflate, src: body, n: n}}, check: checkCRC32, want: crc}
	case codec.Zlib:
		body, adler, err := zlibBody(j.Src)
		if err != nil {
			if err == errZlibDict {
				return prepared{err: fmt.Errorf("gpu: zlib chunk: %v: %w", err, codec.ErrUnsupported)}
			}
			return corrupt(j, "%v", err)
		}
		return prepared{pieces: []piece{{algo: algoDeflate, src: body, n: n}}, check: checkAdler32, want: adler}
	case codec.Blosc:
		return prepareBlosc(j)
	}
	return prepared{err: fmt.Errorf("gpu: codec %q: %w", j.Codec, codec.ErrUnsupported)}
}

// uses reports whether any piece goes to nvCOMP algorithm algo.
func (p prepared) uses(algo int) bool {
	for _, pc := range p.pieces {
		if pc.algo == algo {
			return true
		}
	}
	return false
}

func corrupt(j *codec.Job, format string, args ...any) prepared {
	return prepared{err: fmt.Errorf("gpu: %s chunk: %s: %w", j.Codec, fmt.Sprintf(format, args...), codec.ErrCorrupt)}
}

// gzipBody returns the raw deflate stream of a single-member gzip file
// (RFC 1952) with its trailer's CRC-32 and size. It refuses every header
// the CPU's gzip reader refuses: reserved flag bits set, a name or
// comment of 512 bytes or more (its buffer), a header CRC that does not
// match.
func gzipBody(src []byte) (body []byte, crc, size uint32, err error) {
	const (
		fhcrc     = 1 << 1
		fextra    = 1 << 2
		fname     = 1 << 3
		fcomment  = 1 << 4
		maxString = 512 // the CPU reader's buffer, NUL included
	)
	if len(src) < 18 {
		return nil, 0, 0, fmt.Errorf("%d bytes is too short for gzip", len(src))
	}
	if src[0] != 0x1f || src[1] != 0x8b || src[2] != 8 {
		return nil, 0, 0, fmt.Errorf("not a gzip deflate stream (header % x)", src[:3])
	}
	flg := src[3]
	if flg>>5 != 0 {
		return nil, 0, 0, fmt.Errorf("gzip header flags %#x: reserved bits set", flg)
	}
	p := 10
	end := len(src) - 8
	if flg&fextra != 0 {
		if p+2 > end {
			return nil, 0, 0, fmt.Errorf("gzip extra field truncated")
		}
		p += 2 + int(binary.LittleEndian.Uint16(src[p:]))
	}
	for _, f := range []byte{fname, fcomment} {
		if flg&f == 0 {
			continue
		}
		start := p
		for p < end && src[p] != 0 {
			p++
		}
		p++ // the terminating NUL
		if p-start > maxString {
			return nil, 0, 0, fmt.Errorf("gzip header name or comment of %d bytes or more", maxString)
		}
	}
	if flg&fhcrc != 0 {
		if p+2 >= end {
			return nil, 0, 0, fmt.Errorf("gzip header runs into the trailer")
		}
		if got, want := uint16(crc32.ChecksumIEEE(src[:p])), binary.LittleEndian.Uint16(src[p:]); got != want {
			return nil, 0, 0, fmt.Errorf("gzip header CRC %#04x, its bytes hash to %#04x", want, got)
		}
		p += 2
	}
	if p >= end {
		return nil, 0, 0, fmt.Errorf("gzip header runs into the trailer")
	}
	return src[p:end], binary.LittleEndian.Uint32(src[end:]), binary.LittleEndian.Uint32(src[end+4:]), nil
}

var errZlibDict = fmt.Errorf("zlib preset dictionary")

// zlibBody returns the raw deflate stream of a zlib stream (RFC 1950) and
// its Adler-32 trailer.
func zlibBody(src []byte) (body []byte, adler uint32, err error) {
	if len(src) < 7 {
		return nil, 0, fmt.Errorf("%d bytes is too short for zlib", len(src))
	}
	cmf, flg := src[0], src[1]
	if cmf&0x0f != 8 || cmf>>4 > 7 || (uint16(cmf)<<8|uint16(flg))%31 != 0 {
		return nil, 0, fmt.Errorf("bad zlib header % x", src[:2])
	}
	if flg&0x20 != 0 {
		return nil, 0, errZlibDict
	}
	return src[2 : len(src)-4], binary.BigEndian.Uint32(src[len(src)-4:]), nil
}

// Alignment of the slots the layout hands out. 256 bytes is cudaMalloc's own
// alignment; every nvCOMP algorithm needs at most 8 and our kernels 8.
const (
	inAlign  = 16
	outAlign = 256
)

func alignUp(x, a int64) int64 { return (x + a - 1) / a * a }

// addrOf is the address of b's first byte (of its array, when empty).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// piecesWithin reports whether every piece's bytes lie inside src, as they
// must for src to be copied to the device whole in their place.
func piecesWithin(src []byte, pieces []piece) bool {
	lo := addrOf(src)
	hi := lo + uintptr(len(src))
	for _, pc := range pieces {
		a := addrOf(pc.src)
		if len(pc.src) > 0 && (a < lo || a+uintptr(len(pc.src)) > hi) {
			return false
		}
	}
	return len(src) > 0
}

// segRef is one nvCOMP input placed in the buffers.
type segRef struct {
	job    int // index into the batch's jobs
	src    []byte
	inOff  int64 // offset of the compressed bytes in the input buffer
	outOff int64 // offset where nvCOMP writes, in the output buffer
	n      int64
	// direct: src is not packed: it reaches the device with its job's
	// whole Src (see layout.direct).
	direct bool
}

// directIn is one job whose Src crosses to the device as it is, from
// pinned memory, into [off, off+len(src)) of the device's input buffer.
type directIn struct {
	job int
	src []byte
	off int64
}

// copyRef is one scattered copy: from the input buffer (raw blosc streams)
// or from the output buffer (streams decoded into an aligned scratch slot).
type copyRef struct {
	fromInput   bool
	src, dst, n int64
}

// layout is one sub-batch placed in the input and output buffers. Offsets
// become device addresses once the buffers exist (fill).
type layout struct {
	jobs     []int   // indices of the jobs in this sub-batch
	finalOff []int64 // per entry of jobs: offset of its decoded bytes in the output buffer
	finalLen []int64 // and their length

	segs     [numAlgos][]segRef
	raws     []segRef // raw pieces: packed like inputs, copied by scatter_copy
	copies   []copyRef
	shuffles []shuffleDesc // Src, Dst are offsets into the output buffer here
	// largest decoded piece and the total per algorithm, for GetTempSize
	maxPiece, totPiece [numAlgos]int64

	arrOff  [numAlgos]int64 // per algorithm: 4 arrays of len(segs) uint64s
	copyOff int64           // copy descriptors
	shufOff int64           // shuffle descriptors
	inSize  int64           // bytes packed on the host and copied in one transfer

	// Jobs whose Src is in pinned memory: copied to the device each on its
	// own, after the packed bytes. Their pieces are read where they land,
	// unless one is misaligned for nvCOMP: it is first copied on the device
	// (precopies, descriptors at preOff) into an aligned slot.
	direct    []directIn
	precopies []copyRef
	preOff    int64
	devIn     int64 // the device input buffer's size

	finalEnd int64 // end of the decoded chunks (byte swapping covers [0, finalEnd))
	// preAt, per entry of jobs, is where a shuffled job whose streams the
	// host checks (prepared.sums) is decoded before unshuffling: inside
	// the region copied back, after the decoded chunks, so that the host
	// sees the streams' own bytes. -1 for every other job.
	preAt     []int64
	actualOff int64 // nvCOMP's decoded sizes, one uint64 per segment, algorithms in order
	statusOff int64 // nvCOMP's statuses, one int32 per segment
	walkOff   int64 // lz4_check's verdicts, one uint32 per LZ4 segment (0: the walk accepts it)
	hashes    []hashRef
	walk      bool  // a job's LZ4 blocks are walked on the device (prepared.walkDevice)
	hashDesc  int64 // xxh64_check's descriptors, one per entry of hashes
	hashOff   int64 // and its sums, one uint32 each
	probeOff  int64 // fence probes: probeLen bytes per entry of probes
	d2h       int64 // bytes copied back: chunks, sizes, statuses, walk verdicts and probes
	// hostLo is where the host's copy of the output buffer begins (the
	// staging holds [hostLo, d2h)): the first chunk that comes back
	// through the staging, or the end of the chunks when each goes
	// straight to its Dst (pinned memory, or a ring slot on the device),
	// so that such a round stages its few results, not its chunks' room.
	hostLo  int64
	outSize int64 // with scratch
	nsegs   int

	// The fence (see fenceDeflate): deflate segments decode into slots of
	// [fenceOff, fenceEnd), which the device fills with fencePattern first;
	// the guard after each slot, and the end of the tail guard, are copied
	// to the probes.
	fenceOff, fenceEnd int64
	probes             []fenceProbe
}

// fenceProbe is one probed guard: the first probeLen bytes after deflate
// segment seg's slot or, for seg -1, the last probeLen bytes of the tail
// guard.
type fenceProbe struct {
	seg int // index into segs[algoDeflate]; -1: end of the tail guard
	at  int64
}

// The fence around deflate outputs. On an H200, nvCOMP 6's deflate decoder
// wrote, for a damaged stream, past the output capacity it was given and
// into the neighbouring chunk's bytes with no error. With the fence, every
// deflate segment decodes into a slot of its own after all other output,
// followed by a guard; the slots are copied into place only afterwards, and
// a changed guard marks that segment corrupt and the slots after it as
// untrusted. An overrun that reaches the end of the tail guard (at least
// fenceTail, and twice the largest deflate stream's output) may have left
// the buffer: the decoder then stops using the GPU.
const (
	fenceGuard   = 256 // an overrun need only be seen: the slots after it are not trusted
	fenceTail    = 1 << 20
	probeLen     = 64
	fencePattern = uint32(0x3cc3a55a)
)

// cost estimates the buffer bytes a prepared job needs, to split batches.
func (p *prepared) cost(n int64) int64 {
	c := alignUp(n, outAlign)
	if p.shuffle != nil {
		c *= 2
	}
	for _, pc := range p.pieces {
		c += alignUp(int64(len(pc.src)), inAlign) + 64
		if pc.algo == algoDeflate {
			c += alignUp(pc.n, outAlign) + fenceGuard // its fenced slot
		}
	}
	return c
}

// layoutBatch places the jobs idx (all prepared without error) in the
// buffers. outAligns gives, per algorithm, the output alignment nvCOMP needs.
//
// Input buffer: compressed pieces (16-byte aligned), then per algorithm the
// four arrays nvCOMP reads (input pointers, input sizes, output capacities,
// output pointers), then copy and shuffle descriptors. Output buffer: the
// decoded chunks (256-byte aligned), nvCOMP's sizes and statuses (these
// two regions come back to the host in one copy), then scratch.
//
// With fence, deflate segments decode into fenced slots after everything
// else (see fenceGuard).
//
// pinnedSrc, when set, tells per entry of idx whether the job's Src lies in
// pinned host memory; inAligns gives nvCOMP's input alignment per
// algorithm, which pieces read in place must meet.
func layoutBatch(jobs []codec.Job, preps []prepared, idx []int, outAligns, inAligns [numAlgos]int64, fence bool, pinnedSrc func(k int) bool) *layout {
	l := &layout{jobs: idx, finalOff: make([]int64, len(idx)), finalLen: make([]int64, len(idx))}
	var nshuf, nhash int
	for _, ji := range idx {
		p := &preps[ji]
		l.walk = l.walk || p.walkDevice
		if p.shuffle != nil {
			nshuf++
		}
		if p.devHash {
			nhash++
		}
	}
	var out int64
	for k, ji := range idx {
		out = alignUp(out, outAlign)
		l.finalOff[k] = out
		l.finalLen[k] = int64(len(jobs[ji].Dst))
		out += l.finalLen[k]
	}
	l.finalEnd = out

	var in int64
	inOff := make([][]int64, len(idx))
	direct := make([]bool, len(idx))
	var nDirect, nRaw int
	for k, ji := range idx {
		p := &preps[ji]
		inOff[k] = make([]int64, len(p.pieces))
		direct[k] = pinnedSrc != nil && pinnedSrc(k) && piecesWithin(jobs[ji].Src, p.pieces)
		for i, pc := range p.pieces {
			if pc.algo != rawPiece {
				l.nsegs++
			} else {
				nRaw++
			}
			if direct[k] {
				nDirect++
				continue // placed after the packed bytes, below
			}
			in = alignUp(in, inAlign)
			inOff[k][i] = in
			in += int64(len(pc.src))
		}
	}
	in = alignUp(in, 8)
	// Segments are numbered per algorithm; count first to place the arrays.
	var nAlgo [numAlgos]int
	for _, ji := range idx {
		for _, pc := range preps[ji].pieces {
			if pc.algo != rawPiece {
				nAlgo[pc.algo]++
			}
		}
	}
	for a := range numAlgos {
		l.arrOff[a] = in
		in += 4 * 8 * int64(nAlgo[a])
	}
	nProbes := 0
	if fence && nAlgo[algoDeflate] > 0 {
		nProbes = nAlgo[algoDeflate] + 1
	}
	l.copyOff = in
	in += int64(copyDescSize) * int64(nRaw+l.nsegs+nProbes) // worst case: every piece copied, and the probes
	in = alignUp(in, 8)
	l.shufOff = in
	in += int64(shuffleDescSize) * int64(nshuf)
	l.hashDesc = in
	in += int64(hashDescSize) * int64(nhash)
	l.preOff = in
	in += int64(copyDescSize) * int64(nDirect) // worst case: every direct piece misaligned
	l.inSize = in

	in = l.placeDirect(jobs, preps, direct, inOff, inAligns, in)
	l.devIn = in
	for k, ji := range idx {
		for i, pc := range preps[ji].pieces {
			if pc.algo == rawPiece {
				l.raws = append(l.raws, segRef{job: k, src: pc.src, inOff: inOff[k][i], n: pc.n, direct: direct[k]})
			}
		}
	}

	l.preAt = make([]int64, len(idx))
	for k, ji := range idx {
		l.preAt[k] = -1
		if p := &preps[ji]; p.shuffle != nil && len(p.sums) > 0 {
			out = alignUp(out, outAlign)
			l.preAt[k] = out
			out += int64(len(jobs[ji].Dst))
		}
	}
	out = alignUp(out, 8)
	l.actualOff = out
	out += 8 * int64(l.nsegs)
	l.statusOff = out
	out += 4 * int64(l.nsegs)
	l.walkOff = out
	out += 4 * int64(nAlgo[algoLZ4])
	l.hashOff = out
	out += 4 * int64(nhash)
	out = alignUp(out, 8)
	l.probeOff = out
	out += probeLen * int64(nProbes)
	l.d2h = out
	reserve := func(n, align int64) int64 {
		out = alignUp(out, max(align, outAlign))
		at := out
		out += n
		return at
	}
	fences := l.placeSegments(jobs, preps, inOff, direct, outAligns, fence, reserve)
	if len(fences) > 0 {
		out = l.placeFences(fences, outAligns, out)
	}
	l.outSize = alignUp(out, outAlign)
	return l
}

// fenced is a deflate segment decoded into a fenced slot (see fenceGuard):
// seg indexes l.segs[algoDeflate], dst is where its bytes go.
type fenced struct {
	seg int
	dst int64
}

// placeDirect places the Src of the jobs whose pieces are read in place
// (direct) after the packed bytes, from in, and the device-side copies of
// their misaligned pieces into aligned slots after them; it sets the
// pieces' input offsets and returns the end of the input buffer.
func (l *layout) placeDirect(jobs []codec.Job, preps []prepared, direct []bool, inOff [][]int64, inAligns [numAlgos]int64, in int64) int64 {
	// Each direct job's Src lands so that its device address agrees with
	// its host address modulo 256: a piece aligned in host memory is then
	// aligned on the device (the buffer itself is 256-byte aligned).
	for k, ji := range l.jobs {
		if !direct[k] {
			continue
		}
		src := jobs[ji].Src
		base := addrOf(src)
		in = alignUp(in, 256) + int64(base%256)
		l.direct = append(l.direct, directIn{job: k, src: src, off: in})
		for i, pc := range preps[ji].pieces {
			at := in
			if len(pc.src) > 0 {
				at += int64(addrOf(pc.src) - base)
			}
			inOff[k][i] = at
			if pc.algo != rawPiece && at%max(inAligns[pc.algo], 1) != 0 {
				inOff[k][i] = -1 - at // an aligned slot comes below
			}
		}
		in += int64(len(src))
	}
	for k := range l.jobs {
		if !direct[k] {
			continue
		}
		for i, pc := range preps[l.jobs[k]].pieces {
			if at := inOff[k][i]; at < 0 {
				in = alignUp(in, inAlign)
				l.precopies = append(l.precopies, copyRef{fromInput: true, src: -1 - at, dst: in, n: int64(len(pc.src))})
				inOff[k][i] = in
				in += int64(len(pc.src))
			}
		}
	}
	return in
}

// placeSegments places every piece's output: nvCOMP segments where their
// bytes go (or an aligned scratch slot, reserved with reserve, copied into
// place), raw pieces as copies, shuffled jobs' bytes before unshuffling,
// the device's checksums; it returns the deflate segments to fence.
func (l *layout) placeSegments(jobs []codec.Job, preps []prepared, inOff [][]int64, direct []bool, outAligns [numAlgos]int64,
	fence bool, reserve func(n, align int64) int64) []fenced {
	var fences []fenced
	for k, ji := range l.jobs {
		p := &preps[ji]
		base := l.finalOff[k]
		if p.shuffle != nil {
			sd := *p.shuffle
			if base = l.preAt[k]; base < 0 {
				base = reserve(int64(len(jobs[ji].Dst)), outAlign)
			}
			sd.Src, sd.Dst = uint64(base), uint64(l.finalOff[k])
			l.shuffles = append(l.shuffles, sd)
		}
		for i, pc := range p.pieces {
			dst := base + pc.off
			if pc.algo == rawPiece {
				l.copies = append(l.copies, copyRef{fromInput: true, src: inOff[k][i], dst: dst, n: pc.n})
				continue
			}
			a := pc.algo
			l.maxPiece[a] = max(l.maxPiece[a], pc.n)
			l.totPiece[a] += pc.n
			ref := segRef{job: k, src: pc.src, inOff: inOff[k][i], outOff: dst, n: pc.n, direct: direct[k]}
			if fence && a == algoDeflate {
				fences = append(fences, fenced{len(l.segs[a]), dst})
			} else if dst%outAligns[a] != 0 {
				// Misaligned for nvCOMP (blosc streams of odd sizes): decode
				// into an aligned scratch slot, then copy into place.
				ref.outOff = reserve(pc.n, outAligns[a])
				l.copies = append(l.copies, copyRef{src: ref.outOff, dst: dst, n: pc.n})
			}
			if p.devHash {
				// Where nvCOMP writes, before a kernel moves or swaps it.
				l.hashes = append(l.hashes, hashRef{job: k, at: ref.outOff, n: pc.n, want: p.want})
			}
			l.segs[a] = append(l.segs[a], ref)
		}
	}
	return fences
}

// placeFences lays the fenced deflate slots, their guards and the tail
// guard out from out, with the copies of the slots into place and of the
// probes, and returns the end of the output buffer.
func (l *layout) placeFences(fences []fenced, outAligns [numAlgos]int64, out int64) int64 {
	out = alignUp(out, outAlign)
	l.fenceOff = out
	for _, f := range fences {
		s := &l.segs[algoDeflate][f.seg]
		s.outOff = alignUp(out, max(outAligns[algoDeflate], outAlign))
		l.copies = append(l.copies, copyRef{src: s.outOff, dst: f.dst, n: s.n})
		// The guard starts at the next 256-byte boundary, so that a
		// decoder rounding its last store up to a word stays clear of it.
		out = alignUp(s.outOff+s.n, outAlign)
		l.probes = append(l.probes, fenceProbe{seg: f.seg, at: out})
		out += fenceGuard
	}
	// On an H200, a 4 MB zlib stream zeroed from a third on made
	// nvCOMP write 5.5 MB past its output: the tail guard grows with
	// the largest stream, so that such an overrun is caught inside the
	// fence rather than taken for one that escaped it.
	out += max(fenceTail, alignUp(2*l.maxPiece[algoDeflate], outAlign)) - fenceGuard
	l.probes = append(l.probes, fenceProbe{seg: -1, at: out - probeLen})
	l.fenceEnd = out
	for i, pr := range l.probes {
		l.copies = append(l.copies, copyRef{src: pr.at, dst: l.probeOff + probeLen*int64(i), n: probeLen})
	}
	return out
}

// staged is the host's copy (hout, the staging) of the output buffer from
// its byte off on; off is at or past hostLo.
func (l *layout) staged(hout []byte, off int64) []byte { return hout[off-l.hostLo:] }

// stageFrom sets hostLo for a round whose jobs' Dst directOut says go
// straight to them (not through the staging).
func (l *layout) stageFrom(directOut []bool) {
	l.hostLo = l.finalEnd
	for k, direct := range directOut {
		if !direct {
			l.hostLo = min(l.hostLo, l.finalOff[k])
		}
	}
}

// fenceCheck reads a fenced round's probes from the host copy of its
// output buffer. It returns, per job of the round (an index into l.jobs),
// the error the fence finds: ErrCorrupt for the job whose deflate segment
// overran its slot, ErrUnsupported for jobs with a deflate slot after it
// (an overrun may run on through them; the CPU decodes them again). escaped
// reports an overrun that reached the end of the tail guard and so may
// have written past the buffer.
func (l *layout) fenceCheck(hout []byte) (errs map[int]error, escaped bool) {
	var want [probeLen]byte
	for i := 0; i < probeLen; i += 4 {
		binary.LittleEndian.PutUint32(want[i:], fencePattern)
	}
	hit := -1
	for i, pr := range l.probes {
		got := l.staged(hout, l.probeOff+probeLen*int64(i))[:probeLen]
		if string(got) == string(want[:]) {
			continue
		}
		if pr.seg < 0 {
			escaped = true
			continue
		}
		if hit < 0 {
			hit = i
		}
	}
	if hit < 0 {
		return nil, escaped
	}
	errs = map[int]error{}
	for i, pr := range l.probes[hit:] {
		if pr.seg < 0 {
			continue
		}
		s := l.segs[algoDeflate][pr.seg]
		if _, ok := errs[s.job]; ok {
			continue
		}
		if i == 0 {
			errs[s.job] = fmt.Errorf("nvCOMP deflate wrote past the %d bytes the stream decodes to: %w", s.n, codec.ErrCorrupt)
		} else {
			errs[s.job] = fmt.Errorf("deflate output after another stream's overrun: %w", codec.ErrUnsupported)
		}
	}
	return errs, escaped
}
