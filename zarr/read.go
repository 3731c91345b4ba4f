package zarr

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/parallel"
	"github.com/zarrfs/zarrfs/objectstore"
)

// ChunkError names the array and chunk key a read failed on.
type ChunkError struct {
	Array string // array path
	Key   string // store key of the chunk or shard ("t/c/0/1/0", "q/c/0/0/0/0 inner 5")
	Err   error
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("array %q chunk %s: %v", e.Array, e.Key, e.Err)
}

func (e *ChunkError) Unwrap() error { return e.Err }

// Stats counts work done by Reads on a Hierarchy (for tests and benchmarks).
type Stats struct {
	ChunksDecoded  atomic.Int64 // leaf chunks decompressed
	ChunksMissing  atomic.Int64 // leaf chunks read as fill value
	ChunkCacheHits atomic.Int64 // leaf chunks served from the decoded-chunk cache
	ChunksPartial  atomic.Int64 // leaf chunks decoded in part: blocks or bytes by ranged reads, or a stream up to its selection's end
	BytesFetched   atomic.Int64 // compressed bytes read from the store
	BytesDecoded   atomic.Int64 // bytes leaf chunks decoded to
	BytesAssembled atomic.Int64 // bytes copied (or byte-swapped) from decoded chunks into requests
	Requests       atomic.Int64 // reads sent to the store (whole objects and ranges)
	Listings       atomic.Int64 // arrays listed (Hierarchy.List)
}

// Stats returns the hierarchy's counters.
func (h *Hierarchy) Stats() *Stats {
	if h.stats == nil {
		return &Stats{} // a Hierarchy not made by Open counts nothing
	}
	return h.stats
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ChunkKey returns the store key of the chunk at grid coordinates coords.
func (a *Array) ChunkKey(coords []int64) string {
	var b strings.Builder
	if a.Path != "" {
		b.WriteString(a.Path)
		b.WriteByte('/')
	}
	if a.keyPrefix != "" {
		b.WriteString(a.keyPrefix)
		for _, c := range coords {
			b.WriteString(a.keySep)
			b.WriteString(strconv.FormatInt(c, 10))
		}
		return b.String()
	}
	if len(coords) == 0 {
		b.WriteByte('0')
		return b.String()
	}
	for i, c := range coords {
		if i > 0 {
			b.WriteString(a.keySep)
		}
		b.WriteString(strconv.FormatInt(c, 10))
	}
	return b.String()
}

// box is a half-open region [lo, hi) in array coordinates.
type box struct{ lo, hi []int64 }

func intersect(a, b box) (box, bool) {
	r := box{lo: make([]int64, len(a.lo)), hi: make([]int64, len(a.lo))}
	for i := range a.lo {
		r.lo[i] = max(a.lo[i], b.lo[i])
		r.hi[i] = min(a.hi[i], b.hi[i])
		if r.lo[i] >= r.hi[i] {
			return box{}, false
		}
	}
	return r, true
}

func (b box) volume() int64 {
	n := int64(1)
	for i := range b.lo {
		n *= b.hi[i] - b.lo[i]
	}
	return n
}

func product(s []int64) int64 {
	n := int64(1)
	for _, x := range s {
		n *= x
	}
	return n
}

// need is one request's share of a leaf chunk.
type need struct {
	req int
	box box
}

// leaf is one unit of decompression: a chunk, or an inner chunk of a shard.
type leaf struct {
	arr      *Array
	pipe     *pipeline
	shape    []int64 // full (decoded) chunk shape
	origin   []int64 // array coordinates of the chunk's first element
	key      string  // for messages
	cacheKey string
	needs    []need
	enc      []byte // compressed bytes
	missing  bool
	dec      []byte // decoded bytes, encoded layout (transposed, source byte order)
	pooled   bool   // the last step decoded into a buffer of lent's
	// lent holds the Read's holds on memory h.host lent for this leaf
	// (the buffers it decodes into, the cache's chunk it reads), given
	// back when the Read ends (release), whether it succeeded or not.
	lent     [][]byte
	direct   bool     // dec aliases a request's Dst, already in place
	placed   bool     // the decoder wrote the needs where they go (codec.Job.Place): dec holds nothing
	srcKey   string   // source-cache key of enc, to store once enc decoded
	encOwned bool     // enc is this read's own buffer, reusable once done
	part     *partial // set for a partial read: decoded straight into the requests
	err      error
	// absent: the whole chunk (or shard) is missing from the store, as
	// opposed to an inner chunk its shard's index says is empty;
	// listedAbsent: a listing said so, without a request.
	absent, listedAbsent bool
}

// readState carries one Read call.
type readState struct {
	h      *Hierarchy
	dec    codec.BatchDecoder // the Hierarchy's, or Decoding's
	mem    codec.HostMemory   // what compressed chunks are read into
	reqs   []Request
	sem    chan struct{}
	mu     sync.Mutex
	leaves []*leaf
	// puts are fetched bytes that are no leaf's own (an inner shard read
	// as a range of its shard), kept in the source cache with the
	// leaves' once every chunk decoded.
	puts []sourcePut
}

func (st *readState) add(l *leaf) {
	st.mu.Lock()
	st.leaves = append(st.leaves, l)
	st.mu.Unlock()
}

// Reader reads regions of arrays, filling every Request's Dst with C-order
// little-endian bytes, under pin (nil: each array's current listing).
// *Hierarchy implements it; it is an interface so that tests and
// decorators (metrics, fault injection) can stand in.
type Reader interface {
	Read(ctx context.Context, pin *Pin, reqs []Request) error
}

var _ Reader = (*Hierarchy)(nil)

// outer is one outer chunk (or shard) a Read needs, and what each request
// needs of it.
type outer struct {
	a      *Array
	coords []int64
	needs  []need
}

// Read fills every request's Dst. All chunks the requests need are fetched
// concurrently, each decoded once (even when several requests share it) in
// one batch. On error some Dst may be partly written.
//
// Under a pin (a blob's identity, Pin), each array is read under the
// listing the pin names and each chunk the pin names is checked against
// its pinned version (ErrChanged when it differs); a nil pin reads each
// array under its current listing.
func (h *Hierarchy) Read(ctx context.Context, pin *Pin, reqs []Request) error {
	return h.read(ctx, h.opts.Decoder, h.mem, pin, reqs)
}

// read is Read decoding with dec, reading whole compressed chunks into
// memory mem lends (nil: memory of the store's).
func (h *Hierarchy) read(ctx context.Context, dec codec.BatchDecoder, mem codec.HostMemory, pin *Pin, reqs []Request) error {
	st := &readState{h: h, dec: dec, mem: mem, reqs: reqs, sem: make(chan struct{}, h.opts.Fetchers)}
	defer st.release()
	order, err := outers(reqs)
	if err != nil {
		return err
	}
	// One listing per array for the whole call, so every chunk of it is
	// checked against the same listing: the one the pin names, else the
	// current one. With a source cache, an array not listed yet is listed
	// now (lazily listed stores: no request): the cache keeps bytes under
	// their versions, which only a listing names, so a read before any
	// fill listed the array (a batch of the device path) would miss it.
	listings := map[*Array]*Listing{}
	for _, o := range order {
		if _, ok := listings[o.a]; !ok {
			lst := pin.Listing(o.a)
			if lst == nil && h.opts.SourceCache != nil && o.a.Versioned() {
				var err error
				if lst, err = h.List(ctx, o.a, time.Time{}); err != nil {
					return err
				}
			}
			listings[o.a] = lst
		}
	}
	// Resolve outer chunks into leaves, fetching bytes concurrently.
	errs := make([]error, len(order))
	parallel.For(len(order), h.opts.Fetchers, func(i int) {
		o := order[i]
		cb := o.a.chunkBox(o.coords)
		key := o.a.ChunkKey(o.coords)
		// No stored chunk may be larger than its decoded size allows: the
		// store refuses it before allocating for it (limit).
		src := storeSource{h: h, mem: st.mem, sem: st.sem, key: key, hint: o.a.lendHint(), meta: o.a.MetaHash, limit: o.a.MaxEncodedBytes()}
		if lst := listings[o.a]; lst != nil {
			src.listing = lst
			v, ok, known := lst.Known(key)
			var err error
			if !known && (lst.AsksFirst() || pin.pins(o.a, o.coords)) {
				// A Bounded listing is asked once: the cache keys and
				// the check of the fetch agree with the answer, and it
				// with the pin, however it answers when asked again.
				// Any listing is asked a chunk the pin names (its
				// identity asked it already: no request), and one
				// made while the source cache held the store's bytes
				// any chunk (StoreHolder).
				v, ok, err = lst.Version(key)
				known = true
			}
			if err == nil && known {
				err = pin.check(o.a, o.coords, v, ok)
			}
			if err != nil {
				errs[i] = &ChunkError{Array: o.a.Path, Key: key, Err: err}
				return
			}
			// Not known (a remote lazy listing, under no pin): not asked
			// first; the fetch's response teaches the listing (doV).
			src.fixed, src.present, src.want = known, ok, v
		}
		errs[i] = st.resolve(ctx, o.a, o.a.pipe, o.a.Chunks, cb.lo, src, key, o.needs)
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fetched := time.Now()
	if err := st.decode(ctx); err != nil {
		return err
	}
	for _, l := range st.leaves {
		if l.err == nil && !l.missing && l.dec == nil && !l.direct && l.part == nil {
			l.err = fmt.Errorf("%w: chunk produced no data", codec.ErrCorrupt)
		}
		if l.err != nil {
			return &ChunkError{Array: l.arr.Path, Key: l.key, Err: l.err}
		}
	}
	// A chunk missing is the fill value only while the metadata names it.
	if err := st.checkAbsent(ctx, fetched, listings); err != nil {
		return err
	}
	st.keepSource()
	st.assemble()
	return nil
}

// keepSource puts the compressed bytes the Read fetched in the source
// cache: every chunk decoded and verified, only now may they be kept.
func (st *readState) keepSource() {
	sc := st.h.opts.SourceCache
	for _, l := range st.leaves {
		if l.srcKey != "" {
			sc.Put(l.srcKey, l.enc)
		}
		if l.part != nil && sc != nil {
			for _, p := range l.part.puts {
				sc.Put(p.key, p.b)
			}
		}
	}
	for _, p := range st.puts {
		sc.Put(p.key, p.b)
	}
}

// outers groups every request's share of each outer chunk, in the order
// the requests first need them.
func outers(reqs []Request) ([]*outer, error) {
	type outerKey struct {
		a   *Array
		key string
	}
	byKey := map[outerKey]*outer{}
	var order []*outer
	for i, r := range reqs {
		a := r.Array
		if err := a.check(r); err != nil {
			return nil, err
		}
		rank := len(a.Shape)
		reg := box{lo: r.Start, hi: make([]int64, rank)}
		for d := range rank {
			reg.hi[d] = r.Start[d] + r.Count[d]
		}
		if reg.volume() == 0 {
			continue
		}
		lo := make([]int64, rank)
		hi := make([]int64, rank)
		for d := range rank {
			lo[d] = reg.lo[d] / a.Chunks[d]
			hi[d] = (reg.hi[d]-1)/a.Chunks[d] + 1
		}
		forEach(lo, hi, func(c []int64) {
			cb := a.chunkBox(c)
			ib, _ := intersect(cb, reg)
			k := outerKey{a, a.ChunkKey(c)}
			o := byKey[k]
			if o == nil {
				o = &outer{a: a, coords: append([]int64(nil), c...)}
				byKey[k] = o
				order = append(order, o)
			}
			o.needs = append(o.needs, need{req: i, box: ib})
		})
	}
	return order, nil
}

func (a *Array) check(r Request) error {
	if a == nil || a.h == nil {
		return errors.New("zarr: request without an opened array")
	}
	if a.Unsupported != "" {
		return fmt.Errorf("array %q: %w: %s", a.Path, codec.ErrUnsupported, a.Unsupported)
	}
	rank := len(a.Shape)
	if len(r.Start) != rank || len(r.Count) != rank {
		return fmt.Errorf("array %q: region of rank %d/%d for an array of rank %d", a.Path, len(r.Start), len(r.Count), rank)
	}
	n := int64(a.DType.Size)
	for d := range rank {
		if r.Start[d] < 0 || r.Count[d] < 0 || r.Start[d]+r.Count[d] > a.Shape[d] {
			return fmt.Errorf("array %q: region start %v count %v outside shape %v", a.Path, r.Start, r.Count, a.Shape)
		}
		n *= r.Count[d]
	}
	if int64(len(r.Dst)) != n {
		return fmt.Errorf("array %q: destination of %d bytes for a region of %d bytes", a.Path, len(r.Dst), n)
	}
	return nil
}

func (a *Array) chunkBox(c []int64) box {
	return gridBox(c, a.Chunks, nil)
}

// gridBox is the box of grid cell c of cells shaped cell, offset by origin.
func gridBox(c, cell, origin []int64) box {
	b := box{lo: make([]int64, len(c)), hi: make([]int64, len(c))}
	for d := range c {
		b.lo[d] = c[d] * cell[d]
		if origin != nil {
			b.lo[d] += origin[d]
		}
		b.hi[d] = b.lo[d] + cell[d]
	}
	return b
}

// forEach calls f with every coordinate vector in [lo, hi), last index fastest.
// f must not keep c.
func forEach(lo, hi []int64, f func(c []int64)) {
	c := append([]int64(nil), lo...)
	for d := range lo {
		if lo[d] >= hi[d] {
			return
		}
	}
	for {
		f(c)
		d := len(c) - 1
		for ; d >= 0; d-- {
			c[d]++
			if c[d] < hi[d] {
				break
			}
			c[d] = lo[d]
		}
		if d < 0 {
			return
		}
	}
}

// resolve turns one chunk (or shard) into leaves, reading its bytes from src.
func (st *readState) resolve(ctx context.Context, a *Array, p *pipeline, shape, origin []int64, src source, key string, needs []need) error {
	if p.shard == nil {
		return st.resolveChunk(ctx, a, p, shape, origin, src, key, needs)
	}
	return st.resolveShard(ctx, a, p, shape, origin, src, key, needs)
}

// resolveChunk resolves an unsharded chunk: from the decoded-chunk cache,
// the source cache, in part (planPartial), or fetched whole.
func (st *readState) resolveChunk(ctx context.Context, a *Array, p *pipeline, shape, origin []int64, src source, key string, needs []need) error {
	l := &leaf{arr: a, pipe: p, shape: shape, origin: origin, key: key, needs: needs,
		cacheKey: a.MetaHash + "\x00" + key + "\x00" + src.version()}
	if dec, held, ok := st.h.chunks.get(l.cacheKey); ok {
		st.h.stats.ChunkCacheHits.Add(1)
		l.dec = dec
		if held {
			l.lent = append(l.lent, dec)
		}
		st.add(l)
		return nil
	}
	plan := st.planPartial(l)
	if ss, ok := src.(storeSource); ok && plan != nil && !plan.stream {
		if b, ok := ss.cachedWhole(); ok {
			l.enc, l.encOwned = nonNil(b), true
			st.add(l)
			return nil
		}
		if done, err := st.tryPartial(ctx, l, plan, chunkRange{ss, 0, -1}); done || err != nil {
			return err
		}
	}
	b, fresh, err := src.whole(ctx)
	l.srcKey = fresh
	// Kept under the version the fetch found (a lazy listing learns it
	// from the response).
	l.cacheKey = a.MetaHash + "\x00" + key + "\x00" + src.version()
	_, l.encOwned = src.(storeSource)
	switch {
	case objectstore.IsNotFound(err):
		l.missing, l.absent, l.listedAbsent = true, true, errors.Is(err, errNotListed)
	case err != nil:
		return &ChunkError{Array: a.Path, Key: key, Err: err}
	default:
		l.enc = nonNil(b)
		st.attachStream(l, plan)
	}
	st.add(l)
	return nil
}

// resolveShard resolves the inner chunks of a shard that the needs touch,
// through the shard's index, fetching them at most Fetchers at a time.
func (st *readState) resolveShard(ctx context.Context, a *Array, p *pipeline, shape, origin []int64, src source, key string, needs []need) error {
	s := p.shard
	rank := len(shape)
	grid := make([]int64, rank)
	for d := range rank {
		grid[d] = shape[d] / s.inner[d]
	}
	n := product(grid)
	idxLen := n * 16
	for _, c := range s.index.bb {
		if c.crc32c {
			idxLen += 4
		}
	}
	if idxLen > maxChunkBytes {
		return &ChunkError{Array: a.Path, Key: key, Err: fmt.Errorf("%w: shard index of %d bytes", codec.ErrUnsupported, idxLen)}
	}
	idx, held, err := st.shardIndex(ctx, a, s, src, key, idxLen)
	if held {
		defer st.h.giveBack(idx)
	}
	if objectstore.IsNotFound(err) {
		_, inner := src.(memSource)
		st.add(&leaf{arr: a, pipe: p, shape: shape, origin: origin, key: key, needs: needs, missing: true,
			absent: !inner, listedAbsent: errors.Is(err, errNotListed)})
		return nil
	}
	if err != nil {
		return &ChunkError{Array: a.Path, Key: key, Err: err}
	}
	span := innerSpan(needs, origin, s.inner, grid)
	var emu sync.Mutex
	var errs []error
	var fetches []func() // the inner chunks' reads, run at most Fetchers at a time
	forEach(span.lo, span.hi, func(c []int64) {
		ib := gridBox(c, s.inner, origin)
		var inner []need
		for _, nd := range needs {
			if x, ok := intersect(ib, nd.box); ok {
				inner = append(inner, need{req: nd.req, box: x})
			}
		}
		if len(inner) == 0 {
			return
		}
		lin := int64(0)
		for d := range rank {
			lin = lin*grid[d] + c[d]
		}
		off := binary.LittleEndian.Uint64(idx[lin*16:])
		nb := binary.LittleEndian.Uint64(idx[lin*16+8:])
		ikey := fmt.Sprintf("%s inner %v", key, c)
		if off == ^uint64(0) && nb == ^uint64(0) {
			st.add(&leaf{arr: a, pipe: s.codecs, shape: s.inner, origin: ib.lo, key: ikey, needs: inner, missing: true})
			return
		}
		if off > 1<<62 || nb > maxChunkBytes || (s.codecs.shard == nil && int64(nb) > maxEncoded(product(s.inner)*int64(a.DType.Size))) {
			emu.Lock()
			errs = append(errs, &ChunkError{Array: a.Path, Key: ikey, Err: fmt.Errorf("%w: shard index entry offset %d length %d", codec.ErrCorrupt, off, nb)})
			emu.Unlock()
			return
		}
		if s.indexAtStart && off < uint64(idxLen) {
			emu.Lock()
			errs = append(errs, &ChunkError{Array: a.Path, Key: ikey, Err: fmt.Errorf("%w: inner chunk at %d overlaps the shard index", codec.ErrCorrupt, off)})
			emu.Unlock()
			return
		}
		ck := a.MetaHash + "\x00" + ikey + "\x00" + src.version()
		if s.codecs.shard == nil {
			if dec, held, ok := st.h.chunks.get(ck); ok {
				st.h.stats.ChunkCacheHits.Add(1)
				l := &leaf{arr: a, pipe: s.codecs, shape: s.inner, origin: ib.lo, key: ikey, needs: inner, cacheKey: ck, dec: dec}
				if held {
					l.lent = append(l.lent, dec)
				}
				st.add(l)
				return
			}
		}
		fetches = append(fetches, func() {
			if err := st.fetchInner(ctx, a, s, src, inner, ib.lo, ikey, ck, int64(off), int64(nb)); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		})
	})
	parallel.For(len(fetches), st.h.opts.Fetchers, func(i int) { fetches[i]() })
	return errors.Join(errs...)
}

// innerSpan is the box of a shard's inner chunk grid (grid cells of inner
// elements, the shard starting at origin) that the needs touch.
func innerSpan(needs []need, origin, inner, grid []int64) box {
	rank := len(grid)
	span := box{lo: make([]int64, rank), hi: make([]int64, rank)}
	for d := range rank {
		span.lo[d], span.hi[d] = grid[d], 0
	}
	for _, nd := range needs {
		for d := range rank {
			span.lo[d] = min(span.lo[d], (nd.box.lo[d]-origin[d])/inner[d])
			span.hi[d] = max(span.hi[d], (nd.box.hi[d]-origin[d]-1)/inner[d]+1)
		}
	}
	return span
}

// fetchInner reads the inner chunk ikey of shard s, nb bytes at off of
// src (in part where that pays), and adds its leaf, or resolves it as a
// shard of its own when the shard nests. ck is its decoded-chunk cache key.
func (st *readState) fetchInner(ctx context.Context, a *Array, s *shardSpec, src source, inner []need, lo []int64, ikey, ck string, off, nb int64) error {
	var plan *partial
	if ss, ok := src.(storeSource); ok && s.codecs.shard == nil {
		l := &leaf{arr: a, pipe: s.codecs, shape: s.inner, origin: lo, key: ikey, needs: inner, cacheKey: ck}
		plan = st.planPartial(l)
		if done, err := st.tryPartial(ctx, l, plan, chunkRange{ss, off, nb}); done || err != nil {
			return err
		}
	}
	b, fresh, err := src.rng(ctx, off, nb)
	if err == nil {
		if s.codecs.shard != nil {
			err = st.resolve(ctx, a, s.codecs, s.inner, lo, memSource{b, src.version()}, ikey, inner)
			if err == nil && fresh != "" {
				st.mu.Lock()
				st.puts = append(st.puts, sourcePut{fresh, b})
				st.mu.Unlock()
			}
		} else {
			l := &leaf{arr: a, pipe: s.codecs, shape: s.inner, origin: lo, key: ikey, needs: inner, enc: nonNil(b), srcKey: fresh, cacheKey: ck}
			st.attachStream(l, plan)
			st.add(l)
		}
	}
	if err == nil {
		return nil
	}
	switch {
	case objectstore.IsNotFound(err):
		err = fmt.Errorf("%w: shard vanished while reading", codec.ErrCorrupt)
	case errors.Is(err, objectstore.ErrRange):
		err = fmt.Errorf("%w: the shard index points past the end of the shard: %w", codec.ErrCorrupt, err)
	}
	return &ChunkError{Array: a.Path, Key: ikey, Err: err}
}

// shardIndex reads, verifies and caches a shard index; held reports a
// hold on it (the decoded-chunk cache's buffer), to give back once it has
// been used.
func (st *readState) shardIndex(ctx context.Context, a *Array, s *shardSpec, src source, key string, n int64) (idx []byte, held bool, err error) {
	ck := ""
	if _, ok := src.(storeSource); ok {
		ck = "index\x00" + a.MetaHash + "\x00" + key + "\x00" + src.version()
		if b, held, ok := st.h.chunks.get(ck); ok {
			return b, held, nil
		}
	}
	var b []byte
	var fresh string
	if s.indexAtStart {
		b, fresh, err = src.rng(ctx, 0, n)
	} else {
		b, fresh, err = src.suffix(ctx, n)
	}
	if errors.Is(err, objectstore.ErrRange) {
		return nil, false, fmt.Errorf("%w: shard shorter than its %d-byte index: %w", codec.ErrCorrupt, n, err)
	}
	if err != nil {
		return nil, false, err
	}
	raw := b
	// The index codecs are bytes (+ crc32c): strip checksums outermost first.
	for i := len(s.index.bb) - 1; i >= 0; i-- {
		if b, err = verifyCRC(b); err != nil {
			return nil, false, fmt.Errorf("shard index: %w", err)
		}
	}
	if fresh != "" {
		st.h.opts.SourceCache.Put(fresh, raw)
	}
	if ck != "" {
		ck = "index\x00" + a.MetaHash + "\x00" + key + "\x00" + src.version() // as the fetch found it
	}
	if s.index.bigEndian {
		c := make([]byte, len(b))
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(c[i:], binary.BigEndian.Uint64(b[i:]))
		}
		b = c
	}
	if ck != "" {
		st.h.chunks.put(ck, b, -1)
	}
	return b, false, nil
}

func verifyCRC(b []byte) ([]byte, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: %d bytes cannot hold a crc32c", ErrChecksum, len(b))
	}
	body := b[:len(b)-4]
	want := binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != want {
		return nil, fmt.Errorf("%w: crc32c %08x, stored %08x", ErrChecksum, got, want)
	}
	return body, nil
}

// decode decompresses every fetched leaf, stage by stage, in batches.
func (st *readState) decode(ctx context.Context) error {
	type pending struct {
		l     *leaf
		cur   []byte
		stage int  // index into pipe.bb of the next codec to undo (counting down)
		tmp   bool // cur is a lent buffer an earlier step decoded into, which only the next step reads
	}
	var work []*pending
	var parts []codec.Job // partial leaves' jobs, decoded with the first round
	pl, ok := st.dec.(codec.Placer)
	places := ok && pl.Places()
	var partOf []*leaf
	for _, l := range st.leaves {
		switch {
		case l.part != nil:
			parts = append(parts, l.partialJob())
			partOf = append(partOf, l)
		case l.enc != nil:
			work = append(work, &pending{l: l, cur: l.enc, stage: len(l.pipe.bb) - 1})
		}
	}
	for len(work) > 0 || len(parts) > 0 {
		var jobs []codec.Job
		var owners []*pending
		next := work[:0]
		for _, w := range work {
			// Undo checksums right away; stop at the next compression step.
			for w.stage >= 0 && w.l.pipe.bb[w.stage].crc32c {
				b, err := verifyCRC(w.cur)
				if err != nil {
					w.l.err = err
					break
				}
				w.cur = b
				w.stage--
			}
			if w.l.err != nil {
				continue
			}
			if w.stage < 0 {
				st.finish(w.l, w.cur)
				continue
			}
			size := stageSize(w.l, w.stage)
			dst, pooled, direct := st.target(w.l, w.stage, size)
			w.l.pooled, w.l.direct = pooled, direct
			job := codec.Job{Codec: w.l.pipe.bb[w.stage].name, Src: w.cur, Dst: dst}
			// A chunk whose last placing left a ghost (chunkCache.haunted)
			// is read again in time for the decoded-chunk cache to serve
			// it: it decodes here, and is kept.
			if w.stage == 0 && pooled && places && !st.h.chunks.haunted(w.l.cacheKey) {
				job.Place = st.places(w.l)
			}
			jobs = append(jobs, job)
			owners = append(owners, w)
			next = append(next, w)
		}
		work = next
		whole := len(jobs)
		jobs = append(jobs, parts...)
		parts = nil
		if len(jobs) == 0 {
			break
		}
		if err := st.dec.DecodeBatch(ctx, jobs); err != nil {
			return err
		}
		st.h.stats.ChunksDecoded.Add(int64(len(jobs)))
		for k, j := range jobs[whole:] {
			if l := partOf[k]; j.Err != nil {
				l.err = j.Err
			} else {
				st.h.stats.BytesDecoded.Add(l.part.bytes)
			}
		}
		jobs = jobs[:whole]
		for i, j := range jobs {
			w := owners[i]
			if w.tmp {
				// This step's input, read now: given back, so that a chunk
				// of several steps holds two buffers at most.
				st.h.giveBack(w.l.unlend(w.cur))
				w.tmp = false
			}
			if j.Err != nil {
				w.l.err = j.Err
				continue
			}
			w.l.placed = j.Placed && len(j.Place) > 0
			w.cur = j.Dst
			w.stage--
			w.tmp = w.stage >= 0 && w.l.pooled
		}
		next = work[:0]
		for _, w := range work {
			if w.l.err != nil {
				continue
			}
			if w.stage < 0 {
				st.finish(w.l, w.cur)
				continue
			}
			next = append(next, w)
		}
		work = next
	}
	return nil
}

// stageSize is the decoded size of the data entering codec bb[stage] when encoding.
func stageSize(l *leaf, stage int) int64 {
	n := product(l.shape) * int64(l.arr.DType.Size)
	for i := 0; i < stage; i++ {
		if l.pipe.bb[i].crc32c {
			n += 4
		}
	}
	return n
}

// target picks where a leaf's decompression writes: straight into the
// requests' destinations when the leaf lands there as one contiguous run of
// memory and this is the last step (inPlace), otherwise a buffer the
// Hierarchy's host memory lends (the leaf's until the Read ends).
func (st *readState) target(l *leaf, stage int, size int64) (dst []byte, pooled, direct bool) {
	if stage == 0 && l.pipe.transpose == nil {
		if dst, ok := st.inPlace(l, size); ok {
			return dst, false, true
		}
	}
	dst = st.h.decodeBuf(int(size))
	l.lent = append(l.lent, dst)
	return dst, true, false
}

// decodeBuf lends n bytes for a chunk to decode into (Options.Host), or
// allocates them without a lender.
func (h *Hierarchy) decodeBuf(n int) []byte {
	if h.host != nil {
		return h.host.HostAlloc(n)
	}
	return make([]byte, n)
}

// giveBack gives back a hold on memory Options.Host lent (decodeBuf, or
// the decoded-chunk cache's get); other memory is left to the collector.
func (h *Hierarchy) giveBack(b []byte) {
	if h.host != nil {
		h.host.HostFree(b)
	}
}

// unlend takes b out of the leaf's holds, for its caller to give back
// now, and returns it.
func (l *leaf) unlend(b []byte) []byte {
	for i, x := range l.lent {
		if cap(x) > 0 && cap(b) > 0 && &x[:1][0] == &b[:1][0] {
			l.lent = slices.Delete(l.lent, i, i+1)
			break
		}
	}
	return b
}

// inPlace returns the memory a leaf of size bytes can decode straight into:
// every need is a run contiguous both in the leaf and in its request's
// destination (runs), and the runs sit side by side in memory exactly
// as they do in the leaf, covering it whole. One need that is the whole
// leaf is the common case; several are the channels a view stacks from
// one chunk (the levels of a (time, level, y, x) chunk, each a slot of the
// sample). The destinations are then parts of one buffer, so the range
// between them is memory the caller gave.
func (st *readState) inPlace(l *leaf, size int64) ([]byte, bool) {
	runs := st.runs(l)
	if len(runs) == 0 {
		return nil, false
	}
	var base uintptr
	var covered int64
	for i, r := range runs {
		b := uintptr(unsafe.Pointer(unsafe.SliceData(r.Dst))) - uintptr(r.Off)
		if i == 0 {
			base = b
		} else if b != base {
			return nil, false
		}
		covered += int64(len(r.Dst))
	}
	if covered != size {
		return nil, false
	}
	// The runs must tile the leaf: no two needs overlap.
	sort.Slice(runs, func(i, j int) bool { return runs[i].Off < runs[j].Off })
	at := int64(0)
	for _, r := range runs {
		if r.Off != at {
			return nil, false
		}
		at += int64(len(r.Dst))
	}
	// The first run starts the leaf: its destination is where the leaf
	// goes (a pointer into memory the caller gave, never one computed),
	// when that memory holds the whole leaf (its capacity: the channels
	// of one sample buffer; not requests' buffers of their own that lie
	// side by side by chance).
	if int64(cap(runs[0].Dst)) < size {
		return nil, false
	}
	return unsafe.Slice(unsafe.SliceData(runs[0].Dst), size), true
}

// places is where a leaf's decoded bytes are wanted, for a decoder that
// writes them there itself (codec.Job.Place): the needs' runs (runs), for
// a leaf whose bytes need neither a transpose nor a byte swap; nil where
// some need is not one run on both sides.
func (st *readState) places(l *leaf) []codec.Segment {
	if l.pipe.transpose != nil || l.pipe.bigEndian {
		return nil
	}
	return st.runs(l)
}

// runs returns, when every need of the leaf is a run contiguous both in
// the leaf and in its request's destination, each one's offset in the
// leaf and its memory in the destination, in the needs' order; else nil.
func (st *readState) runs(l *leaf) []codec.Segment {
	if len(l.needs) == 0 {
		return nil
	}
	itemsize := int64(l.arr.DType.Size)
	runs := make([]codec.Segment, 0, len(l.needs))
	for _, nd := range l.needs {
		r := st.reqs[nd.req]
		loff, ok := runIn(nd.box, l.origin, l.shape, itemsize)
		if !ok {
			return nil
		}
		doff, ok := runIn(nd.box, r.Start, r.Count, itemsize)
		if !ok {
			return nil
		}
		n := nd.box.volume() * itemsize
		if n == 0 || doff+n > int64(len(r.Dst)) {
			return nil
		}
		// Its capacity is the request's, which inPlace reads.
		runs = append(runs, codec.Segment{Off: loff, Dst: r.Dst[doff : doff+n]})
	}
	return runs
}

// runIn reports whether box b is one contiguous run of the C-order region
// [origin, origin+shape), and its byte offset there: past the first axis
// where b is shorter than the region it spans the region fully, and before
// it every extent is one.
func runIn(b box, origin, shape []int64, itemsize int64) (int64, bool) {
	rank := len(shape)
	k := -1
	for d := range rank {
		if b.hi[d]-b.lo[d] != shape[d] {
			k = d
		}
	}
	for d := 0; d < k; d++ {
		if b.hi[d]-b.lo[d] != 1 {
			return 0, false
		}
	}
	off := int64(0)
	stride := itemsize
	for d := rank - 1; d >= 0; d-- {
		off += (b.lo[d] - origin[d]) * stride
		stride *= shape[d]
	}
	return off, true
}

// release gives back what the call holds: the buffers its chunks decoded
// into and the cache's chunks it read (the cache keeps holds of its own
// on those it keeps), and the compressed buffers, except where the decoded
// data still aliases them (a pipeline without compression keeps its bytes
// as they came).
func (st *readState) release() {
	for _, l := range st.leaves {
		for _, b := range l.lent {
			st.h.giveBack(b)
		}
		l.lent, l.dec = nil, nil
		if !l.encOwned || l.enc == nil {
			continue
		}
		if l.pipe.compressed() && st.mem != nil {
			st.mem.HostFree(l.enc) // memory not lent is left to the collector
		}
		l.enc = nil
	}
}

// inBounds is the number of the leaf's elements inside the array (an edge
// chunk sticks out of it).
func (l *leaf) inBounds() int64 {
	n := int64(1)
	for d := range l.shape {
		n *= max(0, min(l.origin[d]+l.shape[d], l.arr.Shape[d])-l.origin[d])
	}
	return n
}

// finish records a leaf's decoded bytes (data at the array-to-bytes level).
func (st *readState) finish(l *leaf, dec []byte) {
	want := product(l.shape) * int64(l.arr.DType.Size)
	if int64(len(dec)) != want {
		l.err = fmt.Errorf("%w: decoded %d bytes, expected %d", codec.ErrCorrupt, len(dec), want)
		return
	}
	l.dec = dec
	st.h.stats.BytesDecoded.Add(want)
}

// assemble copies every leaf's share into the requests.
func (st *readState) assemble() {
	for _, l := range st.leaves {
		if l.part != nil {
			// Decoded into the requests, segment by segment: only the
			// byte order is left.
			for _, sg := range l.part.segs {
				if l.pipe.bigEndian {
					swapBytes(sg.Dst, l.arr.DType.Size)
				}
				st.h.stats.BytesAssembled.Add(int64(len(sg.Dst)))
			}
			l.part = nil
			continue
		}
		if l.placed {
			// The decoder wrote each need where it goes (places): nothing
			// to copy, and no decoded bytes here to keep for a later read;
			// a chunk used in part leaves its ghost instead.
			used := int64(0)
			for _, nd := range l.needs {
				used += nd.box.volume()
			}
			st.h.stats.BytesAssembled.Add(used * int64(l.arr.DType.Size))
			if l.cacheKey != "" && used < l.inBounds() {
				st.h.chunks.placed(l.cacheKey, int64(len(l.dec)))
			}
			l.dec = nil
			continue
		}
		if l.direct {
			// Decoded in place (inPlace): only the byte order is left.
			if l.pipe.bigEndian {
				swapBytes(l.dec, l.arr.DType.Size)
				st.h.stats.BytesAssembled.Add(int64(len(l.dec)))
			}
			l.dec = nil
			continue
		}
		used := int64(0)
		for _, nd := range l.needs {
			r := st.reqs[nd.req]
			if l.missing {
				fillBox(r, nd.box, l.arr.fill)
				continue
			}
			copyBox(l, r, nd.box)
			used += nd.box.volume()
		}
		st.h.stats.BytesAssembled.Add(used * int64(l.arr.DType.Size))
		if l.missing {
			st.h.stats.ChunksMissing.Add(1)
			continue
		}
		switch inside := l.inBounds(); {
		case l.enc == nil && l.cacheKey != "":
			st.h.chunks.consume(l.cacheKey, used) // served from the cache
		case used < inside && l.cacheKey != "":
			// Part of this chunk is still unread: kept for the next
			// sample (with a hold of the cache's own).
			st.h.chunks.put(l.cacheKey, l.dec, inside-used)
		}
	}
}

func strides(shape []int64, size int64) []int64 {
	s := make([]int64, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		s[d] = size
		size *= shape[d]
	}
	return s
}

// copyBox copies region b of leaf l into request r, undoing transpose and
// byte order.
func copyBox(l *leaf, r Request, b box) {
	rank := len(l.shape)
	size := int64(l.arr.DType.Size)
	dstStride := strides(r.Count, size)
	var srcStride []int64
	if t := l.pipe.transpose; t != nil {
		enc := make([]int64, rank)
		for i, d := range t {
			enc[i] = l.shape[d]
		}
		es := strides(enc, size)
		srcStride = make([]int64, rank)
		for i, d := range t {
			srcStride[d] = es[i]
		}
	} else {
		srcStride = strides(l.shape, size)
	}
	if rank == 0 {
		copy(r.Dst, l.dec[:size])
		if l.pipe.bigEndian {
			swapBytes(r.Dst[:size], int(size))
		}
		return
	}
	so, do := int64(0), int64(0)
	for d := range rank {
		so += (b.lo[d] - l.origin[d]) * srcStride[d]
		do += (b.lo[d] - r.Start[d]) * dstStride[d]
	}
	ext := make([]int64, rank)
	for d := range rank {
		ext[d] = b.hi[d] - b.lo[d]
	}
	last := rank - 1
	if srcStride[last] == size {
		// Rows of the last dimension are contiguous on both sides.
		row := ext[last] * size
		zero := make([]int64, rank-1)
		forEach(zero, ext[:last], func(c []int64) {
			s, t := so, do
			for d := range last {
				s += c[d] * srcStride[d]
				t += c[d] * dstStride[d]
			}
			copy(r.Dst[t:t+row], l.dec[s:s+row])
			if l.pipe.bigEndian {
				swapBytes(r.Dst[t:t+row], int(size))
			}
		})
		return
	}
	// Transposed: element by element, innermost destination dimension fastest.
	zero := make([]int64, rank-1)
	n := ext[last]
	ss, ds := srcStride[last], dstStride[last]
	forEach(zero, ext[:last], func(c []int64) {
		s, t := so, do
		for d := range last {
			s += c[d] * srcStride[d]
			t += c[d] * dstStride[d]
		}
		switch size {
		case 1:
			for i := range n {
				r.Dst[t+i] = l.dec[s+i*ss]
			}
		default:
			for i := range n {
				copy(r.Dst[t+i*ds:t+i*ds+size], l.dec[s+i*ss:s+i*ss+size])
			}
			if l.pipe.bigEndian {
				swapBytes(r.Dst[t:t+n*size], int(size))
			}
		}
	})
}

// fillBox writes the fill value over region b of request r.
func fillBox(r Request, b box, fill []byte) {
	rank := len(r.Count)
	size := int64(len(fill))
	if rank == 0 {
		copy(r.Dst, fill)
		return
	}
	dstStride := strides(r.Count, size)
	last := rank - 1
	rowLen := (b.hi[last] - b.lo[last]) * size
	row := make([]byte, rowLen)
	allZero := true
	for _, x := range fill {
		if x != 0 {
			allZero = false
		}
	}
	if !allZero {
		for i := int64(0); i < rowLen; i += size {
			copy(row[i:], fill)
		}
	}
	ext := make([]int64, last)
	for d := range last {
		ext[d] = b.hi[d] - b.lo[d]
	}
	do := int64(0)
	for d := range rank {
		do += (b.lo[d] - r.Start[d]) * dstStride[d]
	}
	forEach(make([]int64, last), ext, func(c []int64) {
		t := do
		for d := range last {
			t += c[d] * dstStride[d]
		}
		copy(r.Dst[t:t+rowLen], row)
	})
}

// swapBytes reverses the byte order of every size-byte element of b.
func swapBytes(b []byte, size int) {
	switch size {
	case 2:
		for i := 0; i+2 <= len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], bits.ReverseBytes16(binary.LittleEndian.Uint16(b[i:])))
		}
	case 4:
		for i := 0; i+4 <= len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], bits.ReverseBytes32(binary.LittleEndian.Uint32(b[i:])))
		}
	case 8:
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], bits.ReverseBytes64(binary.LittleEndian.Uint64(b[i:])))
		}
	}
}
