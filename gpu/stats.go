package gpu

import (
	"errors"
	"sync/atomic"

	"github.com/zarrfs/zarrfs/zarr/codec"
)

// Stats counts the chunks a Decoder was given since New, by outcome, so
// that tests, benchmarks and metrics can tell what the GPU decoded from
// what went back to the CPU. Every job a DecodeBatch call returns with is
// counted once: in Chunks, Refused or Corrupt; a job whose caller gave up
// first, or that was handed to a closed Decoder, is not counted.
type Stats struct {
	// Chunks is the chunks decoded on the device and delivered to their
	// Dst with every check passed; Bytes their decoded size.
	Chunks, Bytes int64
	// Refused is the chunks returned with an error wrapping
	// codec.ErrUnsupported, for the CPU to decode: codecs or sizes the GPU
	// path does not take, and whole rounds the device failed.
	Refused int64
	// Corrupt is the chunks returned with any other error (damaged input
	// found on the host or by the device).
	Corrupt int64
	// Rounds is the rounds the device decoded.
	Rounds int64
	// Disagreed counts the chunks, among Refused, whose streams passed the
	// host checks and that nvCOMP then failed or decoded to another size.
	Disagreed int64
}

// Add returns the sum of two counts (over several GPUs, say).
func (s Stats) Add(o Stats) Stats {
	return Stats{Chunks: s.Chunks + o.Chunks, Bytes: s.Bytes + o.Bytes, Refused: s.Refused + o.Refused,
		Corrupt: s.Corrupt + o.Corrupt, Rounds: s.Rounds + o.Rounds, Disagreed: s.Disagreed + o.Disagreed}
}

// counters are a Decoder's Stats, updated as jobs settle.
type counters struct {
	chunks, bytes, refused, corrupt, rounds, disagreed atomic.Int64
}

// Stats returns the counts so far. Safe for concurrent use.
func (d *Decoder) Stats() Stats {
	c := &d.counts
	return Stats{Chunks: c.chunks.Load(), Bytes: c.bytes.Load(), Refused: c.refused.Load(),
		Corrupt: c.corrupt.Load(), Rounds: c.rounds.Load(), Disagreed: c.disagreed.Load()}
}

// count records the outcome of one job: its error, or n bytes delivered.
func (c *counters) count(err error, n int) {
	switch {
	case err == nil:
		c.chunks.Add(1)
		c.bytes.Add(int64(n))
	case errors.Is(err, codec.ErrUnsupported):
		c.refused.Add(1)
	default:
		c.corrupt.Add(1)
	}
}
