package deliver

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
)

// This file decides which of a fill's chunks bound for the device the
// host decodes instead. nvCOMP decodes the parts of a round (zstd frames,
// LZ4 blocks, blosc streams) side by side, each part alone: a round of a
// few large parts (zstd chunks of 16 MB, one frame each) takes one part's
// time with most of the GPU idle, and no merging of fills fills it. There
// the device path is slower than idle cores, which decode such a chunk
// each, at once. So, per fill, the chunks with a large part go to the
// host, largest first, as far as it decodes them within the time the
// device took for them in the fills before; all of them where it is the
// sooner, when cores are idle. Chunks of small parts (blosc's blocks) stay
// on the device, whose rate for them no core approaches: the host's CPU is
// what the device path saves.
//
// Both sides are measured on the fills themselves, not assumed: the
// device's wait for the fills whose large-part chunks it decoded, and the
// rate at which the host decoded (and uploaded) the chunks it took, which
// falls when its cores are busy with other fills, so that on few cores
// the device keeps its share. Until both are known, the host takes a
// chunk for each of its decoder's workers, which decode at once, and the
// device the rest (the first fills of a 16-core node, given the device
// all but one frame, waited 0.4 s for it). A share of fewer chunks than
// the workers decodes each chunk on a worker of its own, in about one
// chunk's time: its rate is that of a share filling the workers scaled
// down, and is scaled up to them (a share of one chunk on 16 cores
// measures one core; unscaled, the host's share would grow over many
// fills toward what it decodes at once). Either side shut out by the
// other's measures is tried again now and then (reprobe, probeDevice).

// minHostPiece is the least part a chunk must hold to be decoded on the
// host instead of the device: below it nvCOMP's part is short, and the
// device's rate over many of them is what counts.
const minHostPiece = 1 << 20

// hostMargin is the part of the device's time the host's share is sized
// to take: the host's own rate varies from fill to fill.
const hostMargin = 0.75

// ewmaWeight is the weight of a new measure in the router's averages.
const ewmaWeight = 0.25

// router holds one ring's measures (its fills are of one sample
// directory, alike).
type router struct {
	mu sync.Mutex
	// devWait is the device's wait for a fill's chunks when it decoded
	// chunks of large parts (0: not measured yet).
	devWait time.Duration
	// hostRate is the bytes a second the host decoded and uploaded its
	// share at (0: not measured yet).
	hostRate float64
	// idle counts the fills in a row with chunks of large parts of which
	// the host took none; unmeasured, those of which it took all while the
	// device's wait was not known.
	idle, unmeasured int
	// What it decided, for status (RouteInfo).
	fills, allHost, toHost, kept int64
}

// RouteInfo is a ring's router as status reports it: its measures, and
// the fills with chunks of large parts, those whose large-part chunks the
// host took all of, and such chunks by where they decoded.
type RouteInfo struct {
	DeviceWait float64 `json:"device_wait_s"`
	HostRate   float64 `json:"host_bytes_per_s"`
	Fills      int64   `json:"fills_with_large_parts"`
	AllOnHost  int64   `json:"fills_all_on_host"`
	OnHost     int64   `json:"large_chunks_on_host"`
	OnDevice   int64   `json:"large_chunks_on_device"`
}

func (r *router) info() *RouteInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fills == 0 {
		return nil
	}
	return &RouteInfo{DeviceWait: r.devWait.Seconds(), HostRate: r.hostRate, Fills: r.fills, AllOnHost: r.allHost,
		OnHost: r.toHost, OnDevice: r.kept}
}

// reprobe is the fills in a row the host takes no chunk of a large part
// before it decodes one again, to measure its rate anew.
const reprobe = 16

// probeDevice is the fills in a row the host takes every chunk of a large
// part, the device's wait never measured, before the device decodes one:
// a decoder with a worker for each of a fill's large chunks takes them
// all from the first fill on, and were its cores busy with training, the
// device would otherwise never be tried. The probe costs one fill the
// device's time for a chunk (0.2-0.3 s for a 16 MB zstd frame on an H100,
// against 0.13 s for the fill on 16 idle cores), once, after as many
// fills as this.
const probeDevice = 64

// split returns the jobs among dev (indices into jobs, bound for the
// device) that the host decodes instead, on a decoder of workers workers
// (0: not known), and whether any job of a large part stays on the device
// (its wait then measures the device: measured).
func (r *router) split(jobs []codec.Job, dev []int, workers int) (host []int, large bool) {
	type cand struct {
		i     int
		piece int64
	}
	var cands []cand
	var total int64
	for _, i := range dev {
		if p := gpu.LargestPiece(&jobs[i]); p >= minHostPiece {
			cands = append(cands, cand{i, p})
			total += int64(len(jobs[i].Dst))
		}
	}
	if len(cands) == 0 {
		return nil, false
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return cmp.Compare(b.piece, a.piece) })
	r.mu.Lock()
	wait, rate := r.devWait, r.hostRate
	r.mu.Unlock()
	var budget int64
	if rate == 0 || wait == 0 {
		// Either side not known: the host takes a chunk for each of its
		// workers, largest first, which decode at once (in about one
		// chunk's time) and measure its rate; the device the rest, which
		// measure its wait.
		for _, c := range cands[:min(max(workers, 1), len(cands))] {
			budget += int64(len(jobs[c.i].Dst))
		}
	} else {
		budget = int64(rate * wait.Seconds() * hostMargin)
	}
	if total <= budget {
		budget = total
	}
	var taken int64
	for _, c := range cands {
		n := int64(len(jobs[c.i].Dst))
		if taken+n > budget {
			large = true
			continue
		}
		taken += n
		host = append(host, c.i)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if large || wait != 0 {
		r.unmeasured = 0
	} else if r.unmeasured++; r.unmeasured >= probeDevice {
		// The device decodes the smallest such chunk, to measure its wait.
		r.unmeasured = 0
		host = host[:len(host)-1]
		large = true
	}
	if len(host) > 0 {
		r.idle = 0
	} else if r.idle++; r.idle >= reprobe {
		// The host's rate, measured when its cores were busy, would keep
		// it out for good: it decodes the smallest such chunk again.
		r.idle = 0
		last := cands[len(cands)-1].i
		host = append(host, last)
		large = len(cands) > 1
	}
	r.fills++
	if !large {
		r.allHost++
	}
	r.toHost += int64(len(host))
	r.kept += int64(len(cands) - len(host))
	return host, large
}

// deviceDone records the device's wait for a fill that left it chunks of
// large parts.
func (r *router) deviceDone(wait time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.devWait = ewma(r.devWait, wait)
}

// hostDone records that the host decoded and uploaded n bytes of its
// share, chunks chunks, in d, on a decoder of workers workers (0: not
// known).
func (r *router) hostDone(n int64, d time.Duration, chunks, workers int) {
	if n <= 0 || d <= 0 {
		return
	}
	rate := float64(n) / d.Seconds()
	if chunks > 0 && workers > chunks {
		rate *= float64(workers) / float64(chunks)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hostRate == 0 {
		r.hostRate = rate
		return
	}
	r.hostRate += ewmaWeight * (rate - r.hostRate)
}

func ewma(avg, x time.Duration) time.Duration {
	if avg == 0 {
		return x
	}
	return avg + time.Duration(ewmaWeight*float64(x-avg))
}
