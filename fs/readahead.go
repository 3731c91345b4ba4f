package fs

import (
	"context"
	"io"
	"log/slog"
	"path"
	"sync"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/fs/layout"
)

// WithReadahead returns Blobs that, when sample K of a sample directory is
// opened right after sample K-1 of it (a reader walking the samples in
// order), fill samples K+1..K+n in the background so they are ready. A
// shuffled reader gets no readahead: filling neighbours it will not read
// next would only multiply the work.
// At most n background fills run at once; a sample already being filled
// ahead is not scheduled twice, and a fill ahead that fails is only logged
// at debug level (the reader's own open reports it).
func WithReadahead(inner Blobs, lay *layout.Layout, n int, log *slog.Logger) Blobs {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &readahead{inner: inner, lay: lay, n: n, log: log, sem: make(chan struct{}, n)}
}

type readahead struct {
	inner Blobs
	lay   *layout.Layout
	n     int
	log   *slog.Logger
	sem   chan struct{}
	busy  sync.Map // blob path -> struct{}: filling ahead now
	last  sync.Map // directory path -> int: index of the last sample opened
}

func (r *readahead) Open(ctx context.Context, layoutID, p string, size int64, fill func(context.Context, cache.Writer) error) (Backing, error) {
	b, err := r.inner.Open(ctx, layoutID, p, size, fill)
	if err == nil {
		r.schedule(layoutID, p)
	}
	return b, err
}

func (r *readahead) Path(layoutID, p string) string { return r.inner.Path(layoutID, p) }

func (r *readahead) schedule(layoutID, p string) {
	dir, name := path.Split(p)
	de, ok := r.lay.Lookup(dir)
	if !ok || de.Kind != layout.KindDir || !de.Dir.IsSampleDir() {
		return
	}
	d := de.Dir
	k, ok := d.Index(name)
	if !ok {
		return
	}
	prev, seen := r.last.Swap(dir, k)
	if !seen || prev.(int) != k-1 {
		return
	}
	for j := k + 1; j <= k+r.n && j < d.Len(); j++ {
		blob := d.Entry(j).Blob
		if _, dup := r.busy.LoadOrStore(blob.Path(), struct{}{}); dup {
			continue
		}
		select {
		case r.sem <- struct{}{}:
		default: // the readahead budget is spent; the reader will fill it
			r.busy.Delete(blob.Path())
			return
		}
		go func() {
			defer func() { <-r.sem; r.busy.Delete(blob.Path()) }()
			b, err := r.inner.Open(context.Background(), layoutID, blob.Path(), blob.Size(),
				func(ctx context.Context, f cache.Writer) error { return blob.Fill(ctx, f) })
			if err != nil {
				r.log.Debug("readahead fill failed", "file", blob.Path(), "err", err)
				return
			}
			b.Close()
		}()
	}
}
