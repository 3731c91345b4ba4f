package decode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
)

// router is auto mode's route: the CPU pool, and the GPUs where they were
// measured to pay, batch by batch and codec by codec. The GPU path takes
// host CPU too (framing and checks, staging copies, checksums), nearly as
// much as decoding on the CPU for the codecs of ERA5-like stores: sending
// it work while the CPU has room only adds latency, and sending it work
// whose host side costs as much as decoding frees no CPU. So:
//
//   - a chunk the GPU would refuse (gpu.Refusal: a zstd frame without a
//     checksum, a codec it lacks) never goes there;
//   - the GPUs start only once the CPU pool has spent, on chunks a GPU
//     could take, as long as all its workers would in GPUStartAfter, and
//     only where such chunks are at least minShare of the CPU's decoding:
//     below that the GPU cannot win back its start (said once, with the
//     reason for the rest);
//   - while the pool has a spare worker, every batch decodes on the CPU;
//   - once it has none, the jobs of a codec go to the GPU only where the
//     GPU path's host time per decoded byte (gpu.Decoder.Costs) is under
//     payRatio of a CPU core's time per decoded byte (sampled: now and then
//     one job of a batch decodes on the caller's goroutine, timed), and
//     where the GPU's queue would finish the batch no later than the CPU's
//     (bytes in flight on each, times its measured time per byte);
//   - a codec whose costs are unknown is probed with a few batches of at
//     most probeBytes each (the first only warms the device, the next
//     measure), then kept on the GPU or declined; a declined codec is
//     probed again after a backoff (30 s, doubling to 10 min);
//   - and whatever the host costs say, the decoding rate with the GPU
//     taking a share is held to the rate of the CPU alone (rateGuard,
//     routeguard.go): a GPU share under which the pipeline decodes less
//     is turned off, with the same backoff.
//
// So a GPU that does not pay ends up taking nothing: auto is the CPU alone
// plus a few bounded probes.
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
	// refusal is why a GPU would leave a job to the CPU, or nil
	// (gpu.Refusal under the pipeline's GPU options).
	refusal func(*codec.Job) error
	// busy is the CPU pool's decoding time so far, summed over its
	// workers (codec.CPU.Busy); after is GPUStartAfter; start starts the
	// GPUs in the background, once.
	busy  func() time.Duration
	after time.Duration
	start func()
	// probeMax bounds a probe batch's decoded bytes (probeBytes).
	probeMax int64
	now      func() time.Time
	log      *slog.Logger

	inCPU, inGPU atomic.Int64 // decoded bytes of the batches in flight on each
	sampling     atomic.Bool  // a sample is being timed
	asked        atomic.Bool  // the router asked for the GPUs to start
	// settled says the router said why the GPUs do not start (the line
	// is logged once): from then
	// on beforeStart classifies one batch in settledPeriod (weighing it
	// as many), not every batch of the mount's life; unsettled counts
	// the batches since.
	settled   atomic.Bool
	unsettled atomic.Int64

	mu     sync.Mutex
	codecs map[codec.Name]*route
	gpuNs  float64 // EWMA: a GPU batch's wall time per byte of (bytes ahead of it + its own)
	// guard holds the decoding rate with the GPU to the CPU's alone; while
	// it has turned the GPU off, nothing goes there before offUntil.
	guard      rateGuard
	offUntil   time.Time
	offBackoff time.Duration
}

// route is what the router knows of one codec.
type route struct {
	cpuNs      float64 // EWMA: ns per decoded byte on one CPU core
	cpuSamples int
	seen       int64 // jobs routed, for the sampling period

	// okBytes and refusedBytes are the decoded bytes of its jobs a GPU
	// would take and would refuse (gpu.Refusal), as classified; why is
	// the last refusal.
	okBytes, refusedBytes int64
	why                   error

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
	// minShare: the GPUs start only where the chunks they may take are at
	// least this share of the CPU's decoding time. The GPU frees at most
	// 1-payRatio of that share's CPU, less than the noise of a fill below
	// it, and its start and probes cost seconds of a core.
	minShare = 0.2
	// probeBatches are sent to the GPU to measure a codec; the first of
	// them is not measured (the device's first use, staged memory). Each
	// takes at most probeBytes of decoded bytes (the rest of its batch
	// decodes on the CPU meanwhile), which bounds what a probe costs: the
	// staging the device grows for it and the wait of its batch.
	probeBatches = 4
	probeBytes   = 64 << 20
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
	// settledPeriod: once the router said the GPUs do not start, one
	// batch in this many is still classified, so that a change of the
	// work (other arrays, other codecs) may start them yet.
	settledPeriod = 64
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
// splits them by codec between the CPU and the GPUs. Before the GPUs
// start, it learns what share of the work they could take, and starts
// them once that share has kept the CPU busy long enough (beforeStart).
func (r *router) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	if !r.usable() {
		full := r.spare() == 0
		err := r.onCPU(ctx, jobs, full)
		if !r.asked.Load() {
			r.beforeStart(jobs)
		}
		return err
	}
	if r.spare() > 0 {
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

// classify sets, for each job whose codec is in want, whether a GPU would
// take it (gpu.Refusal), and returns the decoded bytes of those it would,
// by codec; it records both kinds' bytes for the share (shareLocked),
// times weight (the batches the classified one stands for).
func (r *router) classify(jobs []codec.Job, want func(codec.Name) bool, weight int64) ([]bool, map[codec.Name]int64) {
	ok := make([]bool, len(jobs))
	okBytes := map[codec.Name]int64{}
	why := map[codec.Name]error{}
	refused := map[codec.Name]int64{}
	for i := range jobs {
		j := &jobs[i]
		if len(j.Dst) == 0 || !want(j.Codec) {
			continue
		}
		n := int64(len(j.Dst))
		if codec.IsPartial(j.Codec) {
			refused[j.Codec] += n
			why[j.Codec] = errPartial
			continue
		}
		if err := r.refusal(j); err != nil {
			refused[j.Codec] += n
			why[j.Codec] = err
			continue
		}
		ok[i] = true
		okBytes[j.Codec] += n
	}
	r.mu.Lock()
	for c, n := range okBytes {
		r.codec(c).okBytes += n * weight
	}
	for c, n := range refused {
		rt := r.codec(c)
		rt.refusedBytes += n * weight
		rt.why = why[c]
	}
	r.mu.Unlock()
	return ok, okBytes
}

var errPartial = errors.New("blocks of a chunk read in part decode on the CPU")

// beforeStart classifies a batch the CPU decoded before the GPUs started,
// and starts them once the pool has spent, on chunks they could take, as
// long as all its workers would in r.after (the time it would have been
// full), provided such chunks are minShare of its decoding at least.
// Otherwise it says once why they do not start, and classifies only one
// batch in settledPeriod after that.
func (r *router) beforeStart(jobs []codec.Job) {
	weight := int64(1)
	if r.settled.Load() {
		if r.unsettled.Add(1)%settledPeriod != 0 {
			return
		}
		weight = settledPeriod
	}
	r.classify(jobs, func(codec.Name) bool { return true }, weight)
	need := r.after * time.Duration(r.workers)
	busy := r.busy()
	if busy < need {
		return
	}
	r.mu.Lock()
	share, why := r.shareLocked()
	r.mu.Unlock()
	tell := share < minShare && r.settled.CompareAndSwap(false, true)
	switch {
	case share >= minShare && time.Duration(float64(busy)*share) >= need:
		if r.asked.CompareAndSwap(false, true) {
			r.log.Debug("auto: starting the GPUs", "gpu_share", round(share), "cpu_busy", busy)
			r.start()
		}
	case tell:
		args := []any{"gpu_share", round(share), "least", minShare}
		if why != nil {
			args = append(args, "reason", why.Error())
		}
		if errors.Is(why, gpu.ErrUnverified) {
			args = append(args, "hint", "--gpu-trust-unchecked sends such chunks to the GPU, trusting nvCOMP with them")
		}
		r.log.Info("auto: keeping the decoding on the CPU: too little of it is of chunks a GPU may take", args...)
	}
}

// shareLocked is the share of the CPU's decoding time spent on jobs a GPU
// would take, by each codec's bytes times its cost per byte on a core
// (the mean of those known where a codec has no sample yet), and the
// refusal of the codec with the most bytes refused. r.mu is held.
func (r *router) shareLocked() (float64, error) {
	var known, nKnown float64
	for _, rt := range r.codecs {
		if rt.cpuNs > 0 {
			known += rt.cpuNs
			nKnown++
		}
	}
	mean := 1.0
	if nKnown > 0 {
		mean = known / nKnown
	}
	var ok, all float64
	var why error
	var most int64
	for _, rt := range r.codecs {
		w := rt.cpuNs
		if w == 0 {
			w = mean
		}
		ok += float64(rt.okBytes) * w
		all += float64(rt.okBytes+rt.refusedBytes) * w
		if rt.refusedBytes > most {
			most, why = rt.refusedBytes, rt.why
		}
	}
	if all == 0 {
		return 0, nil
	}
	return ok / all, why
}

// choose marks the jobs the GPU takes, the CPU pool being full, and
// counts them: of the codecs being probed or paying, the jobs a GPU would
// not refuse; a probe takes probeBytes at most.
func (r *router) choose(jobs []codec.Job) ([]bool, int) {
	now := r.now()
	r.mu.Lock()
	if now.Before(r.offUntil) || !r.guard.gpuAllowed() {
		r.mu.Unlock()
		return nil, 0
	}
	want := map[codec.Name]bool{}
	for _, j := range jobs {
		if _, seen := want[j.Codec]; seen {
			continue
		}
		rt := r.codec(j.Codec)
		if rt.state == declined && !now.Before(rt.retryAt) {
			rt.state, rt.sent, rt.done = probing, 0, 0
		}
		want[j.Codec] = rt.state == paying || rt.state == probing && rt.sent < probeBatches
	}
	r.mu.Unlock()
	ok, okBytes := r.classify(jobs, func(c codec.Name) bool { return want[c] }, 1)
	var total int64
	for _, b := range okBytes {
		total += b
	}
	r.mu.Lock()
	take := map[codec.Name]bool{}
	probe := map[codec.Name]bool{}
	for c := range okBytes {
		switch rt := r.codec(c); rt.state {
		case probing:
			if rt.sent < probeBatches {
				rt.sent++
				take[c], probe[c] = true, true
			}
		case paying:
			take[c] = r.gpuSooner(rt, total)
		}
	}
	r.mu.Unlock()
	out := make([]bool, len(jobs))
	n := 0
	probed := map[codec.Name]int64{}
	for i, j := range jobs {
		if !ok[i] || !take[j.Codec] {
			continue
		}
		if probe[j.Codec] {
			if probed[j.Codec] > 0 && probed[j.Codec]+int64(len(j.Dst)) > r.probeMax {
				continue // past the probe's bound: the CPU's
			}
			probed[j.Codec] += int64(len(j.Dst))
		}
		out[i] = true
		n++
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
		err := r.cpu.DecodeBatch(ctx, jobs)
		r.finished(jobs, false)
		return err
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
	r.finished(jobs, false)
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
	r.finished(jobs, true)
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
	off := r.now().Before(r.offUntil)
	out := map[string]string{}
	for c, rt := range r.codecs {
		st := [...]string{probing: "probing", paying: "gpu", declined: "cpu"}[rt.state]
		switch {
		case rt.okBytes == 0 && rt.refusedBytes > 0:
			st = "cpu (the GPU may not decode it: " + rt.why.Error() + ")"
		case off:
			st = "cpu (the GPU is off: the pipeline decoded less with it)"
		}
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
