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
// after that it costs no I/O but a lazy listing's. Arrays of a store that
// cannot tell versions contribute their Inputs only. The chunks are walked
// one at a time: nothing is held per chunk.
//
// Fills agree with the identity: Do fills under a zarr.Pin of the listings
// and versions the identity was computed from, and a Read under it checks
// every chunk against them (zarr.ErrChanged otherwise), so a blob recorded
// under an identity holds the bytes of exactly those chunks. A chunk
// rewritten in place changes its version, hence the identity of every
// blob that reads it, once the array is listed again.
func (l *Layout) Identity(ctx context.Context, b Blob) (string, error) {
	id, _, err := l.identity(b, false, func(a *zarr.Array) (*zarr.Listing, error) { return l.listing(ctx, a) })
	return id, err
}

// KnownIdentity is Identity without I/O: false when an array b reads has
// not been listed yet.
func (l *Layout) KnownIdentity(b Blob) (string, bool) {
	id, _, err := l.identity(b, false, func(a *zarr.Array) (*zarr.Listing, error) {
		if lst := a.Listing(); lst != nil {
			return lst, nil
		}
		return nil, errNotListed
	})
	return id, err == nil
}

var errNotListed = errors.New("not listed")

// identity computes b's identity, and with pinned the zarr.Pin a fill
// under it reads by (8 bytes a chunk of a lazily listed array).
func (l *Layout) identity(b Blob, pinned bool, listing func(*zarr.Array) (*zarr.Listing, error)) (string, *zarr.Pin, error) {
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
		err := pin.Region(lst, a, src.Start, src.Count, func(k, v string, ok bool) {
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
	for attempt := 0; ; attempt++ {
		began := time.Now()
		ident, pin, err := l.identity(b, true, func(a *zarr.Array) (*zarr.Listing, error) { return l.listing(ctx, a) })
		if err != nil {
			return err
		}
		err = fn(zarr.WithPin(ctx, pin), ident)
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
