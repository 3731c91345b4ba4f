package decode

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/zarrfs/zarrfs/codec"
)

// fallback decodes on inner (the GPUs) and sends to the CPU what inner
// refuses (jobs whose Err wraps codec.ErrUnsupported: a codec nvCOMP lacks,
// a chunk larger than a round) or cannot attempt at all (a device failure:
// the whole batch).
type fallback struct {
	inner codec.BatchDecoder
	cpu   codec.BatchDecoder
	// warn is told once per pipeline that decoding moved to the CPU.
	warn func(what string, cause error)
}

func (f *fallback) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	err := f.inner.DecodeBatch(ctx, jobs)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		// The device failed as a whole: this batch runs on the CPU. A
		// batch that raced a sleep (the GPU closed under it) is no
		// failure worth the one warning.
		if !errors.Is(err, codec.ErrClosed) {
			f.warn("decoder failed", err)
		}
		for i := range jobs {
			jobs[i].Err = nil
		}
		return f.cpu.DecodeBatch(ctx, jobs)
	}
	var retry []codec.Job
	var at []int
	for i, j := range jobs {
		if errors.Is(j.Err, codec.ErrUnsupported) {
			j.Err = nil
			retry = append(retry, j)
			at = append(at, i)
		}
	}
	if len(retry) == 0 {
		return nil
	}
	f.warn("decoder refused chunks", jobs[at[0]].Err)
	if err := f.cpu.DecodeBatch(ctx, retry); err != nil {
		return err
	}
	for k, i := range at {
		jobs[i].Err = retry[k].Err
	}
	return nil
}

// spread hands each batch to the GPU with the fewest batches in flight
// (the first such in order), so several GPUs share the work; a GPU
// retired for the process takes none while another does.
type spread struct {
	decs []gpuDecoder
	busy []atomic.Int64
}

func newSpread(decs []gpuDecoder) *spread {
	return &spread{decs: decs, busy: make([]atomic.Int64, len(decs))}
}

func (s *spread) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	best := -1
	for i, d := range s.decs {
		if d.Retired() != nil {
			continue
		}
		if best < 0 || s.busy[i].Load() < s.busy[best].Load() {
			best = i
		}
	}
	if best < 0 {
		best = 0 // all retired: the first fails the batch for the CPU
	}
	s.busy[best].Add(1)
	defer s.busy[best].Add(-1)
	return s.decs[best].DecodeBatch(ctx, jobs)
}
