package codec

import (
	"context"
	"sync/atomic"
)

// Overflow decodes on two decoders at once: a batch goes to First while it
// has room, and to Then otherwise. With the CPU pool first and the GPU
// then, the CPU's cores are kept busy first, and what they cannot take at
// once spills to the GPU, which merges the batches of many concurrent
// readers into the large rounds it needs: the GPU only ever adds to what
// the CPU decodes, so the pair is not slower than the CPU alone.
//
// First has room when it reports spare workers (a Spare method, as *CPU
// has) or, for a decoder without one, while fewer than Limit batches are
// decoding there.
type Overflow struct {
	First, Then BatchDecoder
	// Limit is the number of batches First decodes at once when it cannot
	// say how many workers it has spare. Zero means 1.
	Limit int

	busy atomic.Int64
}

var _ BatchDecoder = (*Overflow)(nil)

// DecodeBatch decodes jobs on First when it has room, else on Then.
func (o *Overflow) DecodeBatch(ctx context.Context, jobs []Job) error {
	if s, ok := o.First.(interface{ Spare() int }); ok {
		if s.Spare() > 0 {
			return o.First.DecodeBatch(ctx, jobs)
		}
		return o.Then.DecodeBatch(ctx, jobs)
	}
	limit := int64(max(o.Limit, 1))
	if o.busy.Add(1) <= limit {
		defer o.busy.Add(-1)
		return o.First.DecodeBatch(ctx, jobs)
	}
	o.busy.Add(-1)
	return o.Then.DecodeBatch(ctx, jobs)
}
