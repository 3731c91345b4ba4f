package codec

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a CPU decoder.
type Options struct {
	// Workers is the number of goroutines that decode; zero means
	// runtime.NumCPU(). All batches share them, however many callers there
	// are, so this bounds the CPU the decoder uses.
	Workers int
}

// CPU is a BatchDecoder that decodes on a fixed pool of worker goroutines,
// each with its own reusable decoder state. Create it once with NewCPU and
// share it; it is safe for concurrent use. Close stops the workers.
type CPU struct {
	workers int
	tickets chan *batch
	stop    chan struct{}
	done    sync.WaitGroup
	// mu is held shared by every DecodeBatch in flight and exclusively by
	// Close, so Close waits for running batches and no ticket is ever
	// queued to stopped workers.
	mu     sync.RWMutex
	closed bool
	// pending counts the jobs handed to DecodeBatch and not decoded yet.
	pending atomic.Int64
	// busy sums the nanoseconds workers spent decoding.
	busy atomic.Int64
}

var _ BatchDecoder = (*CPU)(nil)

// batch is one DecodeBatch call: workers that take a ticket for it claim
// jobs by index until none is left, so a batch of many small jobs costs one
// channel send per worker, not one per job.
type batch struct {
	ctx  context.Context
	jobs []Job
	// parts, when set, are what the workers claim instead of whole jobs:
	// the block ranges of blosc frames split across workers, and the other
	// jobs whole.
	parts []part
	next  atomic.Int64
	wg    sync.WaitGroup
}

// part is blocks [from, to) of job's whole blosc frame h, or the whole job
// when h is nil. err is its outcome.
type part struct {
	job      int
	h        *bloscHeader
	from, to int
	err      error
}

// splitMin is the smallest blosc frame (decoded bytes) whose blocks are
// spread over idle workers, and splitPart about the least each takes: a
// reader of one sample at a time otherwise waits for its largest chunk
// decoded on one core while the others idle.
const (
	splitMin  = 4 << 20
	splitPart = 1 << 20
)

// split returns the parts of jobs for spare idle workers: each large whole
// blosc frame cut into up to its share of them, in block ranges; nil when
// no job is worth cutting.
func split(jobs []Job, spare int) []part {
	if spare <= len(jobs) {
		return nil
	}
	share := spare / len(jobs)
	var parts []part
	cut := false
	for i := range jobs {
		j := &jobs[i]
		k := 1
		var h bloscHeader
		if j.Codec == Blosc && len(j.Dst) >= splitMin {
			var err error
			h, err = parseBloscHeader(j.Src)
			// Anything the whole-frame decoder would refuse or copy is
			// left to it, with its errors.
			if err == nil && h.nbytes == len(j.Dst) && !h.memcpyed && h.nblocks > 1 {
				k = min(share, h.nblocks, len(j.Dst)/splitPart)
			}
		}
		if k <= 1 {
			parts = append(parts, part{job: i})
			continue
		}
		cut = true
		hp := &h
		for p := range k {
			parts = append(parts, part{job: i, h: hp, from: p * h.nblocks / k, to: (p + 1) * h.nblocks / k})
		}
	}
	if !cut {
		return nil
	}
	return parts
}

// NewCPU starts a CPU decoder with opts.Workers goroutines. A negative
// count is refused, not turned into the default.
func NewCPU(opts Options) (*CPU, error) {
	n := opts.Workers
	if n < 0 {
		return nil, fmt.Errorf("codec: Options.Workers %d: want 0 (one per CPU) or more", n)
	}
	if n == 0 {
		n = runtime.NumCPU()
	}
	c := &CPU{
		workers: n,
		tickets: make(chan *batch, n),
		stop:    make(chan struct{}),
	}
	c.done.Add(n)
	for range n {
		go c.work()
	}
	return c, nil
}

// Workers returns the number of worker goroutines.
func (c *CPU) Workers() int { return c.workers }

func (c *CPU) work() {
	defer c.done.Done()
	d := newDecoder()
	for {
		select {
		case <-c.stop:
			return
		case b := <-c.tickets:
			b.run(d, &c.pending, &c.busy)
		}
	}
}

func (b *batch) run(d *decoder, pending, busy *atomic.Int64) {
	defer b.wg.Done()
	n := len(b.jobs)
	if b.parts != nil {
		n = len(b.parts)
	}
	for {
		i := int(b.next.Add(1) - 1)
		if i >= n {
			return
		}
		var j *Job
		var p *part
		var errp *error
		if b.parts != nil {
			p = &b.parts[i]
			j, errp = &b.jobs[p.job], &p.err
		} else {
			j = &b.jobs[i]
			errp = &j.Err
		}
		if err := b.ctx.Err(); err != nil {
			*errp = fmt.Errorf("%s chunk not decoded: %w", j.Codec, err)
		} else {
			t0 := time.Now()
			if p != nil && p.h != nil {
				*errp = d.decodeBloscBlocks(p.h, j.Dst, p.from, p.to)
			} else {
				*errp = d.job(j)
			}
			d.release()
			busy.Add(int64(time.Since(t0)))
		}
		pending.Add(-1)
	}
}

// gather sets each job's Err from its parts: the first part's error in
// block order, which is the one decoding the frame whole would report.
func (b *batch) gather() {
	if b.parts == nil {
		return
	}
	for i := range b.jobs {
		b.jobs[i].Err = nil
	}
	for i := len(b.parts) - 1; i >= 0; i-- {
		if p := &b.parts[i]; p.err != nil {
			b.jobs[p.job].Err = p.err
		}
	}
}

// Busy returns the time the workers have spent decoding, summed over them.
func (c *CPU) Busy() time.Duration { return time.Duration(c.busy.Load()) }

// Inline is a BatchDecoder that starts no workers: it decodes the jobs of
// a batch one after another in the calling goroutine, as a CPU decoder's
// worker does. It is what a reader given no decoder decodes with.
type Inline struct{}

var _ BatchDecoder = Inline{}

// DecodeBatch decodes every job in turn; each job's Err reports its own
// outcome. When ctx is cancelled, the jobs not yet decoded are not: their
// Err wraps the context's error, and DecodeBatch returns it.
func (Inline) DecodeBatch(ctx context.Context, jobs []Job) error {
	for i := range jobs {
		if err := ctx.Err(); err != nil {
			for k := i; k < len(jobs); k++ {
				jobs[k].Err = fmt.Errorf("%s chunk not decoded: %w", jobs[k].Codec, err)
			}
			return err
		}
		jobs[i].Err = DecodeJob(&jobs[i])
	}
	return nil
}

// Sparer is an optional upgrade of a BatchDecoder: Spare returns the
// workers that no job waits for now, what decode's router asks before it
// gives the decoder a batch.
type Sparer interface {
	Spare() int
}

var _ Sparer = (*CPU)(nil)

// Workerer is an optional upgrade of a BatchDecoder: Workers returns how
// many jobs it decodes at once, what the delivery router scales a share's
// rate by.
type Workerer interface {
	Workers() int
}

var _ Workerer = (*CPU)(nil)

// WorkersOf returns d's workers, 0 when it does not say.
func WorkersOf(d BatchDecoder) int {
	if w, ok := d.(Workerer); ok {
		return w.Workers()
	}
	return 0
}

// Spare returns the workers that no job waits for now (0 when every
// worker has a job, or more jobs are queued than workers): what decode's router
// asks before it gives this decoder a batch.
func (c *CPU) Spare() int {
	return max(c.workers-int(c.pending.Load()), 0)
}

// DecodeBatch decodes every job, spreading them over the workers, and
// returns when all are done. Each job's Err reports its own outcome. When ctx
// is cancelled, jobs not yet started are not decoded: their Err wraps the
// context's error, and DecodeBatch returns it. It returns ErrClosed after
// Close.
func (c *CPU) DecodeBatch(ctx context.Context, jobs []Job) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		for i := range jobs {
			jobs[i].Err = fmt.Errorf("%s chunk not decoded: %w", jobs[i].Codec, err)
		}
		return err
	}
	if len(jobs) == 0 {
		return nil
	}
	b := &batch{ctx: ctx, jobs: jobs, parts: split(jobs, c.Spare())}
	n := len(jobs)
	if b.parts != nil {
		n = len(b.parts)
	}
	c.pending.Add(int64(n))
	w := min(c.workers, n)
	b.wg.Add(w)
	for range w {
		c.tickets <- b
	}
	b.wg.Wait()
	b.gather()
	return ctx.Err()
}

// Close waits for the batches in flight, then stops the workers. Later
// DecodeBatch calls return ErrClosed. Close is idempotent.
func (c *CPU) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	close(c.stop)
	c.done.Wait()
	return nil
}
