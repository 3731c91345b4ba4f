// Package fill makes a blob's bytes and keeps them in the cache: the glue
// between the layout (which blobs exist and what each is made from) and
// the blob cache (where complete blobs live). It owns the fills (an
// array's region read in pieces, a view's channels stacked and cast, runs
// of a view's samples read together), the identity a blob is filled
// under and the pin its reads are checked against (Plan), the blob's
// cache key, readahead for readers walking a sample directory, `zarrfs
// warm`'s selection, batches and workers, and the garbage a layout leaves
// behind. The mount (package fs) and the command line ask it for blobs;
// neither builds a cache key.
//
// Concurrency: every Blobs and every function here is safe for concurrent
// use; the cache runs one fill per key however many callers ask at once.
package fill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// Backing is an open, complete blob file in the cache, pinned (never
// evicted) until Close.
type Backing interface {
	File() *os.File
	Close() error
}

// Changer is an optional upgrade of a Backing: Changed reports whether
// the blob's file was written since it was opened (cache.Handle: one
// fstat), so that a holder of it does not serve bytes written in place.
type Changer interface {
	Changed() bool
}

var _ Changer = (*cache.Handle)(nil)

// Refilled is an optional upgrade of a Backing: Filled reports whether
// opening it filled the blob (cache.Handle.Filled) rather than finding it
// in the cache, as for a blob held under an identity the source no longer
// has.
type Refilled interface {
	Filled() bool
}

var _ Refilled = (*cache.Handle)(nil)

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

var _ Blobs = (*Filler)(nil)

// Key is the cache key of blob b of lay under identity ident.
func Key(lay *layout.Layout, b layout.Blob, ident string) cache.BlobKey {
	return cache.BlobKey{Layout: lay.ID, Path: b.Path(), Identity: ident}
}

// Plan is how one blob is filled: under its identity Ident, reading the
// source under Pin (the listings and versions Ident names), or, where
// naming the identity first would cost requests, under no pin, with Learn
// naming the identity from the versions the fill's own reads carried.
type Plan struct {
	Ident string    // "" when Learn names it
	Pin   *zarr.Pin // nil when Learn names the identity
	// Learn, when set, names the identity once the fill has run (each
	// read checks and records its chunk's version in its array's
	// listing), or fails with zarr.ErrChanged when an array the blob
	// reads was listed again meanwhile (its reads may have followed
	// either listing).
	Learn func() (string, error)
}

// plan computes how blob b of lay is filled. With learning false (a blob
// the cache holds, whose identity is compared before anything is filled),
// the identity is always taken first. With learning true (a blob the cache
// never held), it is taken first only where that costs no request:
// listed arrays, versions learnt already, or an array with a Bounded
// listing (a local store), which may forget what a fill's reads taught it
// (asking it again after the fill could name a chunk rewritten meanwhile
// under its new version with the old bytes); its stats cost microseconds.
// Otherwise (GCS arrays of many chunks, HTTP: one request per chunk) the
// Plan learns: a first read then costs the reads of its chunks and
// nothing else, and the blob is recorded under exactly the versions its
// bytes came from. An array not listed yet is listed first where the
// store lists (S3: one listing per array).
func plan(ctx context.Context, lay *layout.Layout, b layout.Blob, learning bool) (Plan, error) {
	listings, err := lay.Listings(ctx, b)
	if err != nil {
		return Plan{}, err
	}
	for _, lst := range listings {
		learning = learning && !lst.Bounded()
	}
	ident, pin, err := lay.Pinned(b, listings, learning)
	switch {
	case err == nil:
		return Plan{Ident: ident, Pin: pin}, nil
	case !errors.Is(err, layout.ErrUnlearnt):
		return Plan{}, err
	}
	return Plan{Learn: func() (string, error) {
		for a, lst := range listings {
			// Listings are replaced, never reused: the same one now as
			// before the fill was the one throughout it.
			if a.Listing() != lst {
				return "", fmt.Errorf("%w: array %q listed again while %s filled", zarr.ErrChanged, a.Path, b.Path())
			}
		}
		// Every chunk the fill read is learnt; one it did not read (none,
		// but for a store's surprise) is asked.
		return lay.IdentityFrom(b, listings)
	}}, nil
}

// Open revalidates a blob the cache holds (its identity asked first: on a
// lazy listing, one version per chunk once per listing) and fills one it
// never held without asking anything first where its Plan learns. When
// the fill fails with zarr.ErrChanged (a chunk b reads changed after its
// array was listed, or after the identity was taken), b's arrays are
// listed again and the blob is planned and filled once more: the fill
// then reads the new chunks and the blob is recorded under the identity
// they give.
func (f *Filler) Open(ctx context.Context, lay *layout.Layout, b layout.Blob) (Backing, string, error) {
	if f.o.Cache == nil {
		return nil, "", errors.New("fill: Open of a Filler without a cache")
	}
	learning := !held(f.o.Cache, lay, b)
	for attempt := 0; ; attempt++ {
		began := time.Now()
		h, id, err := f.open(ctx, lay, b, learning)
		if err == nil {
			return h, id, nil
		}
		if attempt > 0 || !errors.Is(err, zarr.ErrChanged) {
			return nil, "", err
		}
		if rerr := lay.Relist(ctx, b, began); rerr != nil {
			return nil, "", errors.Join(err, rerr)
		}
	}
}

// open plans blob b of lay and gets it from the cache under the plan.
func (f *Filler) open(ctx context.Context, lay *layout.Layout, b layout.Blob, learning bool) (*cache.Handle, string, error) {
	p, err := plan(ctx, lay, b, learning)
	if err != nil {
		return nil, "", err
	}
	write := func(ctx context.Context, w cache.Writer) error {
		if f.o.Observe == nil {
			return f.Fill(ctx, lay, b, p.Pin, w)
		}
		t0 := time.Now()
		err := f.Fill(ctx, lay, b, p.Pin, w)
		f.o.Observe(Group(b.Path()), time.Since(t0), err)
		return err
	}
	return f.o.Cache.GetBlob(ctx, Key(lay, b, p.Ident), b.Size(), write, p.Learn)
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

// Holds reports whether the cache holds blob b of lay, in some identity,
// without a request: Open then reads it rather than fill it, unless its
// identity changed.
func (f *Filler) Holds(lay *layout.Layout, b layout.Blob) bool {
	return f.o.Cache != nil && held(f.o.Cache, lay, b)
}

// Keeps reports whether a blob of size bytes is kept once filled.
func (f *Filler) Keeps(size int64) bool { return f.o.Cache.Keeps(size) }

// Path is where blob p of lay lives once complete.
func (f *Filler) Path(lay *layout.Layout, p string) string {
	return f.o.Cache.BlobPath(cache.BlobKey{Layout: lay.ID, Path: p})
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
