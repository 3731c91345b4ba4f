package zarr

import (
	"context"
	"fmt"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/objectstore"
)

// source reads the bytes of one chunk or shard: a store key or a slice of
// an enclosing shard already in memory. Each read also returns, for bytes
// fetched fresh from a store, the key under which they may go to the source
// cache once verified ("" otherwise). version is the listed version of the
// object the bytes come from ("" when the array has no listing): part of
// every in-memory cache key, so bytes of one version never stand in for
// another's.
type source interface {
	whole(ctx context.Context) ([]byte, string, error)
	rng(ctx context.Context, off, n int64) ([]byte, string, error)
	suffix(ctx context.Context, n int64) ([]byte, string, error)
	version() string
}

type storeSource struct {
	h   *Hierarchy
	mem codec.HostMemory // lends the buffers a whole chunk is read into (readState.mem); nil: the store's
	sem chan struct{}
	key string
	// hint is the chunk's decoded size (about the most its compressed bytes
	// take), or 0 to leave the chunk out of the decoder's memory: only a
	// whole compressed chunk, whose buffer release frees, may use it.
	hint int
	meta string // the array's MetaHash: cached bytes never outlive their metadata
	// limit bounds the stored chunk read whole (the array's
	// MaxEncodedBytes): the store refuses a larger one before allocating
	// for it.
	limit int64
	// listing is the array's listing the Read reads under, nil for none.
	listing *Listing
	// fixed says the key's version was asked once when the Read started
	// (a Bounded listing, which may answer otherwise when asked again):
	// want is the version, present whether the listing holds the key at
	// all. Otherwise the listing is consulted as the read goes (Known),
	// and learns from the fetch a version it did not know.
	fixed, present bool
	want           string
	// entire says the read is of the whole object into a buffer of the
	// read's own (released with it): the source cache may then read into
	// that buffer (cached).
	entire bool
}

func (s storeSource) version() string {
	v, _, known := s.expected()
	if !known {
		return unlearnt
	}
	return v
}

// expected is what the read expects of its key: the version, whether the
// listing holds the key at all, and whether that is known yet (false for
// a key a lazy listing has not learnt: the fetch's response will say).
// Fixed when the Read started, else what the listing knows now; without
// a listing, nothing is expected, and that is known.
func (s storeSource) expected() (want string, listed, known bool) {
	switch {
	case s.fixed:
		return s.want, s.present, true
	case s.listing == nil:
		return "", false, true
	}
	return s.listing.Known(s.key)
}

// unlearnt is version() of a key its lazy listing has not learnt yet: no
// bytes are ever kept under it (it is no store's version), so a lookup
// with it misses, and the chunk's bytes are kept under the version its
// read learns.
const unlearnt = "\x00unlearnt"

// errNotListed is what a read of an object the listing lacks returns: the
// chunk is missing as far as the listing knows, which is what the bytes
// built from it must agree with.
var errNotListed = fmt.Errorf("%w: not in the array's listing", objectstore.ErrNotFound)

// do fetches bytes of s.key: f reads them from the store and returns their
// version ("" from a store that cannot tell). With a listing, an object it
// lacks is missing without a request, compressed bytes of the listed
// version come from the source cache without a request, and a fetch that
// finds another version fails with ErrChanged. A key a lazy listing has
// not learnt yet is not asked first: the fetch's response is the listing's
// answer (absent, for an object not found), so the read costs one request.
// Without a listing, the source cache is keyed by metadata (a store that
// cannot tell versions).
func (s storeSource) do(ctx context.Context, ck string, f func() ([]byte, string, error)) ([]byte, string, error) {
	b, fresh, _, err := s.doV(ctx, ck, f)
	return b, fresh, err
}

// doV is do that also returns the version the store read ("" for bytes
// from the source cache, or from a store that cannot tell).
func (s storeSource) doV(ctx context.Context, ck string, f func() ([]byte, string, error)) ([]byte, string, string, error) {
	sc := s.h.opts.SourceCache
	want, listed, known := s.expected()
	if s.listing != nil && known && !listed {
		return nil, "", "", errNotListed
	}
	base := ""
	if sc != nil {
		base = objectstore.Identity(s.h.Store) + "\x00" + ck
		lookup := base + "\x00" + want
		if s.listing == nil {
			lookup = objectstore.Identity(s.h.Store) + "\x00" + s.meta + "\x00" + ck
		}
		if known {
			if b, ok := s.cached(sc, lookup); ok {
				return b, "", "", nil
			}
		}
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, "", "", ctx.Err()
	}
	defer func() { <-s.sem }()
	s.h.stats.Requests.Add(1)
	b, ver, err := f()
	s.h.stats.BytesFetched.Add(int64(len(b)))
	if s.listing != nil && !known {
		switch {
		case err == nil:
			want, listed = s.listing.learn(s.key, ver, true)
		case objectstore.IsNotFound(err):
			if want, listed = s.listing.learn(s.key, "", false); !listed {
				return nil, "", "", err // absent, as the listing now says
			}
		default:
			return b, "", "", err // a failed read teaches nothing
		}
	}
	if s.listing != nil {
		switch {
		case objectstore.IsNotFound(err):
			err = fmt.Errorf("%w: listed as version %s, now absent", ErrChanged, want)
		case err == nil && !listed:
			err = fmt.Errorf("%w: listed as absent, read version %s", ErrChanged, ver)
		case err == nil && ver != want:
			err = fmt.Errorf("%w: listed as version %s, read version %s", ErrChanged, want, ver)
		}
	}
	switch {
	case sc == nil || err != nil:
		return b, "", ver, err
	case ver != "":
		return b, base + "\x00" + ver, ver, nil
	case s.listing == nil:
		return b, objectstore.Identity(s.h.Store) + "\x00" + s.meta + "\x00" + ck, ver, nil
	}
	return b, "", ver, nil
}

func (s storeSource) whole(ctx context.Context) ([]byte, string, error) {
	vs, versioned := objectstore.AsVersioned(s.h.Store)
	gi, into := s.h.Store.(objectstore.GetterInto)
	get := func(buf []byte) ([]byte, string, error) {
		switch {
		case versioned:
			return vs.GetVersion(ctx, s.key, buf, s.limit)
		case into:
			b, err := gi.GetInto(ctx, s.key, buf, s.limit)
			return b, "", err
		}
		b, err := objectstore.GetLimit(ctx, s.h.Store, s.key, s.limit)
		return b, "", err
	}
	s.entire = true
	if !versioned && !into {
		return s.do(ctx, s.key, func() ([]byte, string, error) { return get(nil) })
	}
	if mem := s.mem; mem != nil && s.hint > 0 {
		// Into the decoder's memory, which it reads without a copy. A
		// chunk larger than the room (incompressible beyond the
		// framing's slack) lands in memory of the store's own.
		return s.do(ctx, s.key, func() ([]byte, string, error) {
			buf := mem.HostAlloc(s.hint + s.hint/64 + 4096)
			b, ver, err := get(buf[:0])
			switch {
			case err != nil:
				mem.HostFree(buf)
				return nil, ver, err
			case len(b) == 0:
				mem.HostFree(buf)
				return []byte{}, ver, nil // not buf[:0]: release would free buf again
			case &b[0] != &buf[0]:
				mem.HostFree(buf) // b is the store's own
			default:
				b = trimmed(mem, buf, len(b))
			}
			return b, ver, nil
		})
	}
	// No lender (Options.Memory): the store allocates the chunk's bytes.
	return s.do(ctx, s.key, func() ([]byte, string, error) { return get(nil) })
}

func (s storeSource) getRange(ctx context.Context, off, n int64) ([]byte, string, error) {
	if vs, ok := objectstore.AsVersioned(s.h.Store); ok {
		return vs.GetRangeVersion(ctx, s.key, off, n)
	}
	b, err := s.h.Store.GetRange(ctx, s.key, off, n)
	return b, "", err
}

func (s storeSource) rng(ctx context.Context, off, n int64) ([]byte, string, error) {
	return s.do(ctx, fmt.Sprintf("%s\x00%d+%d", s.key, off, n), func() ([]byte, string, error) { return s.getRange(ctx, off, n) })
}

// rngV is rng that also returns the version read (doV).
func (s storeSource) rngV(ctx context.Context, off, n int64) ([]byte, string, string, error) {
	return s.doV(ctx, fmt.Sprintf("%s\x00%d+%d", s.key, off, n), func() ([]byte, string, error) { return s.getRange(ctx, off, n) })
}

// cachedWhole returns the whole object from the source cache, in the
// version a read would want, if it is there: read whole, it costs no
// request, so it is not read in part. A key its lazy listing has not
// learnt is not asked for this: it is not looked up.
func (s storeSource) cachedWhole() ([]byte, bool) {
	sc := s.h.opts.SourceCache
	if sc == nil {
		return nil, false
	}
	lookup := objectstore.Identity(s.h.Store) + "\x00" + s.meta + "\x00" + s.key
	if s.listing != nil {
		want, listed, known := s.expected()
		if !known || !listed {
			return nil, false
		}
		lookup = objectstore.Identity(s.h.Store) + "\x00" + s.key + "\x00" + want
	}
	s.entire = true
	return s.cached(sc, lookup)
}

// cached looks key up in the source cache. A whole object is read into
// the memory a fetch would read it into (the decoder's lent memory), when
// the cache can read into it: a chunk kept on disk goes from the file into
// pinned memory in one read, lent at its size once the cache holds it.
func (s storeSource) cached(sc SourceCache, key string) ([]byte, bool) {
	gi, ok := sc.(SourceCacheInto)
	if !ok || !s.entire {
		return sc.Get(key)
	}
	mem := s.mem
	if mem == nil || s.hint <= 0 {
		return gi.GetInto(key, nil) // no lender, or bytes it may not hold: the cache allocates them
	}
	var buf []byte
	b, ok := gi.GetInto(key, func(n int) []byte {
		buf = mem.HostAlloc(n)
		return buf
	})
	if cap(buf) > 0 && (!ok || len(b) == 0 || &b[0] != &buf[:1][0]) {
		mem.HostFree(buf) // damage found in the read, or bytes in memory of the cache's own
	}
	return b, ok
}

// trimmed gives mem back what of buf, room for a whole compressed chunk
// at its decoded size, lies past the n bytes read into it, where mem takes
// such tails (memory.Trimmer): the chunk holds its own bytes of the
// decoder's memory (a GPU's pinned memory, of which a fill reads many
// chunks at once), not twice as many.
func trimmed(mem codec.HostMemory, buf []byte, n int) []byte {
	if t, ok := mem.(memory.Trimmer); ok {
		return t.HostTrim(buf, n)
	}
	return buf[:n]
}

func (s storeSource) suffix(ctx context.Context, n int64) ([]byte, string, error) {
	return s.do(ctx, fmt.Sprintf("%s\x00-%d", s.key, n), func() ([]byte, string, error) { return s.getRange(ctx, -1, n) })
}

// lendHint is storeSource.hint for a's chunks.
func (a *Array) lendHint() int {
	if a.pipe.shard != nil || !a.pipe.compressed() {
		return 0 // inner chunks alias the shard's buffer; raw bytes alias theirs
	}
	return int(product(a.Chunks)) * a.DType.Size
}

// steps counts the bytes-to-bytes codecs a chunk is decoded through, each
// into a buffer of its own (checksums are stripped in place).
func (p *pipeline) steps() int {
	n := 0
	for _, c := range p.bb {
		if !c.crc32c {
			n++
		}
	}
	return n
}

// compressed reports whether a bytes-to-bytes codec other than crc32c
// transforms the chunk, so its decoded bytes never alias the fetched ones.
func (p *pipeline) compressed() bool { return p.steps() > 0 }

// nonNil marks an empty object as fetched (a nil slice means "not fetched").
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// memSource is a nested shard already in memory, of the version of the
// object it came from.
type memSource struct {
	b   []byte
	ver string
}

func (m memSource) version() string { return m.ver }

func (m memSource) whole(context.Context) ([]byte, string, error) { return m.b, "", nil }

func (m memSource) rng(_ context.Context, off, n int64) ([]byte, string, error) {
	if off < 0 || n < 0 || off > int64(len(m.b)) || n > int64(len(m.b))-off {
		return nil, "", fmt.Errorf("%w: range %d+%d past the end of a %d-byte shard", codec.ErrCorrupt, off, n, len(m.b))
	}
	return m.b[off : off+n], "", nil
}

func (m memSource) suffix(_ context.Context, n int64) ([]byte, string, error) {
	if n > int64(len(m.b)) {
		return nil, "", fmt.Errorf("%w: shard of %d bytes is shorter than its %d-byte index", codec.ErrCorrupt, len(m.b), n)
	}
	return m.b[int64(len(m.b))-n:], "", nil
}
