package zarr

import (
	"context"
	"sync"

	"github.com/zarrfs/zarrfs/codec"
)

// aheadDecoder decodes a Read's chunks while the rest are fetched, for a
// decoder that asks it (codec.AheadDecoder): each batch is every chunk
// fetched and not yet taken, taken by one of aheadBatches goroutines as
// soon as one is free, so that batches grow as decoding falls behind. A
// Read whose decoding runs beside its fetching (a GPU's, whose chunks the
// host reads from the page cache into pinned memory) then ends about when
// its last batch is decoded, not when all its chunks are fetched and then
// decoded. Memory it costs nothing: every chunk's buffers are held until
// the Read ends either way (ReadCost).
type aheadDecoder struct {
	st   *readState
	ctx  context.Context
	mu   sync.Mutex
	cond *sync.Cond
	// pending are the leaves added and not yet taken; fetched says the
	// fetching has ended, and decodeRest whether what is pending then is
	// to be decoded (no fetch failed).
	pending             []*leaf
	fetched, decodeRest bool
	err                 error // the first batch that failed as a whole
	wg                  sync.WaitGroup
}

// aheadBatches is the most batches of a Read decoded at once: one while
// the next gathers the chunks fetched meanwhile.
const aheadBatches = 2

// decodeAhead starts decoding the Read's leaves as they are added, when
// its decoder asks it and it has two outer chunks or more; it returns
// nil, and the Read decodes once everything is fetched, otherwise.
func (st *readState) decodeAhead(ctx context.Context, outers int) *aheadDecoder {
	if ad, ok := st.dec.(codec.AheadDecoder); !ok || !ad.DecodesAhead() || outers < 2 {
		return nil
	}
	a := &aheadDecoder{st: st, ctx: ctx}
	a.cond = sync.NewCond(&a.mu)
	st.ahead = a
	for range aheadBatches {
		a.wg.Go(a.run)
	}
	return a
}

// add queues leaf l, fetched, for a batch.
func (a *aheadDecoder) add(l *leaf) {
	a.mu.Lock()
	a.pending = append(a.pending, l)
	a.cond.Signal()
	a.mu.Unlock()
}

// finish says the fetching has ended, decodes what is pending when
// decodeRest (else drops it: the Read fails), and returns once no batch
// runs, with the error of the first batch that failed as a whole.
func (a *aheadDecoder) finish(decodeRest bool) error {
	a.mu.Lock()
	a.fetched, a.decodeRest = true, decodeRest
	a.cond.Broadcast()
	a.mu.Unlock()
	a.wg.Wait()
	return a.err
}

func (a *aheadDecoder) run() {
	for {
		a.mu.Lock()
		for !a.fetched && len(a.pending) == 0 {
			a.cond.Wait()
		}
		batch := a.pending
		a.pending = nil
		skip := a.err != nil || (a.fetched && !a.decodeRest)
		a.mu.Unlock()
		if len(batch) == 0 {
			return // fetched, and nothing left
		}
		if skip {
			continue
		}
		if err := a.st.decode(a.ctx, batch); err != nil {
			a.mu.Lock()
			if a.err == nil {
				a.err = err
			}
			a.mu.Unlock()
		}
	}
}
