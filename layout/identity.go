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
// learnt yet, which it asks (one request or stat per chunk: package fill
// avoids the requests for a blob of a remote store not cached). Arrays of
// a store that cannot tell versions contribute their Inputs only. The
// chunks are walked one at a time: nothing is held per chunk.
//
// Fills agree with the identity: a fill reads under the zarr.Pin of the
// listings and versions the identity was computed from (Pinned), and a
// Read under it checks
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

var errNotListed = errors.New("not listed")

// ErrUnlearnt is Pinned's error (wrapped) for a blob whose identity names
// a chunk version its array's lazy listing has not learnt yet.
var ErrUnlearnt = errors.New("a chunk version not learnt yet")

// learnt is Listing.Version without I/O: ErrUnlearnt for a key a lazy
// listing has not learnt.
func learnt(lst *zarr.Listing, key string) (string, bool, error) {
	v, ok, known := lst.Known(key)
	if !known {
		return "", false, ErrUnlearnt
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

// Listings returns the listing of every array b reads whose store tells
// versions, listing first each one not listed yet (one listing per array,
// as a fill reads it).
func (l *Layout) Listings(ctx context.Context, b Blob) (map[*zarr.Array]*zarr.Listing, error) {
	listings := map[*zarr.Array]*zarr.Listing{}
	for _, src := range b.Sources() {
		a := src.Array
		if a == nil || !a.Versioned() || listings[a] != nil {
			continue
		}
		lst, err := l.listing(ctx, a)
		if err != nil {
			return nil, err
		}
		listings[a] = lst
	}
	return listings, nil
}

// Pinned returns b's identity computed from listings (Listings), and the
// zarr.Pin of the listings and versions it names, which a fill reads
// under so that its bytes are those of exactly these versions. With
// learntOnly, a version a lazy listing has not learnt is not asked: the
// error wraps ErrUnlearnt instead.
func (l *Layout) Pinned(b Blob, listings map[*zarr.Array]*zarr.Listing, learntOnly bool) (string, *zarr.Pin, error) {
	version := (*zarr.Listing).Version
	if learntOnly {
		version = learnt
	}
	return l.identity(b, true, given(b, listings), version)
}

// IdentityFrom is Pinned's identity without the pin: what a fill that
// learnt its chunks' versions is recorded under.
func (l *Layout) IdentityFrom(b Blob, listings map[*zarr.Array]*zarr.Listing) (string, error) {
	id, _, err := l.identity(b, false, given(b, listings), (*zarr.Listing).Version)
	return id, err
}

// given looks an array's listing up in listings (Listings).
func given(b Blob, listings map[*zarr.Array]*zarr.Listing) func(*zarr.Array) (*zarr.Listing, error) {
	return func(a *zarr.Array) (*zarr.Listing, error) {
		if lst := listings[a]; lst != nil {
			return lst, nil
		}
		return nil, fmt.Errorf("layout: array %q of %s not in the listings given", a.Path, b.Path())
	}
}

// Relist lists again every array b reads whose listing began before t
// (after a fill failed with zarr.ErrChanged: a chunk changed after its
// array was listed).
func (l *Layout) Relist(ctx context.Context, b Blob, t time.Time) error {
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
