package gpu

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/codec"
)

// errClosed is DecodeBatch's error after Close.
var errClosed = fmt.Errorf("gpu: %w", codec.ErrClosed)

// This file merges the batches of concurrent callers. A sample of a view is
// one DecodeBatch of a few chunks (20 channels: 20 chunks), and nvCOMP needs
// many chunks at once to fill a GPU; so callers do not take turns on the
// device: each queues its jobs, and one goroutine (the submitter) packs
// whatever is queued when a buffer set frees up into one round, while a
// second (the completer) waits for rounds in flight and copies their chunks
// out to their callers. Each caller waits for its own jobs only.
//
// The device half sits behind the device interface, so that the queueing is
// tested without a GPU (queue_test.go).

// device decodes rounds. prepare and start run on the submitter's
// goroutine, collect and finishDirect on the completer's, each locked to
// its OS thread; a round is prepared only on a buffer set with no round in
// flight, and collected in the order rounds were started.
type device interface {
	// needsIdle reports whether the next round needs every buffer set
	// idle: after a sticky device error it rebuilds the context, which
	// frees every buffer.
	needsIdle() bool
	// prepare readies buffer set r.set for round r: a context rebuilt
	// after a fault, the set's buffers grown to the round's layout. It
	// reads the jobs' lengths and addresses, never their bytes, so it runs
	// with no caller's lock held: a driver call that blocks there (on a
	// device that stopped answering) holds up no caller past the watchdog.
	prepare(r *round) error
	// trim frees every set's round buffers, so that one round may grow
	// its own within the device's bounds. The caller holds every set.
	trim()
	// pack copies the jobs' compressed bytes that the device does not
	// read in place into r's set. It is the one step that reads callers'
	// memory on the host, and it makes no driver call, so it runs under
	// the callers' locks and returns.
	pack(r *round)
	// start queues r's device work. It runs under no caller's lock: its
	// driver calls may block for good behind a kernel that loops. The
	// device may read the jobs' Src until collect returns (pinned memory
	// is copied asynchronously), but it writes no job's memory before
	// finishDirect; when start fails, the device has stopped reading by
	// the time it returns, or r.deadline has passed.
	start(r *round) error
	// collect waits for r's device work, until r.deadline or until cancel
	// is closed. It returns, per job of the round, the decoded bytes
	// (valid until r.set is prepared again; nil for a job whose Dst the
	// device writes itself, in finishDirect) or why there are none; or an
	// error when the round failed as a whole, wrapping errRoundTimeout
	// when the deadline passed first.
	collect(r *round, cancel <-chan struct{}) (outs [][]byte, errs []error, err error)
	// finishDirect copies the decoded bytes of the jobs which (indices into
	// r.jobs whose outs were nil) into their Dst, and waits for the copies
	// until deadline or cancel, as collect does.
	finishDirect(r *round, which []int, deadline time.Time, cancel <-chan struct{}) error
	// close frees the device's resources; nothing is in flight.
	close()
	// abandon is close for a device that did not finish a round: its work
	// may still be running, so nothing it may use is freed.
	abandon()
}

// request is one DecodeBatchSwap call waiting for its jobs.
type request struct {
	seq      uint64 // queue order
	ctx      context.Context
	jobs     []codec.Job // the caller's
	preps    []prepared  // per job
	ok       []int       // the jobs sent to the device
	elemSize int
	// dev, when set, is per job where on the device its decoded bytes go
	// instead of Dst (none: Dst) (Ring.DecodeRuns): they never come back
	// to the host.
	dev [][]devRun
	// times, when set, gets the device time of every round its jobs were
	// in (RingTimes).
	times *RingTimes
	// ring is the Ring dev points into (Ring.Decode), nil for none.
	ring *Ring

	// mu is held shared while the decoder reads the jobs' Src (packing) or
	// writes their Dst or Err, and exclusively by a caller giving up, who
	// sets abandoned: after that nothing touches the caller's memory.
	mu        sync.RWMutex
	abandoned atomic.Bool
	fin       []bool // per job: result written (under mu shared; distinct jobs)
	// onDevice counts the rounds packed with jobs of this request in
	// pinned memory and not yet collected: the device may copy from their
	// Src or into their Dst until then, so a caller giving up waits for it
	// (or for the Decoder's retirement: a hung device may still read its
	// Src, never write its Dst).
	onDevice sync.WaitGroup
	left     atomic.Int64 // jobs of ok without a result
	err      atomic.Pointer[error]
	done     chan struct{} // closed when left reaches 0, or by the watchdog
	doneOnce sync.Once
}

// item is one job of a request, waiting in the submitter's queue.
type item struct {
	req *request
	i   int
}

// round is what one buffer set decodes at once: jobs of one or more
// callers, all with the same elemSize.
type round struct {
	items    []item
	jobs     []codec.Job // copies of the items' jobs (layout and packing read these)
	preps    []prepared  // the items' preparations
	dev      [][]devRun  // per job, where on the device it goes (request.dev); nil: none
	elemSize int
	fenced   bool
	set      int
	// exclusive: every buffer set is held for this round, so the device
	// may rebuild its context before it.
	exclusive bool
	// ahead: the round holds a place among the ring rounds in flight
	// (awaitAhead), given back when it is done.
	ahead   bool
	callers int
	reqs    []*request // callers with pinned memory in the round: onDevice counts it
	fl      *inflight  // the device's state of the round
	// The watchdog's (watchdog.go): when the round must be done by, the
	// timer that retires the device if the submitter is still taking the
	// round up then, and whether it has (started) and the round is
	// settled.
	deadline time.Time
	watch    *time.Timer
	started  atomic.Bool
	settled  atomic.Bool
	// pre is set by collect, per job: a shuffled blosc chunk's bytes
	// before unshuffling, for the host's check of its streams
	// (prepared.sums); nil where there are none.
	pre   [][]byte
	stats []any // what collect adds to the round's debug line
	// times is the device time of the round's stages, set by collect.
	times DeviceTimes
}

// devAt is where on the device job k of the round goes, none for its Dst.
func (r *round) devAt(k int) []devRun {
	if r.dev == nil {
		return nil
	}
	return r.dev[k]
}

// start launches the submitter and the completer over dev.
func (d *Decoder) start(dev device) {
	d.rounds = dev
	d.wake = make(chan struct{}, 1)
	n := d.opts.Streams
	d.free = make(chan int, n)
	for s := range n {
		d.free <- s
	}
	d.ringAhead = make(chan struct{}, ringRoundsAhead)
	for range ringRoundsAhead {
		d.ringAhead <- struct{}{}
	}
	d.submitted = make(chan *round, n)
	d.stopped = make(chan struct{})
	d.completerDone = make(chan struct{})
	d.hungCh = make(chan struct{})
	d.live = map[*request]struct{}{}
	go d.submitLoop()
	go d.completeLoop()
}

// DecodeBatchSwap is DecodeBatch followed, on the GPU, by reversing the
// bytes of every elemSize-byte element of every decoded chunk: the byte
// swap of big-endian arrays. elemSize 0 or 1 swaps nothing; a chunk whose
// length is not a multiple of elemSize fails with codec.ErrUnsupported.
//
// The jobs join those of other callers waiting for the device with the
// same elemSize. When ctx ends first, DecodeBatchSwap returns its error at
// once (after a pack or copy-out of the caller's chunks under way, if any,
// and, for jobs in pinned memory from HostAlloc, after the device's copies
// from and to it: a round's time at most); the jobs without a result then
// wrap codec.ErrUnsupported, and the decoder neither reads nor writes the
// jobs' memory again.
func (d *Decoder) DecodeBatchSwap(ctx context.Context, jobs []codec.Job, elemSize int) error {
	return d.decodeBatch(ctx, jobs, elemSize, nil)
}

// ringCall is what Ring.DecodeRuns asks of decodeBatch beside the jobs:
// dev, per job, where on the device its decoded bytes go instead of its
// Dst (none: its Dst); LZ4 blocks walked on the device rather than on the host,
// whose CPU is what the device path saves; where the time went.
type ringCall struct {
	ring  *Ring
	dev   [][]devRun
	times *RingTimes
}

// decodeBatch is DecodeBatchSwap, with what a Ring asks (rc, nil for
// DecodeBatchSwap).
func (d *Decoder) decodeBatch(ctx context.Context, jobs []codec.Job, elemSize int, rc *ringCall) error {
	var dev [][]devRun
	var times *RingTimes
	var ring *Ring
	if rc != nil {
		dev, times, ring = rc.dev, rc.times, rc.ring
	}
	tChecks := time.Now()
	if err := ctx.Err(); err != nil {
		for i := range jobs {
			jobs[i].Err = fmt.Errorf("gpu: batch not decoded: %w: %w", codec.ErrUnsupported, err)
		}
		return err
	}
	if err := d.Retired(); err != nil {
		// The GPU is off for the process: not even the framing is read.
		for i := range jobs {
			jobs[i].Err = fmt.Errorf("gpu: batch not decoded: %w: %w", codec.ErrUnsupported, err)
			d.counts.count(jobs[i].Err, 0)
		}
		return err
	}
	if elemSize < 0 {
		elemSize = 0
	}
	preps := make([]prepared, len(jobs))
	// Framing and stream checks (a walk of every snappy stream) run on the
	// copy workers: on one goroutine they could bound a large batch. They
	// run here, on the caller's goroutine, while the device decodes other
	// callers' rounds. LZ4 blocks are walked here unless the device walks
	// them (Options.WalkOnDevice).
	d.parallel(len(jobs), func(i int) {
		t0 := time.Now()
		if d.noValidate || d.opts.WalkOnDevice || rc != nil {
			preps[i] = frame(&jobs[i])
			preps[i].walkDevice = rc != nil && !d.noValidate
		} else {
			preps[i] = prepare(&jobs[i])
		}
		d.costs.host(jobs[i].Codec, time.Since(t0))
	})
	var ok []int
	for i := range jobs {
		jobs[i].Err = nil
		preps[i].err = d.opts.refusal(&jobs[i], &preps[i])
		if preps[i].err == nil && elemSize > 1 && len(jobs[i].Dst)%elemSize != 0 {
			preps[i].err = fmt.Errorf("gpu: %d-byte chunk is not a whole number of %d-byte elements: %w",
				len(jobs[i].Dst), elemSize, codec.ErrUnsupported)
		}
		if preps[i].err == nil && dev != nil && len(dev[i]) > 0 && (preps[i].check != checkNone || len(preps[i].sums) > 0) {
			if d.hashKernel && preps[i].hashable() && !d.opts.SkipChecksums {
				preps[i].devHash = true // the device verifies it (devhash.go)
			} else {
				// The host verifies such a chunk over its decoded bytes,
				// which a device address keeps from it.
				preps[i].err = fmt.Errorf("gpu: %s chunk: its checksum is verified on the host, not decoded into device memory: %w", jobs[i].Codec, codec.ErrUnsupported)
			}
		}
		if preps[i].err != nil {
			jobs[i].Err = preps[i].err
			d.counts.count(jobs[i].Err, 0)
			continue
		}
		ok = append(ok, i)
	}
	if times != nil {
		times.Checks += time.Since(tChecks)
		defer func(t0 time.Time) { times.Wait += time.Since(t0) }(time.Now())
	}
	if len(ok) == 0 {
		return nil
	}
	q := &request{ctx: ctx, jobs: jobs, preps: preps, ok: ok, elemSize: elemSize, dev: dev, times: times, ring: ring,
		fin: make([]bool, len(jobs)), done: make(chan struct{})}
	q.left.Store(int64(len(ok)))
	if err := d.enqueue(q); err != nil {
		return d.failAll(jobs, ok, err)
	}
	select {
	case <-q.done:
		return q.result()
	case <-ctx.Done():
	}
	q.mu.Lock()
	if q.left.Load() == 0 {
		// Every result is written (they are, before left drops).
		q.mu.Unlock()
		return q.result()
	}
	q.abandoned.Store(true)
	q.mu.Unlock()
	d.forget(q)
	// No round takes its jobs any more; those on the device may still be
	// copying to or from its pinned memory, unless the device hung: then
	// its round is never collected, and it writes no caller's memory.
	onDevice := make(chan struct{})
	go func() { q.onDevice.Wait(); close(onDevice) }()
	select {
	case <-onDevice:
	case <-d.hungCh:
	}
	err := ctx.Err()
	for _, i := range ok {
		if !q.fin[i] {
			jobs[i].Err = fmt.Errorf("gpu: batch not decoded: %w: %w", codec.ErrUnsupported, err)
		}
	}
	return err
}

func (q *request) result() error {
	if p := q.err.Load(); p != nil {
		return *p
	}
	return nil
}

// enqueue hands q to the submitter.
func (d *Decoder) enqueue(q *request) error {
	d.qmu.Lock()
	if d.closing {
		d.qmu.Unlock()
		return errClosed
	}
	// Under qmu: the watchdog sets the error before it takes the live
	// requests, so a request is either refused here or released there.
	if err := d.Retired(); err != nil {
		d.qmu.Unlock()
		return err
	}
	d.seq++
	q.seq = d.seq
	d.queue = append(d.queue, q)
	d.live[q] = struct{}{}
	d.qmu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	return nil
}

// take returns the requests queued since the last call and whether Close
// was called; with block, it waits for one or for Close.
func (d *Decoder) take(block bool) ([]*request, bool) {
	for {
		d.qmu.Lock()
		qs, closing := d.queue, d.closing
		d.queue = nil
		d.qmu.Unlock()
		if len(qs) > 0 || closing || !block {
			return qs, closing
		}
		<-d.wake
	}
}

func appendItems(pending []item, qs []*request) []item {
	for _, q := range qs {
		for _, i := range q.ok {
			pending = append(pending, item{q, i})
		}
	}
	return pending
}

// submitLoop is the submitter: it waits for jobs, then for a free buffer
// set, and packs into it everything queued by then (up to the round's
// bounds), so that callers arriving while the device is busy share the
// next round.
func (d *Decoder) submitLoop() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var pending []item
	for {
		qs, closing := d.take(len(pending) == 0)
		pending = appendItems(pending, qs)
		if closing {
			break
		}
		ahead := d.awaitAhead(pending)
		set := <-d.free
		// Whatever queued while the sets were busy joins this round.
		qs, closing = d.take(false)
		pending = appendItems(pending, qs)
		if closing {
			d.free <- set
			d.behind(ahead)
			break
		}
		var r *round
		r, pending = d.nextRound(pending)
		if r == nil {
			d.free <- set
			d.behind(ahead)
			continue
		}
		r.set, r.ahead = set, ahead
		d.runRound(r)
	}
	// Close: jobs not yet on the device fail; rounds in flight finish.
	d.settle(d.roundOf(pending), nil, nil, errClosed)
	for range d.opts.Streams {
		<-d.free
	}
	close(d.submitted)
	<-d.completerDone
	if d.hung.Load() {
		d.rounds.abandon()
	} else {
		d.rounds.close()
	}
	close(d.stopped)
}

// ringRoundsAhead is the most rounds with jobs bound for a ring (the
// device path) in flight at once: one decoding, one readied behind it,
// its input crossing meanwhile. nvCOMP does not decode a round beside
// another one's, so a third round in flight would only wait on the
// device, while its jobs, and those of the fills that come meanwhile,
// could share the next round: a round of few large zstd chunks (the
// device path fills a batch of a few samples at a time) leaves most of
// the GPU idle, one of several fills' chunks does not.
const ringRoundsAhead = 2

// awaitAhead waits, when pending holds jobs bound for a ring, until fewer
// than ringRoundsAhead rounds of them are in flight, and reports whether
// the next round is one of them (behind, or the completer, gives its
// place back). A retired Decoder waits for nothing: its rounds fail at
// once.
func (d *Decoder) awaitAhead(pending []item) bool {
	ring := false
	for _, it := range pending {
		if it.req.dev != nil {
			ring = true
			break
		}
	}
	if !ring {
		return false
	}
	select {
	case <-d.ringAhead:
		return true
	case <-d.hungCh:
		return false
	}
}

// behind gives back a place among the rounds ahead (awaitAhead).
func (d *Decoder) behind(ahead bool) {
	if ahead {
		d.ringAhead <- struct{}{}
	}
}

// roundOf makes a round of items for settle, without device state.
func (d *Decoder) roundOf(items []item) *round {
	r := &round{items: items}
	r.jobs, r.preps = make([]codec.Job, len(items)), make([]prepared, len(items))
	for k, it := range items {
		r.jobs[k], r.preps[k] = it.req.jobs[it.i], it.req.preps[it.i]
	}
	return r
}

// nextRound takes the next round's items from pending, oldest first: those
// with the first live item's elemSize, until the round is full. It returns
// the items left, in order, without those of callers that gave up.
//
// A round closes at RoundBytes only once it holds enough pieces to keep
// the GPU busy (nvCOMP works on pieces in parallel, each piece alone), else
// at its share of the memory bound.
func (d *Decoder) nextRound(pending []item) (*round, []item) {
	var take []item
	rest := make([]item, 0, len(pending))
	var cost int64
	var pieces int
	full := false
	elem := -1
	for _, it := range pending {
		q := it.req
		if q.abandoned.Load() || q.ctx.Err() != nil {
			continue // the caller returns without them
		}
		if full || (elem >= 0 && q.elemSize != elem) {
			rest = append(rest, it)
			continue
		}
		p := &q.preps[it.i]
		c := p.cost(int64(len(q.jobs[it.i].Dst)))
		if len(take) > 0 && (cost+c > d.roundLimit() ||
			(cost+c > d.opts.RoundBytes && pieces >= minRoundPieces) || len(take) >= maxJobsPerRound) {
			full = true
			rest = append(rest, it)
			continue
		}
		elem = q.elemSize
		take = append(take, it)
		cost += c
		pieces += len(p.pieces)
	}
	if len(take) == 0 {
		return nil, rest
	}
	return &round{items: take, elemSize: elem}, rest
}

// minRoundLimit is the least that shrinkRounds cuts rounds to.
const minRoundLimit = 16 << 20

// growAfter is how many rounds in a row must fit beside the others at the
// cut size before rounds are let grow again, doubling (roundFitted): what
// a miss cost may have passed (the others' buffers had grown for other
// codecs, nvCOMP's zstd scratch for a larger round), and a cut kept for the
// process's life left a later fill's rounds much smaller than they could
// be (blosc-lz4 after zstd rounds had missed; BENCHMARKS.md, tuning
// choices). A grown round that misses again costs one round readied
// alone, once per growAfter rounds at most.
const growAfter = 32

// roundLimit is the most a round may cost: its share of the memory bound,
// less after rounds did not fit the device's bounds beside each other
// (shrinkRounds).
//
// While rings are open (ipc.go), what they leave of DeviceBytes is split
// among the rounds in flight as package decode splits --gpu-memory: half
// for the rounds' buffers, half for nvCOMP's scratch and slack. Rounds
// sized for the whole budget would each be readied alone beside a ring,
// the other sets' buffers freed every time.
func (d *Decoder) roundLimit() int64 {
	lim := d.opts.share()
	if c := d.roundCap.Load(); c > 0 {
		lim = min(c, lim)
	}
	if rings := d.ringHeld.Load(); rings > 0 && d.opts.DeviceBytes < math.MaxInt64 {
		lim = min(lim, max((d.opts.DeviceBytes-rings)/int64(2*d.opts.Streams), min(minRoundLimit, d.opts.share())))
	}
	return lim
}

// shrinkRounds halves the rounds to come after one did not fit beside the
// others' buffers (nvCOMP's scratch for zstd grows with the round), so
// that later rounds fit side by side instead of each waiting for every
// set and freeing their buffers.
func (d *Decoder) shrinkRounds(why error) {
	c := max(d.roundLimit()/2, min(minRoundLimit, d.opts.share()))
	d.fitStreak = 0
	d.roundCap.Store(c)
	d.log.Debug("gpu: round readied alone, the others' buffers freed, and rounds cut to fit side by side", "round_bytes", c, "err", why)
}

// roundFitted counts a round readied beside the others' buffers; after
// growAfter of them in a row while rounds are cut, the cut is doubled, and
// lifted once it reaches the round's share.
func (d *Decoder) roundFitted() {
	c := d.roundCap.Load()
	if c <= 0 {
		return
	}
	if d.fitStreak++; d.fitStreak < growAfter {
		return
	}
	d.fitStreak = 0
	next := 2 * c
	if next >= d.opts.share() {
		next = 0
	}
	if d.roundCap.CompareAndSwap(c, next) {
		d.log.Debug("gpu: rounds fitted side by side, let grow", "round_bytes", cmp.Or(next, d.opts.share()))
	}
}

// runRound takes r up on its set; the completer finishes it. A fenced
// round (one holding deflate segments) runs alone: should an overrun
// escape its buffer, no other round's bytes are in flight.
func (d *Decoder) runRound(r *round) {
	held := []int{r.set}
	for _, it := range r.items {
		if !d.noFence && it.req.preps[it.i].uses(algoDeflate) {
			r.fenced = true
			break
		}
	}
	if r.fenced || d.rounds.needsIdle() {
		for len(held) < d.opts.Streams {
			held = append(held, <-d.free)
		}
		r.exclusive = true
	}
	release := func(keep int) {
		for _, s := range held {
			if s != keep {
				d.free <- s
			}
		}
	}
	d.watch(r)
	err := d.Retired()
	// The set is readied, and the round started, with no caller's lock
	// held (a driver call may block on a device that stopped answering,
	// and the watchdog must then be able to release every caller, and a
	// caller to give up); in between, each caller's lock is held shared
	// while its jobs are packed. A caller that gave up meanwhile is
	// dropped, and the set readied again for those left: its Src may
	// already be reused, and unchecked bytes must not reach nvCOMP.
	var reqs []*request
	locked := false
	for err == nil {
		if !r.liveJobs() {
			break
		}
		if err = d.rounds.prepare(r); err != nil {
			if d.readyAlone(r, &held, err) {
				err = nil
				continue
			}
			break
		}
		if !r.exclusive {
			d.roundFitted()
		}
		if reqs, locked = lockCallers(r.items, reqs[:0]); locked {
			break
		}
	}
	if locked {
		r.callers = len(reqs)
		d.rounds.pack(r)
		// Callers whose pinned memory the device copies from or to
		// asynchronously: onDevice is raised before such a caller can
		// give up (it takes mu to do so).
		for k, it := range r.items {
			q, j := it.req, &r.jobs[k]
			if (len(r.reqs) == 0 || r.reqs[len(r.reqs)-1] != q) && (d.pinned(j.Src) || d.pinned(j.Dst) || len(r.devAt(k)) > 0) {
				q.onDevice.Add(1)
				r.reqs = append(r.reqs, q)
			}
		}
		for _, q := range reqs {
			q.mu.RUnlock()
		}
		err = d.rounds.start(r)
	}
	r.started.Store(true)
	switch {
	case err != nil:
		d.settle(r, nil, nil, err)
		for _, q := range r.reqs {
			q.onDevice.Done() // a failed start has stopped reading their memory
		}
		release(-1)
		d.behind(r.ahead)
	case len(r.items) == 0:
		d.settle(r, nil, nil, nil)
		release(-1)
		d.behind(r.ahead)
	case r.fenced:
		d.submitted <- r
		// The other sets stay held until the fenced round is done.
		held = slices.DeleteFunc(held, func(s int) bool { return s == r.set })
		held = append(held, <-d.free)
		release(-1)
	default:
		d.submitted <- r
		release(r.set)
	}
}

// ringLost is an error when a job of r goes to a ring that a context
// rebuild lost (its addresses may be another allocation's now).
func (r *round) ringLost() error {
	for _, it := range r.items {
		if g := it.req.ring; g != nil && g.lostErr() != nil {
			return g.lostErr()
		}
	}
	return nil
}

// liveJobs drops the items of callers that gave up and makes the round's
// jobs and preparations of the others; false when none is left.
func (r *round) liveJobs() bool {
	live := r.items[:0]
	for _, it := range r.items {
		if !it.req.abandoned.Load() {
			live = append(live, it)
		}
	}
	r.items = live
	if len(live) == 0 {
		return false
	}
	r.jobs, r.preps = make([]codec.Job, len(live)), make([]prepared, len(live))
	r.dev = nil
	for k, it := range live {
		// Not the whole Job: a caller that gave up writes its Err.
		j := &it.req.jobs[it.i]
		r.jobs[k], r.preps[k] = codec.Job{Codec: j.Codec, Src: j.Src, Dst: j.Dst}, it.req.preps[it.i]
		if it.req.dev != nil && len(it.req.dev[it.i]) > 0 {
			if r.dev == nil {
				r.dev = make([][]devRun, len(live))
			}
			r.dev[k] = it.req.dev[it.i]
		}
	}
	return true
}

// readyAlone answers a round whose readying failed with err: when the
// other sets' buffers, grown for earlier rounds, hold the memory it needs
// (ErrBudget; a round fits the bounds alone: its cost is at most its
// share), it waits for every set (held gains them), frees their buffers
// and reports that the round is to be readied again, rather than leave its
// chunks to the CPU. The wait for the other rounds is not this round's
// readying, and each of them is held to its own deadline: this round's
// watch stops for the wait and starts again after it.
func (d *Decoder) readyAlone(r *round, held *[]int, err error) bool {
	if !errors.Is(err, ErrBudget) || r.exclusive || d.opts.Streams <= 1 {
		return false
	}
	r.watch.Stop()
	for len(*held) < d.opts.Streams {
		*held = append(*held, <-d.free)
	}
	d.watch(r)
	r.exclusive = true
	d.rounds.trim()
	d.shrinkRounds(err)
	return true
}

// lockCallers takes the lock of every caller of items shared, in order of
// arrival (reqs is reused), and reports whether it holds them: false,
// holding none, when a caller gave up meanwhile.
func lockCallers(items []item, reqs []*request) ([]*request, bool) {
	for _, it := range items {
		reqs = append(reqs, it.req)
	}
	slices.SortFunc(reqs, func(a, b *request) int { return cmp.Compare(a.seq, b.seq) })
	reqs = slices.Compact(reqs)
	for _, q := range reqs {
		q.mu.RLock()
	}
	gone := false
	for _, q := range reqs {
		gone = gone || q.abandoned.Load()
	}
	if !gone {
		return reqs, true
	}
	for _, q := range reqs {
		q.mu.RUnlock()
	}
	return reqs, false
}

// completeLoop is the completer: it waits for each round in flight, copies
// its chunks out to their callers and frees its buffer set.
func (d *Decoder) completeLoop() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(d.completerDone)
	for r := range d.submitted {
		outs, errs, err := d.collect(r)
		d.settle(r, outs, errs, err)
		for _, q := range r.reqs {
			q.onDevice.Done()
		}
		d.free <- r.set
		d.behind(r.ahead)
	}
}

// settle hands each job of r its result: decoded bytes (after the checksum
// checks) or an error; with batchErr, every job fails with it, wrapped as
// ErrUnsupported so that the caller retries it on the CPU, and its caller
// returns batchErr. Callers that gave up are skipped.
func (d *Decoder) settle(r *round, outs [][]byte, errs []error, batchErr error) {
	if r.watch != nil {
		r.watch.Stop()
	}
	r.settled.Store(true)
	t0 := time.Now()
	d.parallel(len(r.items), func(k int) {
		it := r.items[k]
		q := it.req
		q.mu.RLock()
		defer q.mu.RUnlock()
		if q.abandoned.Load() {
			return
		}
		j := &q.jobs[it.i]
		switch {
		case batchErr != nil:
			j.Err = fmt.Errorf("gpu: batch not decoded: %w: %w", codec.ErrUnsupported, batchErr)
		case errs[k] != nil:
			j.Err = fmt.Errorf("gpu: %s chunk: %w", j.Codec, errs[k])
		default:
			t0 := time.Now()
			defer func() { d.costs.host(j.Codec, time.Since(t0)) }()
			var pre []byte
			if k < len(r.pre) {
				pre = r.pre[k]
			}
			if err := d.deliver(&r.preps[k], outs[k], pre, j.Dst, r.elemSize); err != nil {
				j.Err = fmt.Errorf("gpu: %s chunk: %w", j.Codec, err)
			}
		}
		d.counts.count(j.Err, len(j.Dst))
		if j.Err == nil {
			d.costs.delivered(j.Codec, len(j.Dst))
		}
		q.fin[it.i] = true
	})
	if batchErr == nil && len(r.items) > 0 {
		d.counts.rounds.Add(1)
		d.counts.addDevice(r.times)
		var last *request
		for _, it := range r.items {
			// A caller's items are together in a round: each caller once,
			// before its done is closed below, unless it gave up.
			if q := it.req; q != last && q.times != nil {
				q.mu.RLock()
				if !q.abandoned.Load() {
					q.times.Device.add(r.times)
				}
				q.mu.RUnlock()
			}
			last = it.req
		}
	}
	if batchErr == nil && r.fl != nil && len(r.items) > 0 {
		var in, out int64
		for _, j := range r.jobs {
			in += int64(len(j.Src))
			out += int64(len(j.Dst))
		}
		d.log.Debug("gpu batch", append([]any{"chunks", len(r.items), "callers", r.callers, "in", in, "out", out},
			append(r.stats, "copyout", time.Since(t0), "total", time.Since(r.fl.t0))...)...)
	}
	for _, it := range r.items {
		q := it.req
		if batchErr != nil {
			q.err.CompareAndSwap(nil, &batchErr)
		}
		if q.left.Add(-1) == 0 {
			d.finished(q)
		}
	}
}

// deliver checks a decoded chunk and copies it to dst. A nil out means
// the device wrote dst itself (pinned memory); pre is the chunk before
// unshuffling, where the host checks its streams (nil otherwise).
func (d *Decoder) deliver(p *prepared, out, pre, dst []byte, elemSize int) error {
	if out == nil {
		out = dst
	}
	if !d.opts.SkipChecksums {
		if err := p.verifyDecoded(out, pre, elemSize); err != nil {
			return err
		}
	}
	copy(dst, out) // nothing to do when out is dst
	return nil
}

// holdDevice waits until no round is in flight and keeps it so until the
// returned function is called: tests use the device's buffers and streams
// directly meanwhile.
func (d *Decoder) holdDevice() (release func()) {
	var held []int
	for range d.opts.Streams {
		held = append(held, <-d.free)
	}
	return func() {
		for _, s := range held {
			d.free <- s
		}
	}
}
