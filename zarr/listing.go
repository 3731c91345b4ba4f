package zarr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/internal/parallel"
	"github.com/zarrfs/zarrfs/objectstore"
)

// ErrChanged is returned (wrapped in a ChunkError) when an object a Read
// fetched is not the version the array's listing recorded: the store
// changed after it was listed. List the array again and retry.
var ErrChanged = errors.New("changed since the store was listed")

// Listing records the version of every object below one array as one
// listing of a versioned store found them (objectstore.Versioned). Once an
// array has a listing, Reads of it check every object they fetch against it
// (a mismatch is ErrChanged), read a chunk the listing lacks as missing
// without asking the store, and serve compressed bytes from the source
// cache by version without a request. So whatever a Read returns was built
// from exactly the objects the listing names, and the versions of the
// chunks a region needs, read from the listing, identify its bytes.
//
// A listing made by listing is immutable.
//
// A store for which one object's version costs less than a listing
// (objectstore.VersionStater: a local filesystem) is listed lazily: each
// key's version is learnt the first time it is needed, from the response
// of the Read that fetches it, or asked (Version) when it is needed before
// any read, so the listing is no slower than the reads it serves and walks
// no directory. The first answer kept for a key stands: a later read that
// finds another version fails with ErrChanged.
//
// A lazy listing of a local store (objectstore.IsLocal: a stat costs
// microseconds) is Bounded: it keeps the answers for the first keys only,
// up to Options.LazyVersions for all the bounded listings of a Hierarchy,
// and past them every Version asks again, so that its memory does not grow
// with the chunks read under it (a sample of a million tiny chunks). What
// keeps a fill to the versions its blob's identity named is then the Pin
// it reads under, not this memory, and versions are never learnt from a
// fill's reads. A lazy listing of a remote store (GCS arrays of many
// chunks, HTTP), where asking again costs a request, keeps every answer,
// about 100 bytes a chunk read under it.
type Listing struct {
	// At is when the listing started.
	At       time.Time
	versions map[string]string

	// A lazy listing: stat asks the store, memo keeps the answers (a
	// Bounded one while the count of those the hierarchy's bounded
	// listings keep, kept, is under keep).
	stat func(key string) (string, error)
	kept *atomic.Int64
	keep int64
	mu   sync.Mutex
	memo map[string]stated
	// absentAt is when each absence memo keeps was learnt (absentSince).
	absentAt map[string]time.Time
	retired  bool // replaced as the array's listing: keeps no more
	// askFirst says a lazy listing asks the version of a key before it
	// is read (StoreHolder): the source cache held bytes of the store
	// when the listing was made.
	askFirst bool
}

type stated struct {
	version string
	ok      bool
}

// Version returns the version of the object at key, and whether the
// listing holds it (false: it did not exist when listed). Only a lazy
// listing fails, when the store cannot say.
func (l *Listing) Version(key string) (string, bool, error) {
	if l.stat == nil {
		v, ok := l.versions[key]
		return v, ok, nil
	}
	l.mu.Lock()
	s, ok := l.memo[key]
	l.mu.Unlock()
	if ok {
		return s.version, s.ok, nil
	}
	v, err := l.stat(key)
	switch {
	case objectstore.IsNotFound(err):
		v, ok = l.learn(key, "", false)
	case err != nil:
		return "", false, err
	default:
		v, ok = l.learn(key, v, true)
	}
	return v, ok, nil
}

// Known is Version without I/O: known is false when a lazy listing has
// not learnt key yet (neither asked it nor read it), or, Bounded, asked it
// past the answers it keeps. A listing made by listing knows every key.
func (l *Listing) Known(key string) (version string, ok, known bool) {
	if l.stat == nil {
		v, ok := l.versions[key]
		return v, ok, true
	}
	l.mu.Lock()
	s, known := l.memo[key]
	l.mu.Unlock()
	return s.version, s.ok, known
}

// Bounded reports whether l is a lazy listing that keeps only some of its
// answers (a local store's): a version it was asked may be asked again
// and differ, so nothing may be learnt from it after the fact.
func (l *Listing) Bounded() bool { return l.kept != nil }

// AsksFirst reports whether a Read asks l the version of a key it has not
// learnt before reading the key: a Bounded listing (whose answers a read
// may not teach it), or a remote lazy listing made while the source cache
// held bytes of its store (StoreHolder).
func (l *Listing) AsksFirst() bool { return l.Bounded() || l.askFirst }

// learn records in a lazy listing what the store said of key (ok: it
// exists, in version v), from a stat or from the response of a read, and
// returns the answer that stands: the first one kept. A Bounded listing
// keeps it only while its hierarchy's bounded listings keep fewer than
// their bound, and a retired one keeps none.
func (l *Listing) learn(key, v string, ok bool) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, had := l.memo[key]; had {
		return prev.version, prev.ok
	}
	switch {
	case l.kept == nil:
		l.memo[key] = stated{v, ok}
	case l.retired:
		return v, ok
	case l.kept.Add(1) <= l.keep:
		l.memo[key] = stated{v, ok}
	default:
		l.kept.Add(-1)
		return v, ok
	}
	if !ok {
		if l.absentAt == nil {
			l.absentAt = map[string]time.Time{}
		}
		l.absentAt[key] = time.Now()
	}
	return v, ok
}

// absentSince is when l learnt that key is absent, observed at or before
// it: when the listing began, for one made by listing; when the store
// said so, for a lazy one (zero: it keeps no such answer). A missing
// chunk's fill value needs the metadata read after that moment
// (checkAbsent), so a lazy listing's absence, learnt once, is vouched for
// by one read of the metadata for every Read that finds it, as a listed
// one is.
func (l *Listing) absentSince(key string) time.Time {
	if l.stat == nil {
		return l.At
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.absentAt[key] // zero when not kept
}

// DefaultLazyVersions is how many versions the Bounded listings of a
// Hierarchy keep in all (about 100 bytes each, 6.5 MB) unless
// Options.LazyVersions says otherwise: every chunk of the samples a mount
// reads between two listings of arrays of ordinary chunks.
const DefaultLazyVersions = 1 << 16

// retire makes a Bounded listing keep no more versions and gives back the
// count of those it kept: it is dropped once no Read holds it.
func (l *Listing) retire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retired = true
	l.kept.Add(-int64(len(l.memo)))
}

// Len returns the number of objects listed (kept, for a lazy listing).
func (l *Listing) Len() int {
	if l.stat == nil {
		return len(l.versions)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.memo)
}

// arrayListing is an array's current listing and the lock that keeps two
// listings of one array from running at once.
type arrayListing struct {
	mu  sync.Mutex
	cur atomic.Pointer[Listing]
}

// Listing returns the array's current listing, nil when it has none (never
// listed, or a store that cannot tell versions).
func (a *Array) Listing() *Listing { return a.listing.cur.Load() }

func (a *Array) currentListing() *Listing {
	if a == nil {
		return nil
	}
	return a.Listing()
}

// Versioned reports whether the array's store can tell versions, so that
// List gives it a listing.
func (a *Array) Versioned() bool {
	if a.h == nil || a.h.Store == nil {
		return false
	}
	_, ok := objectstore.AsVersioned(a.h.Store)
	return ok
}

// List makes sure the array has a listing no older than since: when its
// current one is newer than since (or since is zero and it has one), that
// one is returned; otherwise the objects below the array are listed now
// (one listing request per thousand objects on S3) and the result becomes
// the current listing. Concurrent calls share one listing. A store that
// cannot tell versions gives nil, nil.
func (h *Hierarchy) List(ctx context.Context, a *Array, since time.Time) (*Listing, error) {
	if a == nil || a.h != h {
		return nil, errors.New("zarr: List of an array of another hierarchy")
	}
	v, ok := objectstore.AsVersioned(h.Store)
	if !ok {
		return nil, nil
	}
	a.listing.mu.Lock()
	defer a.listing.mu.Unlock()
	if cur := a.listing.cur.Load(); cur != nil && (since.IsZero() || cur.At.After(since)) {
		return cur, nil
	}
	l := &Listing{At: time.Now()}
	if st, ok := objectstore.AsVersionStater(h.Store); ok && listLazily(h.Store, a) {
		// Not the caller's context: the listing outlives this call.
		l.stat = func(k string) (string, error) { return st.StatVersion(context.Background(), k) }
		l.memo = map[string]stated{}
		if objectstore.IsLocal(h.Store) {
			// Asking again costs a stat: keep a bounded memo.
			l.kept, l.keep = &h.lazyKept, int64(h.opts.LazyVersions)
		} else if sh, ok := h.opts.SourceCache.(StoreHolder); ok {
			h.heldFirstOnce.Do(func() { h.heldFirst = sh.HoldsStore() })
			if a.listing.cur.Load() == nil {
				l.askFirst = h.heldFirst // the array's first listing
			} else {
				l.askFirst = sh.HoldsStore()
			}
			if l.askFirst {
				h.opts.Logger.Debug("the source cache holds chunks of this store: versions are asked before chunks are read", "array", a.Path)
			}
		}
	} else {
		l.versions = map[string]string{}
		if err := v.ListVersions(ctx, a.Path, func(k, ver string) { l.versions[k] = ver }); err != nil {
			return nil, fmt.Errorf("array %q: listing chunks: %w", a.Path, err)
		}
	}
	if old := a.listing.cur.Swap(l); old != nil && old.Bounded() {
		old.retire()
	}
	h.stats.Listings.Add(1)
	return l, nil
}

// ListAll lists every array of arrays that has no listing yet (List with
// a zero since), at most par at a time, and returns the first error.
func (h *Hierarchy) ListAll(ctx context.Context, arrays []*Array, par int) error {
	errs := make([]error, len(arrays))
	parallel.For(len(arrays), par, func(i int) {
		_, errs[i] = h.List(ctx, arrays[i], time.Time{})
	})
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// RegionChunks returns the store keys of the chunks (for a sharded array,
// the shards) that hold any of the region start/count, sorted.
func (a *Array) RegionChunks(start, count []int64) []string {
	var keys []string
	a.EachRegionChunk(start, count, func(k string) { keys = append(keys, k) })
	sort.Strings(keys)
	return keys
}

// RegionChunkCount returns how many chunks (or shards) hold any of the
// region, without listing them (saturating at math.MaxInt64).
func (a *Array) RegionChunkCount(start, count []int64) int64 {
	lo, hi, ok := a.regionGrid(start, count)
	if !ok {
		return 0
	}
	n := int64(1)
	for d := range lo {
		k := hi[d] - lo[d]
		if k > 0 && n > math.MaxInt64/k {
			return math.MaxInt64
		}
		n *= k
	}
	return n
}

// EachRegionChunk calls fn with the store key of every chunk (or shard)
// that holds any of the region, in grid order (last dimension fastest).
func (a *Array) EachRegionChunk(start, count []int64, fn func(key string)) {
	lo, hi, ok := a.regionGrid(start, count)
	if !ok {
		return
	}
	forEach(lo, hi, func(c []int64) { fn(a.ChunkKey(c)) })
}

func (a *Array) regionGrid(start, count []int64) (lo, hi []int64, ok bool) {
	rank := len(a.Shape)
	if len(start) != rank || len(count) != rank || len(a.Chunks) != rank {
		return nil, nil, false
	}
	lo = make([]int64, rank)
	hi = make([]int64, rank)
	for d := range rank {
		if count[d] <= 0 || a.Chunks[d] <= 0 {
			return nil, nil, false
		}
		lo[d] = start[d] / a.Chunks[d]
		hi[d] = (start[d]+count[d]-1)/a.Chunks[d] + 1
	}
	return lo, hi, true
}

// listLazily reports whether a's chunks are better asked one by one, as
// they are read, than listed: always for a store without a listing page
// size (a filesystem's stat, an HTTP HEAD), and for an array of more
// chunks than one listing request returns (an archive of a million time
// steps, of which a reader needs a few).
func listLazily(s objectstore.Store, a *Array) bool {
	page := objectstore.ObjectsPerListing(s)
	if page <= 0 {
		return true
	}
	return a.RegionChunkCount(make([]int64, len(a.Shape)), a.Shape) > int64(page)
}
