package deliver

import (
	"cmp"
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
)

// GPUFill is the device path on a GPU: a batch's samples are filled into a
// host shadow of the slot (fill.Filler.FillInto, the mount's own fill
// code), except that every chunk that lands whole in the shadow, of a
// codec the GPU may take alone, decodes on the GPU straight into the slot
// (gpu.Ring.Decode) and never reaches the host. What the host wrote
// instead (chunks of other codecs, casts, fill values, static channels)
// is then copied from the shadow into the slot, and only that, a run of
// samples at a time (slotDecoder.Drain). Fallback
// decodes what the GPU does not (the mount's pipeline), while the GPU
// decodes the rest.
//
// The shadow is address space, not memory: the ring's own mapping, whose
// pages only the host's writes fault in (cudaRing.shadow), counted in the
// fills' memory budget until they go back to the kernel, once the fill
// copied them into the slot (fill.Drainer). What the
// device decodes never touches it, so a batch costs the host no buffer of
// its size, and the pinned memory the GPU lends stays for the compressed
// chunks, read straight into it (the slot's decoder lends it: see
// zarr.Hierarchy.Decoding).
type GPUFill struct {
	Filler   *fill.Filler
	Fallback codec.BatchDecoder
	// CPU decodes the chunks the device could take that the host takes
	// instead (route.go): the mount's CPU decoder (decode.Pipeline.CPU),
	// whose workers bound it and whose counters count it. Nil: Fallback.
	CPU codec.BatchDecoder
}

func (f GPUFill) FillSlot(ctx context.Context, r Ring, k int, job *slotJob) []error {
	errs := make([]error, len(job.blobs))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	cr, ok := r.(deviceRing)
	if !ok {
		return fail(errors.New("the ring is not in GPU memory"))
	}
	n := int64(len(job.blobs)) * job.size
	shadow := cr.shadowOf(k)[:n]
	outs := make([][]byte, len(job.blobs))
	for i := range job.blobs {
		outs[i] = shadow[job.offs[i] : job.offs[i]+job.size]
	}
	sd := &slotDecoder{ring: cr, slot: k, shadow: shadow, fallback: f.Fallback, cpu: cmp.Or(f.CPU, f.Fallback), job: job}
	if bigEndian(job.blobs) {
		// The host swaps such chunks after decoding them in place: they
		// must decode where it can.
		sd.hostOnly = true
	}
	// sd lends the GPU's pinned memory: the compressed chunks are read
	// into it, from which they cross to the device without a copy into
	// staging, whatever memory the mount lends its other fills. It is a
	// fill.Drainer: what the host writes in the shadow is counted in the
	// memory budget from before it is written until sd.Drain has copied
	// it into the slot and given its pages back, run by run.
	t0 := time.Now()
	err := f.Filler.FillInto(ctx, job.lay, job.blobs, outs, 0, sd)
	job.stages.add(stRead, time.Since(t0)-time.Duration(sd.in.Load())-time.Duration(sd.drained.Load()))
	if err != nil {
		// The run that failed is not drained: its pages go back here.
		cr.releaseShadow(k, 0, n)
		return fail(err)
	}
	return errs
}

// Drain puts into the slot the static channels stamped in samples i..j-1
// and copies there what the host wrote of them (the shadow's ranges that
// the device did not write), then gives their shadow's pages back
// (fill.Drainer). Samples are drained in order, so a page shared with the
// samples before (copied) or after (not yet written) may go back with
// them.
func (s *slotDecoder) Drain(ctx context.Context, i, j int) error {
	t0 := time.Now()
	defer func() { s.drained.Add(int64(time.Since(t0))) }()
	lo, hi := s.job.offs[i], s.job.offs[j-1]+s.job.size
	stamped, err := s.putStamps(ctx, lo, hi)
	s.job.uploaded.Add(stamped)
	if err == nil {
		var uploaded int64
		uploaded, err = uploadGaps(ctx, s.ring, s.slot, s.shadow, gapsIn(s.covered(), lo, hi))
		s.job.uploaded.Add(uploaded)
	}
	s.job.stages.add(stUpload, time.Since(t0))
	s.ring.releaseShadow(s.slot, lo, hi-lo)
	return err
}

var _ fill.Stamper = (*slotDecoder)(nil)

// stamp is a static channel's bytes src, bound for the slot at at.
type stamp struct {
	at  int64
	src []byte
}

// Stamp takes a static channel for the range dst of the shadow
// (fill.Stamper): Drain puts src in the slot there, never through the
// shadow.
func (s *slotDecoder) Stamp(dst, src []byte) bool {
	at, ok := s.inShadow(dst)
	if !ok || len(src) != len(dst) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stamps = append(s.stamps, stamp{at, src})
	return true
}

// putStamps puts in the slot the static channels stamped within the
// shadow's lo..hi: each one's bytes cross once a fill, through staging,
// and are copied on the device from there into the other samples (only
// from where this fill put them, never from what the slot held before:
// the trainer may have written over it). It returns the bytes that
// crossed.
func (s *slotDecoder) putStamps(ctx context.Context, lo, hi int64) (int64, error) {
	s.mu.Lock()
	var mine []stamp
	rest := s.stamps[:0]
	for _, st := range s.stamps {
		if st.at >= lo && st.at < hi {
			mine = append(mine, st)
		} else {
			rest = append(rest, st)
		}
	}
	s.stamps = rest
	s.mu.Unlock()
	var n int64
	for _, st := range mine {
		size := int64(len(st.src))
		if from, ok := s.sent[&st.src[0]]; ok {
			if err := s.ring.copyInSlot(ctx, s.slot, st.at, from, size); err != nil {
				return n, err
			}
		} else {
			if err := writeStaged(ctx, s.ring, s.slot, st.at, st.src); err != nil {
				return n, err
			}
			if s.sent == nil {
				s.sent = map[*byte]int64{}
			}
			s.sent[&st.src[0]] = st.at
			n += size
		}
		s.mu.Lock()
		s.done = append(s.done, [2]int64{st.at, st.at + size})
		s.mu.Unlock()
	}
	return n, nil
}

var _ fill.Drainer = (*slotDecoder)(nil)

// deviceRing is a ring in a GPU's memory as the device path uses it: a
// cudaRing, or a test's stand-in.
type deviceRing interface {
	Ring
	// shadowOf is slot k's shadow (see GPUFill).
	shadowOf(k int) []byte
	// decode decodes jobs into slot k by runs (gpu.Ring.DecodeRuns).
	decode(ctx context.Context, k int, jobs []codec.Job, runs [][]gpu.Run, t *gpu.RingTimes) error
	// memory lends the pinned memory compressed chunks are read into.
	memory() codec.HostMemory
	// copyInSlot copies n bytes of slot k from src to dst, on the device.
	copyInSlot(ctx context.Context, k int, dst, src, n int64) error
	// route decides which chunks bound for the device the host decodes
	// instead (route.go).
	route() *router
	// releaseShadow gives back the pages of slot k's shadow that hold its
	// bytes off..off+n (dropPages) once nothing reads them.
	releaseShadow(k int, off, n int64)
}

// dropPages gives the pages of shadow (page-aligned at its start and its
// end) that hold its bytes off..off+n back to the kernel, whole: they read
// as zeros after, the bytes around the range on its first and last pages
// too, and hold no memory until written again.
func dropPages(shadow []byte, off, n int64) {
	page := int64(os.Getpagesize())
	lo, hi := off/page*page, min((off+n+page-1)/page*page, int64(len(shadow)))
	if hi > lo {
		// An error (a range not mapped so) leaves the pages held, and
		// their bytes, which no one reads, as they were.
		_ = unix.Madvise(shadow[lo:hi], unix.MADV_DONTNEED)
	}
}

// uploadGaps copies the ranges gaps of slot k's shadow (what the host
// wrote) into the slot, through staging (pinned on a GPU), and returns
// the bytes that crossed. (A static channel, the same in every sample,
// never enters the shadow: putStamps sends it once a fill.)
func uploadGaps(ctx context.Context, r deviceRing, k int, shadow []byte, gaps [][2]int64) (int64, error) {
	var most int64
	for _, g := range gaps {
		most = max(most, g[1]-g[0])
	}
	if most == 0 {
		return 0, nil
	}
	buf := r.Stage(int(min(most, stagePiece)))
	defer r.Unstage(buf)
	var n int64
	for _, g := range gaps {
		if err := writeVia(ctx, r, k, g[0], shadow[g[0]:g[1]], buf); err != nil {
			return n, err
		}
		n += g[1] - g[0]
	}
	return n, nil
}

// writeStaged writes b into slot k at off through staging (pinned on a
// GPU), a piece at a time.
func writeStaged(ctx context.Context, r deviceRing, k int, off int64, b []byte) error {
	buf := r.Stage(int(min(int64(len(b)), stagePiece)))
	defer r.Unstage(buf)
	return writeVia(ctx, r, k, off, b, buf)
}

// writeVia writes b into slot k at off through buf, a piece at a time.
func writeVia(ctx context.Context, r deviceRing, k int, off int64, b, buf []byte) error {
	for at := int64(0); at < int64(len(b)); at += int64(len(buf)) {
		m := min(int64(len(buf)), int64(len(b))-at)
		copy(buf, b[at:at+m])
		if err := r.Write(ctx, k, off+at, buf[:m]); err != nil {
			return err
		}
	}
	return nil
}

// bigEndian reports whether a source array of the blobs is big-endian
// with elements of more than one byte.
func bigEndian(blobs []layout.Blob) bool {
	for _, b := range blobs {
		for _, s := range b.Sources() {
			if s.Array != nil && s.Array.DType.BigEndian && s.Array.DType.Size > 1 {
				return true
			}
		}
	}
	return false
}

// slotDecoder decodes the chunks of one fill: those that land in the
// shadow on the GPU, into the slot, the rest with fallback.
type slotDecoder struct {
	ring     deviceRing
	slot     int
	shadow   []byte
	fallback codec.BatchDecoder
	cpu      codec.BatchDecoder // the host's share (GPUFill.CPU)
	job      *slotJob
	hostOnly bool
	in       atomic.Int64 // nanoseconds in DecodeBatch
	drained  atomic.Int64 // nanoseconds in Drain

	mu   sync.Mutex
	done [][2]int64 // shadow ranges the device wrote into the slot, or the host's share did
	// stamps are the static channels the fill left to the decoder
	// (Stamp), put in the slot as their runs are drained; sent is, per
	// static channel's bytes, where in the slot they were first put in
	// this fill, whence the others are copied on the device.
	stamps []stamp
	sent   map[*byte]int64
	// upMu serializes the host share's copies into the slot (a slot's
	// calls come one at a time).
	upMu sync.Mutex
}

// deviceCodecs are the codecs the GPU decodes into a slot with every
// check made before it reads them or on the device (gpu's doc: LZ4
// walked, blosc framing parsed, a zstd frame's checksum hashed on the
// device); the GPU refuses the chunks it would have to verify over
// decoded bytes the host holds, which then decode on the host.
var deviceCodecs = map[codec.Name]bool{codec.Blosc: true, codec.LZ4: true, codec.Zstd: true}

// onDevice returns the jobs of a codec the GPU may take that land in the
// shadow, with where in it: those landing whole, at one offset; those of
// which the fill takes runs that each land whole (codec.Job.Place: the
// steps of a chunk of several time steps, or the levels a view selects
// apart), at most maxRuns of them, one device copy each; and the others.
func (s *slotDecoder) onDevice(jobs []codec.Job) (dev []int, runs [][]gpu.Run, host []int) {
	for i, j := range jobs {
		var rs []gpu.Run
		if !s.hostOnly && deviceCodecs[j.Codec] && len(j.Parts) == 0 && len(j.Src) > 0 && len(j.Dst) > 0 {
			if at, ok := s.inShadow(j.Dst); ok {
				rs = []gpu.Run{{At: at, N: int64(len(j.Dst))}}
			} else if len(j.Place) <= maxRuns {
				for _, p := range j.Place {
					at, ok := s.inShadow(p.Dst)
					if !ok {
						rs = nil
						break
					}
					rs = append(rs, gpu.Run{From: p.Off, At: at, N: int64(len(p.Dst))})
				}
			}
		}
		if len(rs) == 0 {
			host = append(host, i)
			continue
		}
		dev = append(dev, i)
		runs = append(runs, rs)
	}
	return dev, runs, host
}

// maxRuns is the most runs of a chunk the device copies into the slot: a
// device copy each, a few microseconds of the host's; a chunk of which
// the fill takes more, smaller pieces, decodes on the host.
const maxRuns = 64

// inShadow returns b's offset in the shadow, if it lies there whole.
func (s *slotDecoder) inShadow(b []byte) (int64, bool) {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(s.shadow)))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if len(b) == 0 || at < base || at+uintptr(len(b)) > base+uintptr(len(s.shadow)) {
		return 0, false
	}
	return int64(at - base), true
}

// DecodeBatch decodes on the GPU into the slot the jobs it may take, and
// at the same time on the host the others, and of those the GPU may take
// the share the host decodes sooner (route.go), straight into pinned
// memory and from there into the slot; then on the host what the GPU
// handed back (ErrUnsupported).
func (s *slotDecoder) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	t0 := time.Now()
	defer func() { s.in.Add(int64(time.Since(t0))) }()
	dev, runs, host := s.onDevice(jobs)
	var hostErr, shareErr error
	var wg sync.WaitGroup
	if len(host) > 0 {
		wg.Go(func() { hostErr = s.onHost(ctx, jobs, host) })
	}
	rt := s.ring.route()
	share, large := rt.split(jobs, dev, s.workers())
	if len(share) > 0 {
		at := make(map[int][]gpu.Run, len(dev))
		for k, i := range dev {
			at[i] = runs[k]
		}
		shareRuns := make([][]gpu.Run, len(share))
		for k, i := range share {
			shareRuns[k] = at[i]
		}
		dev, runs = without(dev, runs, share)
		wg.Go(func() { shareErr = s.hostShare(ctx, jobs, share, shareRuns) })
	}
	var rest []int
	if len(dev) > 0 {
		sub := make([]codec.Job, len(dev))
		for k, i := range dev {
			sub[k] = jobs[i]
		}
		var times gpu.RingTimes
		err := s.ring.decode(ctx, s.slot, sub, runs, &times)
		s.count(times)
		if large && err == nil {
			rt.deviceDone(times.Wait)
		}
		if err != nil && ctx.Err() != nil {
			wg.Wait()
			return err
		}
		for k, i := range dev {
			switch err := sub[k].Err; {
			case err == nil:
				s.job.compressed.Add(int64(len(jobs[i].Src)))
				s.placed(&jobs[i], runs[k])
			case errors.Is(err, codec.ErrUnsupported):
				rest = append(rest, i) // the host decodes it into the shadow
			default:
				jobs[i].Err = err
			}
		}
	}
	wg.Wait()
	if len(rest) > 0 {
		if err := s.onHost(ctx, jobs, rest); hostErr == nil {
			hostErr = err
		}
	}
	return cmp.Or(hostErr, shareErr)
}

// Places says the slot's decoder writes the runs of a chunk the fill
// takes in part where they go itself (codec.Placer).
func (s *slotDecoder) Places() bool { return true }

// placed records that job j's runs are in the slot: their ranges of the
// shadow need no upload, and the reader copies nothing of a job it
// offered a Place (its Dst was not written).
func (s *slotDecoder) placed(j *codec.Job, runs []gpu.Run) {
	j.Placed = len(j.Place) > 0
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range runs {
		s.done = append(s.done, [2]int64{r.At, r.At + r.N})
	}
}

// without returns dev and runs less the jobs of drop.
func without(dev []int, runs [][]gpu.Run, drop []int) ([]int, [][]gpu.Run) {
	var d []int
	var o [][]gpu.Run
	for k, i := range dev {
		if !slices.Contains(drop, i) {
			d = append(d, i)
			o = append(o, runs[k])
		}
	}
	return d, o
}

// hostShare decodes jobs idx, which the device could have taken, on the
// host's CPU decoder (its workers: the idle cores) into pinned memory,
// whence each one's runs are copied into the slot: the chunk's bytes
// cross once, as the device's would, and never touch the shadow. The
// CPU's verdict is the chunk's, as on the host path.
func (s *slotDecoder) hostShare(ctx context.Context, jobs []codec.Job, idx []int, runs [][]gpu.Run) error {
	t0 := time.Now()
	mem := s.ring.memory()
	sub := make([]codec.Job, len(idx))
	for k, i := range idx {
		sub[k] = codec.Job{Codec: jobs[i].Codec, Src: jobs[i].Src, Dst: mem.HostAlloc(len(jobs[i].Dst))}
	}
	defer func() {
		for _, j := range sub {
			mem.HostFree(j.Dst)
		}
	}()
	err := s.cpu.DecodeBatch(ctx, sub)
	var n int64
	for k, i := range idx {
		j := &sub[k]
		if err != nil && j.Err == nil {
			j.Err = err // not decoded (the decoder closed, the fill cancelled): never copied
		}
		for _, r := range runs[k] {
			if j.Err != nil {
				break
			}
			s.upMu.Lock()
			j.Err = s.ring.Write(ctx, s.slot, r.At, j.Dst[r.From:r.From+r.N])
			s.upMu.Unlock()
			n += r.N
		}
		if jobs[i].Err = j.Err; j.Err != nil {
			continue
		}
		s.placed(&jobs[i], runs[k])
	}
	d := time.Since(t0)
	s.job.stages.add(stHostShare, d)
	s.job.uploaded.Add(n)
	s.job.hostShare.Add(n)
	if err == nil && ctx.Err() == nil {
		s.ring.route().hostDone(n, d, len(idx), s.workers())
	}
	return cmp.Or(err, ctx.Err())
}

// workers returns the host decoder's workers (0: it does not say).
func (s *slotDecoder) workers() int { return codec.WorkersOf(s.cpu) }

// HostAlloc, HostFree and Retain lend the ring's GPU's pinned memory: the
// fill code reads the compressed chunks it decodes into memory its decoder
// lends (zarr.Hierarchy.Decoding).
func (s *slotDecoder) HostAlloc(n int) []byte { return s.ring.memory().HostAlloc(n) }
func (s *slotDecoder) HostFree(b []byte)      { s.ring.memory().HostFree(b) }
func (s *slotDecoder) Retain(b []byte) bool   { return s.ring.memory().Retain(b) }

var _ codec.HostMemory = (*slotDecoder)(nil)

// HostTrim gives the ring's memory back the tail of a compressed chunk's
// buffer, where it takes such tails (memory.Trimmer): a fill reads every
// chunk of a batch into room for its decoded size.
func (s *slotDecoder) HostTrim(b []byte, n int) []byte {
	if t, ok := s.ring.memory().(memory.Trimmer); ok {
		return t.HostTrim(b, n)
	}
	return b[:n]
}

var _ memory.Trimmer = (*slotDecoder)(nil)

// onHost decodes jobs idx with the fallback, into the shadow.
func (s *slotDecoder) onHost(ctx context.Context, jobs []codec.Job, idx []int) error {
	t0 := time.Now()
	defer func() { s.job.stages.add(stHostDecode, time.Since(t0)) }()
	sub := make([]codec.Job, len(idx))
	for k, i := range idx {
		sub[k] = jobs[i]
		sub[k].Err = nil
	}
	err := s.fallback.DecodeBatch(ctx, sub)
	for k, i := range idx {
		jobs[i].Err = sub[k].Err
	}
	return err
}

// count adds where a Ring.Decode's time went to the fill's stages.
func (s *slotDecoder) count(t gpu.RingTimes) {
	st := &s.job.stages
	st.add(stConsumer, t.Consumer)
	st.add(stChecks, t.Checks)
	st.add(stWait, t.Wait)
	st.add(stH2D, t.Device.H2D)
	st.add(stDecode, t.Device.Decode)
	st.add(stKernels, t.Device.Kernels)
	st.add(stD2H, t.Device.D2H)
}

// covered returns the shadow ranges the device wrote, sorted.
func (s *slotDecoder) covered() [][2]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.done)
	slices.SortFunc(out, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	return out
}

// gapsIn returns the ranges of [lo, hi) that no range of covered (sorted,
// disjoint, each within or outside [lo, hi): the device's writes do not
// cross a sample's bounds) holds.
func gapsIn(covered [][2]int64, lo, hi int64) [][2]int64 {
	var out [][2]int64
	at := lo
	for _, c := range covered {
		if c[1] <= lo || c[0] >= hi {
			continue
		}
		if c[0] > at {
			out = append(out, [2]int64{at, c[0]})
		}
		at = max(at, c[1])
	}
	if at < hi {
		out = append(out, [2]int64{at, hi})
	}
	return out
}
