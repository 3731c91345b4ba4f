package decode

import (
	"context"
	"sync"

	"github.com/zarrfs/zarrfs/codec"
)

// Decoded counts the chunks and decoded bytes by codec and device ("cpu",
// "gpu"), for metrics.
type Decoded map[Place]Count

// Place is a codec on a device.
type Place struct {
	Codec  string
	Device string
}

// Count is a number of chunks and their decoded bytes.
type Count struct{ Chunks, Bytes int64 }

// counter tallies what a decoder decoded without error.
type counter struct {
	inner  codec.BatchDecoder
	device string
	mu     *sync.Mutex
	into   Decoded
}

func (c *counter) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	err := c.inner.DecodeBatch(ctx, jobs)
	if err != nil {
		// A failed batch is decoded again whole (fallback) and counted
		// there: counting its settled jobs here would count them twice.
		return err
	}
	local := map[codec.Name]Count{}
	for i := range jobs {
		if jobs[i].Err == nil {
			n := local[jobs[i].Codec]
			n.Chunks++
			n.Bytes += int64(len(jobs[i].Dst))
			local[jobs[i].Codec] = n
		}
	}
	c.mu.Lock()
	for name, n := range local {
		k := Place{string(name), c.device}
		v := c.into[k]
		v.Chunks += n.Chunks
		v.Bytes += n.Bytes
		c.into[k] = v
	}
	c.mu.Unlock()
	return err
}

var _ codec.Sparer = (*counter)(nil)

// Workers forwards the counted decoder's workers (0 when it does not
// say): the delivery router scales a small share's rate by them.
func (c *counter) Workers() int { return codec.WorkersOf(c.inner) }

var _ codec.Workerer = (*counter)(nil)

// Spare forwards the counted decoder's spare workers (the router asks).
func (c *counter) Spare() int {
	if s, ok := c.inner.(codec.Sparer); ok {
		return s.Spare()
	}
	return 0
}
