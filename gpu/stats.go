package gpu

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/codec"
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
	// WalkRejected counts the chunks, among Refused, with an LZ4 block
	// that the device's walk (lz4_check) rejected before nvCOMP read it:
	// damaged input, which the CPU then decodes or calls corrupt.
	WalkRejected int64
	// Device is the device time of the rounds, by stage.
	Device DeviceTimes
}

// DeviceTimes is device time by stage of rounds (CUDA events around each
// stage): the copies of compressed bytes to the device, the decoding
// (nvCOMP, and the LZ4 walk when on the device), the kernels after it
// (checksums, copies, unshuffling, byte swaps), and the copies of results
// back to the host.
type DeviceTimes struct {
	H2D, Decode, Kernels, D2H time.Duration
}

func (t *DeviceTimes) add(o DeviceTimes) {
	t.H2D += o.H2D
	t.Decode += o.Decode
	t.Kernels += o.Kernels
	t.D2H += o.D2H
}

// RingTimes is where the time of Ring.Decode calls went, summed over the
// calls given it.
type RingTimes struct {
	// Consumer is the wait for the reader's consumer event.
	Consumer time.Duration
	// Checks is the reading of the jobs' framing (and the host's checks)
	// on the caller's goroutines.
	Checks time.Duration
	// Wait is from the jobs queued to their bytes in the slot: the device
	// busy with other rounds, the call's own rounds, the copies into the
	// slot.
	Wait time.Duration
	// Device is the device time of the rounds the calls' jobs were in
	// (a round shared with other callers counts whole for each).
	Device DeviceTimes
}

// Add returns the sum of two counts (over several GPUs, say).
func (s Stats) Add(o Stats) Stats {
	return Stats{Chunks: s.Chunks + o.Chunks, Bytes: s.Bytes + o.Bytes, Refused: s.Refused + o.Refused,
		Corrupt: s.Corrupt + o.Corrupt, Rounds: s.Rounds + o.Rounds, Disagreed: s.Disagreed + o.Disagreed,
		WalkRejected: s.WalkRejected + o.WalkRejected,
		Device: DeviceTimes{s.Device.H2D + o.Device.H2D, s.Device.Decode + o.Device.Decode,
			s.Device.Kernels + o.Device.Kernels, s.Device.D2H + o.Device.D2H}}
}

// counters are a Decoder's Stats, updated as jobs settle.
type counters struct {
	chunks, bytes, refused, corrupt, rounds, disagreed, walkRejected atomic.Int64
	device                                                           [4]atomic.Int64 // DeviceTimes' fields, in order
}

func (c *counters) addDevice(t DeviceTimes) {
	for i, v := range []time.Duration{t.H2D, t.Decode, t.Kernels, t.D2H} {
		c.device[i].Add(int64(v))
	}
}

// Stats returns the counts so far. Safe for concurrent use.
func (d *Decoder) Stats() Stats {
	c := &d.counts
	return Stats{Chunks: c.chunks.Load(), Bytes: c.bytes.Load(), Refused: c.refused.Load(),
		Corrupt: c.corrupt.Load(), Rounds: c.rounds.Load(), Disagreed: c.disagreed.Load(),
		WalkRejected: c.walkRejected.Load(),
		Device: DeviceTimes{time.Duration(c.device[0].Load()), time.Duration(c.device[1].Load()),
			time.Duration(c.device[2].Load()), time.Duration(c.device[3].Load())}}
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

// Cost is what the chunks of one codec have cost the host on the GPU path:
// the chunks and bytes decoded and delivered, and the time the host spent
// on them on its own goroutines (reading framing and checking streams,
// packing compressed bytes into staging, copying decoded bytes out and
// checking their checksums), for chunks delivered or not. HostNanos over
// Bytes is the CPU the GPU path takes per decoded byte, to set against
// what decoding on the CPU takes: the GPU frees CPU only where it is less.
type Cost struct {
	Chunks, Bytes, HostNanos int64
}

// Costs returns the Cost of each codec the Decoder was given, since New.
// Safe for concurrent use.
func (d *Decoder) Costs() map[codec.Name]Cost {
	out := map[codec.Name]Cost{}
	d.costs.m.Range(func(k, v any) bool {
		c := v.(*costCounter)
		out[k.(codec.Name)] = Cost{Chunks: c.chunks.Load(), Bytes: c.bytes.Load(), HostNanos: c.nanos.Load()}
		return true
	})
	return out
}

// costTable is a Decoder's Costs, by codec.
type costTable struct{ m sync.Map } // codec.Name -> *costCounter

type costCounter struct{ chunks, bytes, nanos atomic.Int64 }

func (t *costTable) get(c codec.Name) *costCounter {
	if v, ok := t.m.Load(c); ok {
		return v.(*costCounter)
	}
	v, _ := t.m.LoadOrStore(c, new(costCounter))
	return v.(*costCounter)
}

func (t *costTable) host(c codec.Name, dt time.Duration) { t.get(c).nanos.Add(int64(dt)) }

func (t *costTable) delivered(c codec.Name, n int) {
	cc := t.get(c)
	cc.chunks.Add(1)
	cc.bytes.Add(int64(n))
}
