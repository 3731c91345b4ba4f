package codec

import (
	"context"
	"sync/atomic"
)

// Overflow decodes on two decoders at once: a batch goes to First while
// fewer than Limit batches are decoding there, and to Then otherwise. With
// the CPU pool first and the GPU then, one reader's batches decode on the
// CPU, which answers a small batch sooner than a GPU round does, and the
// batches of many concurrent readers spill to the GPU, which merges them
// into the large rounds it needs, while the CPU keeps decoding too.
type Overflow struct {
	First, Then BatchDecoder
	// Limit is the number of batches First decodes at once. Zero means 1:
	// one batch of a sample's chunks already keeps every worker of a CPU
	// pool busy.
	Limit int

	busy atomic.Int64
}

var _ BatchDecoder = (*Overflow)(nil)

// DecodeBatch decodes jobs on First when it has room, else on Then.
func (o *Overflow) DecodeBatch(ctx context.Context, jobs []Job) error {
	limit := int64(max(o.Limit, 1))
	if o.busy.Add(1) <= limit {
		defer o.busy.Add(-1)
		return o.First.DecodeBatch(ctx, jobs)
	}
	o.busy.Add(-1)
	return o.Then.DecodeBatch(ctx, jobs)
}
