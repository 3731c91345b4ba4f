package layout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/zarrfs/zarrfs/zarr"
)

// Identity returns what blob b's bytes are built from, for the cache to
// record next to the blob (cache.BlobKey.Identity) and compare on every
// open: a hash of b.Inputs() and of the store key and version of every
// chunk b reads, as its arrays' listings name them (zarr.Listing; "absent"
// for a chunk the listing lacks, read as the fill value). The first call
// for a blob of an array not listed yet lists it (zarr.Hierarchy.List);
// after that it costs no I/O, but for the versions a lazy listing has not
// learnt yet, which it asks (one request or stat per chunk: DoLearning
// avoids the requests for a blob of a remote store not cached). Arrays of
// a store that cannot tell versions contribute their Inputs only. The
// chunks are walked one at a time: nothing is held per chunk.
//
// Fills agree with the identity: Do fills under a zarr.Pin of the listings
// and versions the identity was computed from, and a Read under it checks
// every chunk against them (zarr.ErrChanged otherwise), so a blob recorded
// under an identity holds the bytes of exactly those chunks. A chunk
// rewritten in place changes its version, hence the identity of every
// blob that reads it, once the array is listed again.
func (l *Layout) Identity(ctx context.Context, b Blob) (string, error) {
	id, _, err := l.identity(b, false, func(a *zarr.Array) (*zarr.Listing, error) { return l.listing(ctx, a) }, (*zarr.Listing).Version)
	return id, err
}

// KnownIdentity is Identity without a listing request: false when an
// array b reads has not been listed yet. A lazy listing still asks the
// versions it has not learnt (one stat or request per chunk).
func (l *Layout) KnownIdentity(b Blob) (string, bool) {
	id, _, err := l.identity(b, false, func(a *zarr.Array) (*zarr.Listing, error) {
		if lst := a.Listing(); lst != nil {
			return lst, nil
		}
		return nil, errNotListed
	}, (*zarr.Listing).Version)
	return id, err == nil
}

var (
	errNotListed = errors.New("not listed")
	errUnlearnt  = errors.New("a chunk version not learnt yet")
)

// learnt is Listing.Version without I/O: errUnlearnt for a key a lazy
// listing has not learnt.
func learnt(lst *zarr.Listing, key string) (string, bool, error) {
	v, ok, known := lst.Known(key)
	if !known {
		return "", false, errUnlearnt
	}
	return v, ok, nil
}

// identity computes b's identity from the versions version gives, and
// with pinned the zarr.Pin a fill under it reads by (8 bytes a chunk of a
// lazily listed array).
func (l *Layout) identity(b Blob, pinned bool, listing func(*zarr.Array) (*zarr.Listing, error), version func(*zarr.Listing, string) (string, bool, error)) (string, *zarr.Pin, error) {
	h := sha256.New()
	io.WriteString(h, layoutVersion)
	h.Write([]byte{0})
	io.WriteString(h, b.Inputs())
	var pin *zarr.Pin
	if pinned {
		pin = &zarr.Pin{}
	}
	var chunks int64
	listings := map[*zarr.Array]*zarr.Listing{} // one per array, as the fill reads
	for _, src := range b.Sources() {
		a := src.Array
		if a == nil || !a.Versioned() {
			continue
		}
		lst := listings[a]
		if lst == nil {
			var err error
			if lst, err = listing(a); err != nil {
				return "", nil, err
			}
			listings[a] = lst
		}
		if chunks += a.RegionChunkCount(src.Start, src.Count); chunks > MaxIdentityChunks || chunks < 0 {
			// Too many to name one by one (hostile metadata, or chunks
			// far smaller than a sample): the identity names the listing
			// instead, so the blob is filled again under every new one.
			fmt.Fprintf(h, "\x00%s\x00listing %p %d", a.Path, lst, lst.At.UnixNano())
			pin.Listed(a, lst)
			continue
		}
		// Sorted keys, as identities have always named them: a cache
		// filled by an earlier release keeps its blobs.
		err := pin.RegionBy(lst, a, src.Start, src.Count, version, func(k, v string, ok bool) {
			if !ok {
				v = "absent"
			}
			h.Write([]byte{0})
			io.WriteString(h, k)
			h.Write([]byte{0})
			io.WriteString(h, v)
		})
		if err != nil {
			return "", nil, err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:32], pin, nil
}

// MaxIdentityChunks bounds the chunks one blob's identity names one by one.
// A blob that reads more (a sample of a billion tiny chunks: hostile
// metadata, whose fill fails anyway) is identified by the listings of its
// arrays instead: it is filled again after every new listing, never served
// from before one.
const MaxIdentityChunks = 1 << 20

// listing returns a's current listing, listing it first if it has none.
func (l *Layout) listing(ctx context.Context, a *zarr.Array) (*zarr.Listing, error) {
	if lst := a.Listing(); lst != nil {
		return lst, nil
	}
	lst, err := l.h.List(ctx, a, time.Time{})
	if err == nil && lst == nil {
		err = errors.New("layout: a versioned store gave no listing")
	}
	return lst, err
}

// Do calls fn with b's identity, and a context carrying the zarr.Pin of
// the versions it was computed from for b's fill to read under (Fill with
// that context reads exactly those versions, or fails with
// zarr.ErrChanged). When fn fails with zarr.ErrChanged (a chunk b reads
// changed after its array was listed, or after the identity was taken),
// Do lists b's arrays again and calls fn once more with the new identity:
// the fill then reads the new chunks and the blob is recorded under the
// identity they give.
func (l *Layout) Do(ctx context.Context, b Blob, fn func(ctx context.Context, identity string) error) error {
	return l.retryChanged(ctx, b, func() error {
		ident, pin, err := l.identity(b, true, func(a *zarr.Array) (*zarr.Listing, error) { return l.listing(ctx, a) }, (*zarr.Listing).Version)
		if err != nil {
			return err
		}
		return fn(zarr.WithPin(ctx, pin), ident)
	})
}

// DoLearning is Do for a blob the cache does not hold: where naming b's
// identity first would ask the store for versions that its arrays' lazy
// listings have not learnt (GCS arrays of many chunks, HTTP: one request
// per chunk), fn gets ident "" and learn, and must fill b and then call
// learn, which names the identity from the versions the fill's own
// responses carried (each read checks and records its version in the
// listing, see zarr.Listing). A first read then costs the reads of its
// chunks and nothing else, and the blob is recorded under exactly the
// versions its bytes came from. learn fails with zarr.ErrChanged when an
// array b reads was listed again during the fill (its reads may have
// followed either listing).
//
// Where the identity costs no request (listed arrays, versions learnt
// already), fn gets it, with a context pinning its versions, and learn is
// nil, as from Do. So it does where any array b reads has a Bounded
// listing (a local store): such a listing may forget what a fill's reads
// taught it, and asking it again after the fill could name a chunk
// rewritten meanwhile under its new version with the old bytes; its stats
// cost microseconds, so the identity is taken first. An array not listed
// yet is listed first where the store lists (S3: one listing per array).
// ErrChanged runs fn once more after listing again, as Do does.
func (l *Layout) DoLearning(ctx context.Context, b Blob, fn func(ctx context.Context, ident string, learn func() (string, error)) error) error {
	return l.retryChanged(ctx, b, func() error {
		listings := map[*zarr.Array]*zarr.Listing{}
		bounded := false
		for _, src := range b.Sources() {
			a := src.Array
			if a == nil || !a.Versioned() || listings[a] != nil {
				continue
			}
			lst, err := l.listing(ctx, a)
			if err != nil {
				return err
			}
			listings[a] = lst
			bounded = bounded || lst.Bounded()
		}
		of := func(a *zarr.Array) (*zarr.Listing, error) { return listings[a], nil }
		version := learnt
		if bounded {
			version = (*zarr.Listing).Version
		}
		ident, pin, err := l.identity(b, true, of, version)
		switch {
		case err == nil:
			return fn(zarr.WithPin(ctx, pin), ident, nil)
		case !errors.Is(err, errUnlearnt):
			return err
		}
		return fn(ctx, "", func() (string, error) {
			for a, lst := range listings {
				// Listings are replaced, never reused: the same one now
				// as before the fill was the one throughout it.
				if a.Listing() != lst {
					return "", fmt.Errorf("%w: array %q listed again while %s filled", zarr.ErrChanged, a.Path, b.Path())
				}
			}
			// Every chunk the fill read is learnt; one it did not read
			// (none, but for a store's surprise) is asked.
			id, _, err := l.identity(b, false, of, (*zarr.Listing).Version)
			return id, err
		})
	})
}

// retryChanged runs fn, and once more after listing b's arrays again when
// it fails with zarr.ErrChanged.
func (l *Layout) retryChanged(ctx context.Context, b Blob, fn func() error) error {
	for attempt := 0; ; attempt++ {
		began := time.Now()
		err := fn()
		if attempt > 0 || !errors.Is(err, zarr.ErrChanged) {
			return err
		}
		if rerr := l.relist(ctx, b, began); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
}

// relist lists again every array b reads whose listing began before t.
func (l *Layout) relist(ctx context.Context, b Blob, t time.Time) error {
	seen := map[*zarr.Array]bool{}
	for _, src := range b.Sources() {
		a := src.Array
		if a == nil || seen[a] || !a.Versioned() {
			continue
		}
		seen[a] = true
		if _, err := l.h.List(ctx, a, t); err != nil {
			return err
		}
	}
	return nil
}
