// Package fill makes a blob's bytes and keeps them in the cache: the glue
// between the layout (which blobs exist and how each is filled) and the
// blob cache (where complete blobs live). It owns the blob's cache key,
// the fill run under the blob's identity, readahead for readers walking a
// sample directory, `zarrfs warm`'s batches and workers, and the garbage a
// layout leaves behind. The mount (package fs) and the command line ask it
// for blobs; neither builds a cache key.
//
// Concurrency: every Blobs and every function here is safe for concurrent
// use; the cache runs one fill per key however many callers ask at once.
package fill

import (
	"context"
	"os"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/layout"
)

// Backing is an open, complete blob file in the cache, pinned (never
// evicted) until Close.
type Backing interface {
	File() *os.File
	Close() error
}

// Blobs gets the backing file of a layout's blob: complete, pinned until
// the Backing is closed. On a miss the blob is filled once, however many
// callers ask at the same time, and published only complete.
// Implementations must be safe for concurrent use.
type Blobs interface {
	// Open opens blob b of lay, filling it when the cache lacks it or
	// holds it with another identity, and returns the identity it opened
	// (layout.Layout.Identity: the version of every chunk it was built
	// from).
	Open(ctx context.Context, lay *layout.Layout, b layout.Blob) (Backing, string, error)
	// Path is where blob p of lay lives once complete: the target of its
	// link in direct mode. An absolute path.
	Path(lay *layout.Layout, p string) string
	// Keeps reports whether a blob of size bytes is kept once filled (not
	// larger than the whole budget, so served from an unlinked file).
	Keeps(size int64) bool
}

// Key is the cache key of blob b of lay under identity ident.
func Key(lay *layout.Layout, b layout.Blob, ident string) cache.BlobKey {
	return cache.BlobKey{Layout: lay.ID, Path: b.Path(), Identity: ident}
}

// Cache serves blobs from the persistent blob cache: files live at
// c.BlobPath(Key(lay, b, ident)), one fill per key at a time, replaced
// when their identity changes.
func Cache(c *cache.Cache) Blobs { return cacheBlobs{c} }

type cacheBlobs struct{ c *cache.Cache }

// Open revalidates a blob the cache holds (its identity asked first: on a
// lazy listing, one version per chunk once per listing) and fills one it
// never held without asking anything first: its identity is learnt from
// the responses of the fill's own reads (layout.Layout.DoLearning), so a
// first read costs the reads of its chunks.
func (cb cacheBlobs) Open(ctx context.Context, lay *layout.Layout, b layout.Blob) (Backing, string, error) {
	var h Backing
	var id string
	fill := func(ctx context.Context, f cache.Writer) error { return b.Fill(ctx, f) }
	if held(cb.c, lay, b) {
		err := lay.Do(ctx, b, func(ctx context.Context, ident string) (err error) {
			h, id, err = cb.get(ctx, lay, b, ident, fill, nil)
			return err
		})
		return h, id, err
	}
	err := lay.DoLearning(ctx, b, func(ctx context.Context, ident string, learn func() (string, error)) (err error) {
		h, id, err = cb.get(ctx, lay, b, ident, fill, learn)
		return err
	})
	return h, id, err
}

// get opens blob b of lay from the cache, filling it under identity ident,
// or under the one learn names once filled.
func (cb cacheBlobs) get(ctx context.Context, lay *layout.Layout, b layout.Blob, ident string, fill func(context.Context, cache.Writer) error, learn func() (string, error)) (Backing, string, error) {
	h, id, err := cb.c.GetBlob(ctx, Key(lay, b, ident), b.Size(), fill, learn)
	if err != nil {
		return nil, "", err
	}
	return h, id, nil
}

// held reports whether c's index holds blob b of lay in any identity, at
// its path or at a narrower name it had before its directory grew past a
// power of ten (which GetBlob links rather than fills when the identity is
// the same). Only such a blob is worth asking the identity of before it is
// filled.
func held(c *cache.Cache, lay *layout.Layout, b layout.Blob) bool {
	if c.Holds(Key(lay, b, "")) {
		return true
	}
	for _, p := range layout.NarrowerPaths(b.Path()) {
		if c.Holds(cache.BlobKey{Layout: lay.ID, Path: p}) {
			return true
		}
	}
	return false
}

func (cb cacheBlobs) Keeps(size int64) bool { return cb.c.Keeps(size) }

func (cb cacheBlobs) Path(lay *layout.Layout, p string) string {
	return cb.c.BlobPath(cache.BlobKey{Layout: lay.ID, Path: p})
}

// Has reports whether c holds blob b of lay complete in its current
// identity (what `zarrfs warm` skips). A blob the index lacks costs no
// request to rule out.
func Has(ctx context.Context, c *cache.Cache, lay *layout.Layout, b layout.Blob) (bool, error) {
	if !c.Holds(Key(lay, b, "")) {
		return false, nil
	}
	ident, err := lay.Identity(ctx, b)
	if err != nil {
		return false, err
	}
	return c.HasBlob(Key(lay, b, ident)), nil
}
