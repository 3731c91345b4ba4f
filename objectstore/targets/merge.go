package targets

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/zarrfs/zarrfs/objectstore"
)

// queue bounds the range reads in flight and merges the ones that wait:
// when a slot frees, the oldest waiting read goes, together with every
// waiting read of the same object whose range touches or overlaps the run
// it forms, up to maxMerge bytes. A read that finds a free slot goes at
// once, alone, so merging never delays a read.
type queue struct {
	mu       sync.Mutex
	free     int
	maxMerge int64
	waiting  []*rangeReq // in arrival order
}

type rangeReq struct {
	ctx    context.Context
	t      Target
	off, n int64
	done   chan rangeResult // buffered: the reader never blocks on a caller that left
	taken  bool
}

type rangeResult struct {
	b   []byte
	ver string
	err error
}

func (q *queue) init(slots int, maxMerge int64) {
	q.free = slots
	q.maxMerge = maxMerge
}

func (q *queue) read(ctx context.Context, t Target, off, n int64) ([]byte, string, error) {
	if off < 0 {
		// A suffix range names no offset to merge on: one request.
		return getRange(ctx, t, off, n)
	}
	q.mu.Lock()
	if q.free > 0 {
		q.free--
		q.mu.Unlock()
		b, ver, err := getRange(ctx, t, off, n)
		q.release()
		return b, ver, err
	}
	r := &rangeReq{ctx: ctx, t: t, off: off, n: n, done: make(chan rangeResult, 1)}
	q.waiting = append(q.waiting, r)
	q.mu.Unlock()
	select {
	case res := <-r.done:
		return res.b, res.ver, res.err
	case <-ctx.Done():
		q.mu.Lock()
		if !r.taken {
			q.remove(r)
			q.mu.Unlock()
			return nil, "", ctx.Err()
		}
		q.mu.Unlock()
		// Taken into a merged read already: its result arrives (and is
		// dropped) on the buffered channel.
		return nil, "", ctx.Err()
	}
}

func (q *queue) remove(r *rangeReq) {
	for i, w := range q.waiting {
		if w == r {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			return
		}
	}
}

// release frees a slot, or hands it to the next merged read.
func (q *queue) release() {
	q.mu.Lock()
	if len(q.waiting) == 0 {
		q.free++
		q.mu.Unlock()
		return
	}
	batch := q.take()
	q.mu.Unlock()
	go q.run(batch)
}

// take removes the oldest waiting read and the waiting reads that extend
// its run on the same object. The caller holds q.mu.
func (q *queue) take() []*rangeReq {
	first := q.waiting[0]
	var same []*rangeReq
	for _, w := range q.waiting {
		if w.t.Store == first.t.Store && w.t.Key == first.t.Key {
			same = append(same, w)
		}
	}
	sort.SliceStable(same, func(i, j int) bool { return same[i].off < same[j].off })
	// The run that holds first: grow it both ways over touching ranges.
	at := 0
	for i, w := range same {
		if w == first {
			at = i
		}
	}
	lo, hi := at, at
	start, end := first.off, first.off+first.n
	for lo > 0 && same[lo-1].off+same[lo-1].n >= start && max(end, same[lo-1].off+same[lo-1].n)-same[lo-1].off <= q.maxMerge {
		lo--
		start = same[lo].off
		end = max(end, same[lo].off+same[lo].n)
	}
	for hi+1 < len(same) && same[hi+1].off <= end && max(end, same[hi+1].off+same[hi+1].n)-start <= q.maxMerge {
		hi++
		end = max(end, same[hi].off+same[hi].n)
	}
	batch := same[lo : hi+1]
	for _, w := range batch {
		w.taken = true
		q.remove(w)
	}
	return batch
}

// run reads one merged range and hands every read its part, then frees
// the slot (or passes it on).
func (q *queue) run(batch []*rangeReq) {
	defer q.release()
	start, end := batch[0].off, batch[0].off
	for _, w := range batch {
		start = min(start, w.off)
		end = max(end, w.off+w.n)
	}
	// The callers' contexts differ; the read serves all of them, so it
	// runs under the first one's values without its cancellation. The
	// target stores bound every request's time themselves.
	ctx := context.WithoutCancel(batch[0].ctx)
	b, ver, err := getRange(ctx, batch[0].t, start, end-start)
	for _, w := range batch {
		if err != nil && len(batch) > 1 {
			// One bad range (past the end of a file that shrank) must not
			// fail its neighbours: each is read on its own.
			b, ver, err := getRange(ctx, w.t, w.off, w.n)
			w.done <- rangeResult{b, ver, err}
			continue
		}
		if err != nil {
			w.done <- rangeResult{err: err}
			continue
		}
		lo := w.off - start
		w.done <- rangeResult{b: b[lo : lo+w.n : lo+w.n], ver: ver}
	}
}

func getRange(ctx context.Context, t Target, off, n int64) ([]byte, string, error) {
	if v, ok := objectstore.AsVersioned(t.Store); ok {
		return v.GetRangeVersion(ctx, t.Key, off, n)
	}
	b, err := t.Store.GetRange(ctx, t.Key, off, n)
	if err == nil && int64(len(b)) != n {
		err = fmt.Errorf("%s: %d bytes for a %d-byte range", t.URL, len(b), n)
	}
	return b, "", err
}
