package fill

import (
	"context"
	"io"
	"log/slog"
	"path"
	"sync"

	"github.com/zarrfs/zarrfs/layout"
)

// WithReadahead returns Blobs that keep the next n samples of a sample
// directory filling in the background while a reader walks it in order, so
// the first epoch runs at the speed of the fills rather than one fill at a
// time.
//
// "In order" tolerates the reordering of parallel readers: DALI's reader
// threads or a DataLoader's workers open samples K, K+2, K+1, K+3 ...; an
// open at most 2n samples after the previous one, or at most n before it,
// keeps the walk going, and the fills ahead run from the walk's frontier
// (the first sample not yet scheduled) to the newest open plus n. A jump
// further than that (a shuffled reader) ends the walk: filling neighbours
// it will not read next would only multiply the work. The walk starts at
// the second open in order; opening the same sample again (a reader that
// reads a sample in pieces, each its own open) leaves it as it is.
//
// At most n fills run in the background at once; a sample already being
// filled ahead is not scheduled twice, and a fill ahead that fails is only
// logged at debug level (the reader's own open reports it).
//
// lay returns the layout to fill ahead in: the one a mount serves at each
// moment. The fills ahead run under the context of the open that scheduled
// them, so it should live as long as they may (a mount's, not a request's).
func WithReadahead(inner Blobs, lay func() *layout.Layout, n int, log *slog.Logger) Blobs {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &readahead{inner: inner, lay: lay, n: n, log: log,
		sem: make(chan struct{}, n), walks: map[string]*walk{}}
}

type readahead struct {
	inner Blobs
	lay   func() *layout.Layout // the current one
	n     int
	log   *slog.Logger
	sem   chan struct{}
	busy  sync.Map // blob path -> struct{}: filling ahead now

	mu    sync.Mutex
	walks map[string]*walk // by directory path
}

// walk is a reader's progress through one sample directory, in listing
// positions (a rank's directory lists every W-th sample or a block).
type walk struct {
	last     int  // position of the last sample opened
	inOrder  bool // the last two opens were close together
	frontier int  // first position not yet scheduled ahead
}

func (r *readahead) Open(ctx context.Context, lay *layout.Layout, b layout.Blob) (Backing, string, error) {
	h, id, err := r.inner.Open(ctx, lay, b)
	if err == nil {
		r.schedule(ctx, b.Path())
	}
	return h, id, err
}

func (r *readahead) Path(lay *layout.Layout, p string) string { return r.inner.Path(lay, p) }
func (r *readahead) Keeps(size int64) bool                    { return r.inner.Keeps(size) }

// advance records an open of position k and returns the positions to fill
// ahead, [from, to).
func (r *readahead) advance(dir string, k, n int) (from, to int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.walks[dir]
	if w == nil {
		r.walks[dir] = &walk{last: k, frontier: k + 1}
		return 0, 0
	}
	d := k - w.last
	if d == 0 {
		// The same sample again: a reader reading it in pieces, each its
		// own open (zarrfs.torch.Loader's threads). The walk stands; what
		// it scheduled is in flight or done.
		return 0, 0
	}
	w.last = k
	if d > 2*r.n || -d > r.n {
		w.inOrder, w.frontier = false, k+1
		return 0, 0
	}
	w.inOrder = true
	from = max(w.frontier, k+1)
	to = min(k+1+r.n, n)
	if from < to {
		w.frontier = to
	}
	return from, to
}

func (r *readahead) schedule(ctx context.Context, p string) {
	dir, name := path.Split(p)
	lay := r.lay()
	de, ok := lay.Lookup(dir)
	if !ok || de.Kind != layout.KindDir || !de.Dir.IsSampleDir() {
		return
	}
	d := de.Dir
	k, ok := d.Index(name)
	if !ok {
		return
	}
	from, to := r.advance(dir, k, d.Len())
	for j := from; j < to; j++ {
		blob := d.Entry(j).Blob
		if _, dup := r.busy.LoadOrStore(blob.Path(), struct{}{}); dup {
			continue
		}
		select {
		case r.sem <- struct{}{}:
		default:
			// The readahead budget is spent: the rest stays behind the
			// frontier for the next open to schedule.
			r.busy.Delete(blob.Path())
			r.mu.Lock()
			if w := r.walks[dir]; w != nil && w.frontier > j {
				w.frontier = j
			}
			r.mu.Unlock()
			return
		}
		go func() {
			defer func() { <-r.sem; r.busy.Delete(blob.Path()) }()
			b, _, err := r.inner.Open(ctx, lay, blob)
			if err != nil {
				r.log.Debug("readahead fill failed", "file", blob.Path(), "err", err)
				return
			}
			b.Close()
		}()
	}
}
