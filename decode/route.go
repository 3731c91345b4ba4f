package decode

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
)

// router is auto mode's choice, batch by batch and codec by codec, between
// the CPU pool and the GPUs, from what each has been measured to cost. The
// GPU path takes host CPU too (framing and checks, staging copies,
// checksums), nearly as much as decoding on the CPU for the codecs of
// ERA5-like stores: sending it work while the CPU has room only adds
// latency, and sending it work whose host side costs as much as decoding
// frees no CPU. So:
//
//   - while the pool has a spare worker, every batch decodes on the CPU;
//   - once it has none, the jobs of a codec go to the GPU only where the
//     GPU path's host time per decoded byte (gpu.Decoder.Costs) is under
//     payRatio of a CPU core's time per decoded byte (sampled: now and then
//     one job of a batch decodes on the caller's goroutine, timed), and
//     where the GPU's queue would finish the batch no later than the CPU's
//     (bytes in flight on each, times its measured time per byte);
//   - a codec whose costs are unknown is probed with a few batches (the
//     first only warms the device, the next measure), then kept on the
//     GPU or declined; a declined codec is probed again after a backoff
//     (30 s, doubling to 10 min).
//
// So a GPU that does not pay ends up taking nothing: auto is the CPU alone
// plus a few probes.
type router struct {
	cpu     *counter               // the CPU pool
	spare   func() int             // its spare workers (cpu.Spare)
	inline  codec.BatchDecoder     // the same counted, decoding on the caller's goroutine (samples)
	gpu     atomic.Pointer[routed] // the GPUs, behind the fallback to the CPU (new ones after a sleep)
	workers int
	// costs sums gpu.Decoder.Costs over the usable GPUs; usable reports
	// whether any GPU takes work (none retired them all).
	costs  func() map[codec.Name]gpu.Cost
	usable func() bool
	now    func() time.Time
	log    *slog.Logger

	inCPU, inGPU atomic.Int64 // decoded bytes of the batches in flight on each
	sampling     atomic.Bool  // a sample is being timed

	mu     sync.Mutex
	codecs map[codec.Name]*route
	gpuNs  float64 // EWMA: a GPU batch's wall time per byte of (bytes ahead of it + its own)
}

// route is what the router knows of one codec.
type route struct {
	cpuNs      float64 // EWMA: ns per decoded byte on one CPU core
	cpuSamples int
	seen       int64 // jobs routed, for the sampling period

	state      routeState
	sent, done int      // probe batches sent to the GPU and finished
	base       gpu.Cost // the GPUs' Costs when the measured probes began
	hostNs     float64  // the GPU path's host ns per decoded byte, measured
	retryAt    time.Time
	backoff    time.Duration
}

type routeState int

const (
	probing  routeState = iota // unknown: a few batches go to the GPU
	paying                     // the GPU takes the codec when the CPU is full
	declined                   // the CPU only, until retryAt
)

const (
	// payRatio: the GPU takes a codec only where its host time per byte is
	// under this share of the CPU's: the rest is the CPU it frees.
	payRatio = 0.75
	// probeBatches are sent to the GPU to measure a codec; the first of
	// them is not measured (the device's first use, staged memory).
	probeBatches = 4
	// remeasureBytes: a paying codec's host cost is measured again every
	// so many decoded bytes on the GPU.
	remeasureBytes = 256 << 20
	firstBackoff   = 30 * time.Second
	maxBackoff     = 10 * time.Minute
	// Samples of the CPU's cost: the first few of each codec, then one job
	// in samplePeriod.
	firstSamples = 8
	samplePeriod = 64
	ewma         = 0.2
)

func (r *router) codec(c codec.Name) *route {
	rt := r.codecs[c]
	if rt == nil {
		rt = &route{}
		r.codecs[c] = rt
	}
	return rt
}

// DecodeBatch decodes jobs on the CPU while it has room, and otherwise
// splits them by codec between the CPU and the GPUs.
func (r *router) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	if r.spare() > 0 || !r.usable() {
		return r.onCPU(ctx, jobs, false)
	}
	onGPU, n := r.choose(jobs)
	switch n {
	case 0:
		return r.onCPU(ctx, jobs, true)
	case len(jobs):
		return r.onGPU(ctx, jobs)
	}
	// Both, at once, each on its share of the jobs.
	g, c := split(jobs, onGPU)
	var gerr error
	var wg sync.WaitGroup
	wg.Go(func() { gerr = r.onGPU(ctx, g.jobs) })
	cerr := r.onCPU(ctx, c.jobs, true)
	wg.Wait()
	g.merge(jobs)
	c.merge(jobs)
	if cerr != nil {
		return cerr
	}
	return gerr
}

// choose marks the jobs the GPU takes, the CPU pool being full, and
// counts them.
func (r *router) choose(jobs []codec.Job) ([]bool, int) {
	bytes := map[codec.Name]int64{}
	for _, j := range jobs {
		bytes[j.Codec] += int64(len(j.Dst))
	}
	var total int64
	for _, b := range bytes {
		total += b
	}
	now := r.now()
	r.mu.Lock()
	take := map[codec.Name]bool{}
	for c := range bytes {
		if codec.IsPartial(c) {
			continue // the blocks of a partial read: the CPU's alone (no GPU decodes them)
		}
		rt := r.codec(c)
		if rt.state == declined && !now.Before(rt.retryAt) {
			rt.state, rt.sent, rt.done = probing, 0, 0
		}
		switch rt.state {
		case probing:
			if rt.sent < probeBatches {
				rt.sent++
				take[c] = true
			}
		case paying:
			take[c] = r.gpuSooner(rt, total)
		}
	}
	r.mu.Unlock()
	var out []bool
	n := 0
	for _, j := range jobs {
		out = append(out, take[j.Codec])
		if take[j.Codec] {
			n++
		}
	}
	return out, n
}

// gpuSooner reports whether the GPUs would finish b more bytes no later
// than the CPU pool, given what each has in flight; an idle GPU takes them
// in any case (it frees CPU, and its time per byte is measured again).
// r.mu is held.
func (r *router) gpuSooner(rt *route, b int64) bool {
	if rt.cpuNs == 0 || r.gpuNs == 0 || r.inGPU.Load() == 0 {
		return true
	}
	cpu := float64(r.inCPU.Load()+b) * rt.cpuNs / float64(r.workers)
	gpu := float64(r.inGPU.Load()+b) * r.gpuNs
	return gpu <= cpu
}

// onCPU decodes jobs on the pool; now and then one of them decodes on
// this goroutine meanwhile, timed, for the CPU's cost of its codec (with
// force, even when the pool is full, if its codec has no sample yet).
func (r *router) onCPU(ctx context.Context, jobs []codec.Job, full bool) error {
	var n int64
	for _, j := range jobs {
		n += int64(len(j.Dst))
	}
	r.inCPU.Add(n)
	defer r.inCPU.Add(-n)
	k := r.pickSample(jobs, full)
	if k < 0 {
		return r.cpu.DecodeBatch(ctx, jobs)
	}
	defer r.sampling.Store(false)
	pick := make([]bool, len(jobs))
	pick[k] = true
	one, rest := split(jobs, pick)
	var err error
	var wg sync.WaitGroup
	if len(rest.jobs) > 0 {
		wg.Go(func() { err = r.cpu.DecodeBatch(ctx, rest.jobs) })
	}
	t0 := time.Now()
	serr := r.inline.DecodeBatch(ctx, one.jobs)
	dt := time.Since(t0)
	wg.Wait()
	one.merge(jobs)
	rest.merge(jobs)
	if j := jobs[k]; serr == nil && j.Err == nil && len(j.Dst) > 0 {
		r.mu.Lock()
		rt := r.codec(j.Codec)
		rt.cpuNs = average(rt.cpuNs, float64(dt)/float64(len(j.Dst)), rt.cpuSamples)
		rt.cpuSamples++
		r.mu.Unlock()
	}
	if serr != nil {
		return serr
	}
	return err
}

// pickSample returns the job to time, or -1; it takes the sampler's turn.
func (r *router) pickSample(jobs []codec.Job, full bool) int {
	if len(jobs) == 0 {
		return -1
	}
	r.mu.Lock()
	k := -1
	for i, j := range jobs {
		rt := r.codec(j.Codec)
		rt.seen++
		if k < 0 && len(j.Dst) > 0 && (rt.cpuSamples < firstSamples && (!full || rt.cpuSamples == 0) || rt.seen%samplePeriod == 0 && !full) {
			k = i
		}
	}
	r.mu.Unlock()
	if k < 0 || !r.sampling.CompareAndSwap(false, true) {
		return -1
	}
	return k
}

// onGPU decodes jobs on the GPUs and learns from it: the batch's time per
// byte, and for each codec being probed or kept there, its host cost.
func (r *router) onGPU(ctx context.Context, jobs []codec.Job) error {
	var n int64
	codecs := map[codec.Name]bool{}
	for _, j := range jobs {
		n += int64(len(j.Dst))
		codecs[j.Codec] = true
	}
	ahead := r.inGPU.Add(n)
	t0 := time.Now()
	err := r.gpu.Load().DecodeBatch(ctx, jobs)
	dt := time.Since(t0)
	r.inGPU.Add(-n)
	if err != nil || ctx.Err() != nil {
		return err
	}
	costs := r.costs()
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if ahead > 0 {
		r.gpuNs = average(r.gpuNs, float64(dt)/float64(ahead), 1)
	}
	for c := range codecs {
		r.learn(c, r.codec(c), costs[c], now)
	}
	return nil
}

// learn updates what the router knows of codec c after a GPU batch that
// held some of its jobs; cost is the GPUs' Costs of c now. r.mu is held.
func (r *router) learn(c codec.Name, rt *route, cost gpu.Cost, now time.Time) {
	switch rt.state {
	case probing:
		rt.done++
		if rt.done == 1 {
			rt.base = cost // the measured probes start now
			return
		}
		if rt.done < probeBatches {
			return
		}
		rt.hostNs = perByte(cost, rt.base, 0)
		rt.base = cost
		r.judge(c, rt, now)
	case paying:
		if cost.Bytes-rt.base.Bytes < remeasureBytes {
			return
		}
		rt.hostNs = perByte(cost, rt.base, rt.hostNs)
		rt.base = cost
		r.judge(c, rt, now)
	}
}

// judge keeps codec c on the GPU or declines it. r.mu is held.
func (r *router) judge(c codec.Name, rt *route, now time.Time) {
	pays := rt.cpuNs > 0 && rt.hostNs < payRatio*rt.cpuNs
	was := rt.state
	if pays {
		rt.state, rt.backoff = paying, 0
		if was != paying {
			r.log.Info("auto: the GPU takes this codec when the CPU is busy", "codec", string(c),
				"gpu_host_ns_per_byte", round(rt.hostNs), "cpu_ns_per_byte", round(rt.cpuNs))
		}
		return
	}
	rt.backoff = min(max(2*rt.backoff, firstBackoff), maxBackoff)
	rt.state, rt.retryAt = declined, now.Add(rt.backoff)
	why := "its host work per byte is not enough below a CPU core's decoding"
	if rt.cpuNs == 0 {
		why = "the CPU's cost is not known yet"
	}
	r.log.Info("auto: the GPU does not pay for this codec; decoding it on the CPU", "codec", string(c), "reason", why,
		"gpu_host_ns_per_byte", round(rt.hostNs), "cpu_ns_per_byte", round(rt.cpuNs), "retry_in", rt.backoff)
}

// Routes describes, per codec, what auto mode decided and measured, for
// status lines and tests.
func (r *router) routes() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for c, rt := range r.codecs {
		st := [...]string{probing: "probing", paying: "gpu", declined: "cpu"}[rt.state]
		out[string(c)] = fmt.Sprintf("%s (cpu %.3g ns/B, gpu host %.3g ns/B)", st, rt.cpuNs, rt.hostNs)
	}
	return out
}

// perByte is the host ns per byte between two Costs; with nothing
// delivered in between, infinite (all refused), unless prev stands.
func perByte(now, then gpu.Cost, prev float64) float64 {
	b := now.Bytes - then.Bytes
	ns := now.HostNanos - then.HostNanos
	switch {
	case b > 0:
		return float64(ns) / float64(b)
	case ns > 0 || prev == 0:
		return inf
	}
	return prev
}

const inf = 1e18

func average(avg, x float64, n int) float64 {
	if n == 0 || avg == 0 {
		return x
	}
	return avg + ewma*(x-avg)
}

func round(x float64) float64 {
	if x >= inf {
		return -1
	}
	return float64(int64(x*1000+0.5)) / 1000
}

// part is a subset of a batch's jobs, decoded on its own.
type part struct {
	jobs []codec.Job
	at   []int // index of each in the batch
}

// split divides jobs into those marked and the rest.
func split(jobs []codec.Job, mark []bool) (in, out part) {
	for i, j := range jobs {
		j.Err = nil
		if mark[i] {
			in.jobs, in.at = append(in.jobs, j), append(in.at, i)
		} else {
			out.jobs, out.at = append(out.jobs, j), append(out.at, i)
		}
	}
	return in, out
}

// merge writes the part's outcomes back into the batch.
func (p part) merge(jobs []codec.Job) {
	for k, i := range p.at {
		jobs[i].Err = p.jobs[k].Err
	}
}
