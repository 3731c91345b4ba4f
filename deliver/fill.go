package deliver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/layout"
)

// slotJob is one fill request: the samples for one slot.
type slotJob struct {
	lay   *layout.Layout
	blobs []layout.Blob
	offs  []int64 // each sample's offset in the slot
	size  int64   // data bytes of a sample
	*tally
}

// tally is what a fill request's paths put into its slot, and where their
// time went: one per request, shared by its parts (slotJob.part).
type tally struct {
	// compressed counts the compressed bytes the device path read (what
	// crossed to the device, on a GPU); uploaded the decoded bytes the
	// host path copied into the slot.
	compressed, uploaded atomic.Int64
	// hostShare counts the bytes, among uploaded, of chunks the device
	// could take that the host decoded (route.go).
	hostShare atomic.Int64
	// cached counts the samples copied from blobs the cache held.
	cached atomic.Int64
	stages stageTimes
}

func newSlotJob(lay *layout.Layout, size int64) *slotJob {
	return &slotJob{lay: lay, size: size, tally: new(tally)}
}

// part is the job's samples at idx (increasing), which the device path
// fills: the same request, its tally shared.
func (j *slotJob) part(idx []int) *slotJob {
	p := &slotJob{lay: j.lay, size: j.size, tally: j.tally}
	for _, i := range idx {
		p.blobs = append(p.blobs, j.blobs[i])
		p.offs = append(p.offs, j.offs[i])
	}
	return p
}

// holder is the mount's blobs where they tell, without a request, whether
// the cache holds a blob (fill.Filler).
type holder interface {
	Holds(lay *layout.Layout, b layout.Blob) bool
}

// fillSlot puts job's samples into slot k, and returns the count of each
// path, and the first sample that failed on the host path with its error.
// A sample whose blob the cache holds (a warm mount: `zarrfs warm`, or
// files read before) is copied from it, as a read of the mount would be:
// the decoding was paid for once, and a copy from the cache is faster
// than decoding again wherever the cache reads faster than the device
// decodes. The device path decodes the others meanwhile; the host path
// fills every sample it did not.
func (s *Server) fillSlot(ctx context.Context, r Ring, k int, job *slotJob) (dev, host int, failed layout.Blob, err error) {
	if err := r.Begin(k); err != nil {
		return 0, 0, nil, fmt.Errorf("slot %d: %w", k, err)
	}
	// The host path, a sample per goroutine: each waits for its own fill
	// (single-flight with the mount's readers) and copies into the slot.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var hostBegan time.Time
	hostPath := func(i int, held bool) {
		if host++; host == 1 {
			hostBegan = time.Now()
		}
		wg.Go(func() {
			filled, e := s.hostSample(ctx, r, k, job, i)
			if e == nil && held && !filled {
				job.cached.Add(1)
			}
			if e != nil {
				mu.Lock()
				if failed == nil {
					failed, err = job.blobs[i], e
				}
				mu.Unlock()
			}
		})
	}
	cold := make([]int, 0, len(job.blobs))
	h, _ := s.Blobs.(holder)
	for i, b := range job.blobs {
		if s.Device != nil && (h == nil || !h.Holds(job.lay, b)) {
			cold = append(cold, i)
			continue
		}
		hostPath(i, s.Device != nil)
	}
	if len(cold) > 0 {
		part := job
		if len(cold) < len(job.blobs) {
			part = job.part(cold)
		}
		for j, e := range s.Device.FillSlot(ctx, r, k, part) {
			if e == nil {
				dev++
				continue
			}
			if ctx.Err() != nil {
				wg.Wait()
				return dev, host, nil, ctx.Err()
			}
			s.log.Debug("delivery: sample to the host path", "file", part.blobs[j].Path(), "cause", e)
			hostPath(cold[j], false)
		}
	}
	wg.Wait()
	if host > 0 {
		job.stages.add(stHostPath, time.Since(hostBegan))
	}
	if err != nil {
		return dev, host, failed, err
	}
	if err := r.Done(k); err != nil {
		return dev, host, nil, fmt.Errorf("slot %d: %w", k, err)
	}
	return dev, host, nil, nil
}

// hostSample is the host path for sample i of job: its blob opened
// through the mount's blobs (the cache: filled once, whoever asks), and
// its data read into the slot, in place for host memory, else through
// staging. filled reports whether the open filled the blob (a blob the
// cache held under an identity the source no longer has is filled again)
// rather than finding it.
func (s *Server) hostSample(ctx context.Context, r Ring, k int, job *slotJob, i int) (filled bool, err error) {
	b := job.blobs[i]
	h, _, err := s.Blobs.Open(ctx, job.lay, b)
	if err != nil {
		return false, err
	}
	defer h.Close()
	if f, ok := h.(fill.Refilled); ok {
		filled = f.Filled()
	}
	return filled, s.copySample(ctx, r, k, job, i, h)
}

// copySample reads sample i's data from its blob h into slot k.
func (s *Server) copySample(ctx context.Context, r Ring, k int, job *slotJob, i int, h fill.Backing) error {
	b := job.blobs[i]
	align := int64(len(b.Header()))
	if mem := r.Host(k); mem != nil {
		dst := mem[job.offs[i] : job.offs[i]+job.size]
		if err := readFull(h, dst, align, b.Path()); err != nil {
			return err
		}
		job.uploaded.Add(job.size)
		return nil
	}
	// Staging in pieces: a sample of hundreds of megabytes needs no buffer
	// of its size.
	piece := stagePiece
	pieces := (job.size + piece - 1) / piece
	ways := min(int64(stageWays), pieces)
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range ways {
		wg.Go(func() {
			buf := r.Stage(int(min(piece, job.size)))
			defer r.Unstage(buf)
			for {
				p := next.Add(1) - 1
				if p >= pieces {
					return
				}
				off := p * piece
				n := min(piece, job.size-off)
				err := readFull(h, buf[:n], align+off, b.Path())
				if err == nil {
					err = r.Write(ctx, k, job.offs[i]+off, buf[:n])
				}
				if err != nil {
					once.Do(func() { first = err })
					next.Store(pieces)
					return
				}
				job.uploaded.Add(n)
			}
		})
	}
	wg.Wait()
	return first
}

// stageWays is the pieces of a sample the host path stages at once: one
// goroutine copies from the page cache at about 2.4 GB/s, and a ring over
// a warm mount copied 238-243 samples/s of 87 MB one piece at a time
// against 335-357 four at once (H200, 16 cores; BENCHMARKS.md).
const stageWays = 4

// stagePiece is the most the host path stages at a time per piece (a
// variable for tests).
var stagePiece int64 = 8 << 20

func readFull(h fill.Backing, dst []byte, off int64, name string) error {
	n, err := h.File().ReadAt(dst, off)
	if n == len(dst) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%s: read %d bytes at %d: %w", name, len(dst), off, err)
}

// HostFill is the test mode's device path: the CPU decodes every sample
// straight into its slot of a host ring, chunks landing whole decoding in
// place there (fill.Filler.FillInto), as a GPU decodes into device memory;
// nothing is written to the cache. Decoder decodes (the mount's
// pipeline); Fail, when set, refuses the samples it names, as a device
// that fails mid-batch does, so that tests see the host path take them.
type HostFill struct {
	Filler  *fill.Filler
	Decoder codec.BatchDecoder
	Fail    func(path string) bool
}

func (f HostFill) FillSlot(ctx context.Context, r Ring, k int, job *slotJob) []error {
	errs := make([]error, len(job.blobs))
	mem := r.Host(k)
	if mem == nil {
		for i := range errs {
			errs[i] = errors.New("the ring is not host memory")
		}
		return errs
	}
	var blobs []layout.Blob
	var outs [][]byte
	var which []int
	for i, b := range job.blobs {
		if f.Fail != nil && f.Fail(b.Path()) {
			errs[i] = errors.New("refused (test)")
			continue
		}
		blobs = append(blobs, b)
		outs = append(outs, mem[job.offs[i]:job.offs[i]+job.size])
		which = append(which, i)
	}
	if len(blobs) == 0 {
		return errs
	}
	cd := &counting{inner: f.Decoder, n: &job.compressed}
	t0 := time.Now()
	if err := f.Filler.FillInto(ctx, job.lay, blobs, outs, 0, cd); err != nil {
		for _, i := range which {
			errs[i] = err
		}
	}
	job.stages.add(stRead, time.Since(t0)-time.Duration(cd.in.Load()))
	job.stages.add(stHostDecode, time.Duration(cd.in.Load()))
	return errs
}

// counting decodes with inner and adds the compressed bytes of every job
// to n, and the time spent decoding to in.
type counting struct {
	inner codec.BatchDecoder
	n     *atomic.Int64
	in    atomic.Int64
}

func (c *counting) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	t0 := time.Now()
	defer func() { c.in.Add(int64(time.Since(t0))) }()
	c.n.Add(compressedBytes(jobs))
	return c.inner.DecodeBatch(ctx, jobs)
}

// compressedBytes is the compressed bytes of jobs.
func compressedBytes(jobs []codec.Job) int64 {
	var n int64
	for _, j := range jobs {
		n += int64(len(j.Src))
		for _, p := range j.Parts {
			n += int64(len(p.B))
		}
	}
	return n
}
