package gpu

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/zarrfs/zarrfs/codec"
)

// This file is the watchdog of the rounds. Damaged input that passes the
// host checks can make an nvCOMP kernel loop for good (seen with a blosc
// zstd chunk under Options.Unverified on an H200), and a device can stop
// answering; the CUDA driver then waits for ever, and so would every
// caller. So every round has a deadline from the moment the submitter takes
// it up (Options.RoundTimeout, and more for a larger round): a round whose
// device work is not done by then, or that the submitter is still readying
// (a driver call blocked behind the looping kernel), retires the device. A
// retired Decoder fails every job it holds or is given with an error
// wrapping ErrHung and codec.ErrUnsupported, so its callers decode them on
// the CPU, at once; it never touches the device again, and at Close frees
// nothing the device may still use (its contexts, buffers and pinned
// memory go with the process).
//
// What a late device may still do to a caller's memory after the caller
// is released: read its Src (copies queued before the kernel), never write
// its Dst. Decoded bytes reach a pinned Dst only in a second step
// (finishDirect), queued once the round's decoding is seen to be done,
// under the caller's lock and only while the device is not retired; and
// the round's other output goes to the Decoder's own staging, which a
// retired Decoder never reuses.

// ErrHung is wrapped by the errors of jobs a retired Decoder did not
// decode: a round did not finish within Options.RoundTimeout.
var ErrHung = errors.New("gpu: the device did not finish a round in time")

// errRoundTimeout is what the device's waits return at a round's deadline.
var errRoundTimeout = errors.New("round deadline passed")

// errRetiredWait is what the device's waits return when the Decoder was
// retired while they waited.
var errRetiredWait = errors.New("decoder retired while waiting")

// watchdogRate is the slowest decoding rate the deadline allows for a
// round's bytes on top of Options.RoundTimeout: a thousandth of an H200's.
const watchdogRate = 64 << 20

// Retired reports why the Decoder takes no more work, or nil while it
// does: a round did not finish in time (the error wraps ErrHung), or a
// device fault outlived a context reset. A retired Decoder fails every job
// with an error wrapping codec.ErrUnsupported, for the CPU.
func (d *Decoder) Retired() error {
	d.stateMu.Lock()
	defer d.stateMu.Unlock()
	return d.dead
}

// watch sets r's deadline and starts the timer that retires the device if
// the submitter is still taking r up by then.
func (d *Decoder) watch(r *round) {
	var n int64
	for _, it := range r.items {
		j := &it.req.jobs[it.i]
		n += int64(len(j.Src) + len(j.Dst))
	}
	limit := d.opts.RoundTimeout + time.Duration(n*int64(time.Second)/watchdogRate)
	r.deadline = time.Now().Add(limit)
	chunks := len(r.items)
	r.watch = time.AfterFunc(limit, func() {
		// Once started, the completer's waits hold the round to its
		// deadline.
		if !r.started.Load() && !r.settled.Load() {
			d.retire(fmt.Errorf("%w: readying a round of %d chunks (%d MiB) took more than %v", ErrHung, chunks, n>>20, limit.Round(time.Millisecond)))
		}
	})
}

// retire turns the GPU path off for good because of err, and releases
// every caller waiting for the device: their jobs not yet done fail with
// err, wrapped as ErrUnsupported, and DecodeBatch returns err.
func (d *Decoder) retire(err error) {
	d.retireOnce.Do(func() {
		d.stateMu.Lock()
		if d.dead == nil {
			d.dead = err
		}
		d.stateMu.Unlock()
		d.hung.Store(true)
		d.log.Error("gpu: decoding on the GPU is off until restart; its chunks decode on the CPU", "device", d.opts.Device, "err", err)
		d.qmu.Lock()
		live := make([]*request, 0, len(d.live))
		for q := range d.live {
			live = append(live, q)
		}
		d.qmu.Unlock()
		close(d.hungCh)
		slices.SortFunc(live, func(a, b *request) int { return cmp.Compare(a.seq, b.seq) })
		for _, q := range live {
			// Each on its own: a caller whose lock a settle or a copy-out
			// still holds for a moment delays no other.
			go d.release(q, err)
		}
	})
}

// release gives a caller back its jobs on behalf of a retired device, as
// a caller that gives up takes them: nothing of the Decoder touches its
// memory afterwards.
//
// The caller's lock is held shared only while the host reads or writes
// the caller's memory, and across no driver call that can block for good:
// packing is host copies, and the round's start, whose driver calls may
// never return behind a kernel that loops, runs after the locks are given
// back (runRound); the one driver wait under them, for the copies into a
// pinned Dst (collect), ends when the device is retired, before release
// runs. So the lock is always given back soon.
func (d *Decoder) release(q *request, err error) {
	q.mu.Lock()
	if q.abandoned.Load() || q.left.Load() == 0 {
		q.mu.Unlock()
		return
	}
	q.abandoned.Store(true)
	for _, i := range q.ok {
		if !q.fin[i] {
			q.jobs[i].Err = fmt.Errorf("gpu: batch not decoded: %w: %w", codec.ErrUnsupported, err)
			d.counts.refused.Add(1)
		}
	}
	q.err.CompareAndSwap(nil, &err)
	q.mu.Unlock()
	d.finished(q)
}

// finished wakes q's caller and forgets q.
func (d *Decoder) finished(q *request) {
	q.doneOnce.Do(func() { close(q.done) })
	d.forget(q)
}

// forget drops q from the requests the watchdog would release.
func (d *Decoder) forget(q *request) {
	d.qmu.Lock()
	delete(d.live, q)
	d.qmu.Unlock()
}

// collect waits for round r on the device and, for its jobs whose Dst
// the device writes itself, has it do so; a round past its deadline
// retires the device.
func (d *Decoder) collect(r *round) ([][]byte, []error, error) {
	outs, errs, err := d.rounds.collect(r, d.hungCh)
	if err == nil {
		err = d.Retired()
	}
	if err != nil {
		return nil, nil, d.failed(r, err, "decoding")
	}
	var which []int
	for k := range r.jobs {
		if outs[k] == nil && errs[k] == nil {
			which = append(which, k)
		}
	}
	if len(which) == 0 {
		return outs, errs, nil
	}
	// The copies into the callers' memory are queued under their locks,
	// and only for callers that have not given up and while the device is
	// not retired: a caller released by the watchdog is never written to.
	var reqs []*request
	for _, k := range which {
		reqs = append(reqs, r.items[k].req)
	}
	slices.SortFunc(reqs, func(a, b *request) int { return cmp.Compare(a.seq, b.seq) })
	reqs = slices.Compact(reqs)
	for _, q := range reqs {
		q.mu.RLock()
	}
	which = slices.DeleteFunc(which, func(k int) bool { return r.items[k].req.abandoned.Load() })
	err = d.Retired()
	if err == nil && len(which) > 0 {
		err = d.rounds.finishDirect(r, which, time.Now().Add(d.opts.RoundTimeout), d.hungCh)
	}
	for _, q := range reqs {
		q.mu.RUnlock()
	}
	if err != nil {
		return nil, nil, d.failed(r, err, "copying back")
	}
	return outs, errs, nil
}

// failed is the error of a round whose device wait failed: past its
// deadline, the device is retired.
func (d *Decoder) failed(r *round, err error, what string) error {
	if errors.Is(err, errRoundTimeout) {
		var n int64
		for _, j := range r.jobs {
			n += int64(len(j.Src) + len(j.Dst))
		}
		d.retire(fmt.Errorf("%w: %s a round of %d chunks (%d MiB) was not done by its deadline: %v", ErrHung, what, len(r.jobs), n>>20, err))
	}
	if errors.Is(err, errRoundTimeout) || errors.Is(err, errRetiredWait) {
		return d.Retired()
	}
	return err
}
