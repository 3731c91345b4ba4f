package decode

import (
	"time"

	"github.com/zarrfs/zarrfs/codec"
)

// rateGuard holds auto mode's GPU share to what it was for: more decoding
// per second than the CPU alone. The router's per-codec rule (host time per
// byte under payRatio of a core's) misses what the GPU path costs besides
// its measured host time: the driver's threads, memory bandwidth, the wait
// of a batch whose caller then holds a fill back. So the pipeline's rate
// is measured end to end, in windows of guardWindow: the decoded bytes of
// every batch finished, each weighted by its codec's time per byte on a
// core (so that a window of cheap codecs does not look fast), per second.
//
// A window in which the GPU finished work is a GPU window; one with work
// and none of it the GPU's, a CPU window. The GPU takes work only while
// the pool is full, so a CPU window of a steady load may be one the pool
// had room in: then the GPU would not have taken a share either. Every
// guardAB GPU windows the GPU is kept out for two windows (the first lets
// its batches in flight drain, the second measures the CPU alone), so the
// comparison is with the CPU under the load of now, not of the start.
// After judgeWindows GPU windows their mean rate is judged against the
// CPU windows' (an average): under (1 - loseMargin) of it, the GPU loses.
//
// Rates compare across windows only as far as the load stays the same: a
// reader that slows down while the GPU takes a share makes the GPU look
// worse, and the guard then errs towards the CPU alone, which is what
// auto promises never to be below.
type rateGuard struct {
	window time.Duration

	// The window open now.
	start  time.Time
	work   float64 // CPU-equivalent ns of the batches finished in it
	gpu    bool    // the GPU finished work in it
	hold   int     // windows left without the GPU (guardAB), this one included
	primed bool    // a window is open

	cpuRate float64 // EWMA of the CPU windows' rates
	cpuN    int
	gpuSum  float64 // rates of the GPU windows since the last verdict
	gpuN    int
	sinceAB int // GPU windows since the GPU was last kept out
}

// verdict is what a closed window says of the GPU share.
type verdict int

const (
	noVerdict verdict = iota
	gpuKeeps          // the rate with the GPU is the CPU's or better
	gpuLoses          // the rate with the GPU is below the CPU's
)

const (
	guardWindow  = 500 * time.Millisecond
	judgeWindows = 4
	guardAB      = 16
	loseMargin   = 0.03
)

// gpuAllowed reports whether the GPU may take work in the window open now.
func (g *rateGuard) gpuAllowed() bool { return g.hold == 0 }

// add counts work (CPU-equivalent ns) finished now, on the GPU or not.
func (g *rateGuard) add(work float64, onGPU bool) {
	g.work += work
	g.gpu = g.gpu || onGPU
}

// tick closes the window open when it is window old, and opens the next;
// it returns the verdict, if any.
func (g *rateGuard) tick(now time.Time) verdict {
	if !g.primed {
		g.start, g.work, g.gpu, g.primed = now, 0, false, true
		return noVerdict
	}
	el := now.Sub(g.start)
	if el < g.window {
		return noVerdict
	}
	rate := g.work / float64(el)
	v := noVerdict
	switch {
	case g.hold == 2:
		// The GPU's batches in flight drain: neither's rate.
	case g.gpu && g.hold == 0:
		g.gpuSum += rate
		g.gpuN++
		g.sinceAB++
		if g.gpuN >= judgeWindows && g.cpuN > 0 {
			v = gpuKeeps
			if g.gpuSum/float64(g.gpuN) < (1-loseMargin)*g.cpuRate {
				v = gpuLoses
			}
			g.gpuSum, g.gpuN = 0, 0
		}
	case !g.gpu && g.work > 0:
		g.cpuRate = average(g.cpuRate, rate, g.cpuN)
		g.cpuN++
	}
	g.hold = max(g.hold-1, 0)
	if g.sinceAB >= guardAB && g.hold == 0 {
		g.hold, g.sinceAB = 2, 0
	}
	g.start, g.work, g.gpu = now, 0, false
	return v
}

// reset forgets the GPU windows (the GPU was turned off, or starts again).
func (g *rateGuard) reset() { g.gpuSum, g.gpuN, g.sinceAB, g.hold = 0, 0, 0, 0 }

// finished counts a batch's jobs, decoded on the GPU or not, in the
// guard's window, and acts on its verdict: a GPU share that loses is
// turned off for a backoff that doubles each time (firstBackoff to
// maxBackoff), every codec to be probed again after it.
func (r *router) finished(jobs []codec.Job, onGPU bool) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var work float64
	for _, j := range jobs {
		if j.Err == nil {
			if rt := r.codecs[j.Codec]; rt != nil {
				work += float64(len(j.Dst)) * rt.cpuNs
			}
		}
	}
	r.guard.add(work, onGPU)
	switch r.guard.tick(now) {
	case gpuKeeps:
		r.offBackoff = 0
	case gpuLoses:
		r.offBackoff = min(max(2*r.offBackoff, firstBackoff), maxBackoff)
		t := r.now()
		r.offUntil = t.Add(r.offBackoff)
		for _, rt := range r.codecs {
			if rt.state != declined {
				rt.state, rt.retryAt, rt.backoff = declined, r.offUntil, r.offBackoff
			}
		}
		r.guard.reset()
		r.log.Info("auto: the pipeline decoded less with the GPU taking a share than the CPU alone; decoding on the CPU",
			"retry_in", r.offBackoff)
	}
}
