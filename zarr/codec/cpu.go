package codec

import (
	"context"
	"errors"
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

// ErrClosed is returned by DecodeBatch on a CPU decoder that was closed.
var ErrClosed = errors.New("codec: decoder closed")

// batch is one DecodeBatch call: workers that take a ticket for it claim
// jobs by index until none is left, so a batch of many small jobs costs one
// channel send per worker, not one per job.
type batch struct {
	ctx  context.Context
	jobs []Job
	next atomic.Int64
	wg   sync.WaitGroup
}

// NewCPU starts a CPU decoder with opts.Workers goroutines.
func NewCPU(opts Options) *CPU {
	n := opts.Workers
	if n < 0 {
		// A caller's mistake, as a negative count is to make: refused, not
		// turned into the default.
		panic(fmt.Sprintf("codec: Options.Workers %d: want 0 (one per CPU) or more", n))
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
	return c
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
	for {
		i := int(b.next.Add(1) - 1)
		if i >= len(b.jobs) {
			return
		}
		j := &b.jobs[i]
		if err := b.ctx.Err(); err != nil {
			j.Err = fmt.Errorf("%s chunk not decoded: %w", j.Codec, err)
		} else {
			t0 := time.Now()
			j.Err = d.job(j)
			d.release()
			busy.Add(int64(time.Since(t0)))
		}
		pending.Add(-1)
	}
}

// Busy returns the time the workers have spent decoding, summed over them.
func (c *CPU) Busy() time.Duration { return time.Duration(c.busy.Load()) }

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
	b := &batch{ctx: ctx, jobs: jobs}
	c.pending.Add(int64(len(jobs)))
	n := min(c.workers, len(jobs))
	b.wg.Add(n)
	for range n {
		c.tickets <- b
	}
	b.wg.Wait()
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
