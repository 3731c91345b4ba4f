// Package icechunk reads an Icechunk repository (spec versions 1 and 2),
// read only, as an objectstore.Store of Zarr v3 keys: one snapshot, named
// by a branch, a tag or its id, whose nodes give each group's and array's
// zarr.json and whose manifests give each chunk's bytes: inline in the
// manifest, native (a range of a chunk file of the repository), or
// virtual (a range of a file elsewhere, read through a targets.Resolver).
//
// Versions: a native chunk's names its immutable chunk file and range, a
// virtual chunk's its location and the target object's version, an inline
// chunk's and a document's their bytes; so a new commit changes exactly the
// versions of the keys it changed. Refresh follows a branch to its newest
// commit. A Store is safe for concurrent use.
package icechunk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/icechunk/format"
	"github.com/zarrfs/zarrfs/objectstore/targets"
)

// Options configures Open.
type Options struct {
	// Ref is the branch, tag or snapshot id to read; "" means "main".
	Ref string
	// Targets resolves the locations of virtual chunks; the Store owns
	// it. Required.
	Targets *targets.Resolver
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

// Store is one snapshot of a repository, as a Store.
type Store struct {
	repo objectstore.Store
	ref  string
	spec int
	tg   *targets.Resolver
	log  *slog.Logger

	mu  sync.Mutex // serialises Refresh
	cur atomic.Pointer[snapshot]

	mmu       sync.Mutex
	manifests map[string]*manifest // by id; immutable files
	order     []string
}

var (
	_ objectstore.Store      = (*Store)(nil)
	_ objectstore.Versioned  = (*Store)(nil)
	_ objectstore.GetterInto = (*Store)(nil)
)

const manifestsKept = 64

// Open opens the repository at the root of repo at opts.Ref. It fails
// with one error for a repository of an unknown spec version, a ref that
// does not exist, or a snapshot or manifest that is missing or corrupt.
// The Store owns repo and opts.Targets: Close closes them.
func Open(ctx context.Context, repo objectstore.Store, opts Options) (*Store, error) {
	if opts.Targets == nil {
		return nil, errors.New("icechunk: Options.Targets is required")
	}
	s := &Store{repo: repo, ref: opts.Ref, tg: opts.Targets, log: opts.Logger, manifests: map[string]*manifest{}}
	if s.ref == "" {
		s.ref = "main"
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	snap, err := s.load(ctx)
	if err != nil {
		return nil, err
	}
	// Every manifest the snapshot names must be there: a repository with
	// one missing is refused now, not chunk by chunk.
	if err := s.checkManifests(ctx, snap); err != nil {
		return nil, err
	}
	s.cur.Store(snap)
	return s, nil
}

// checkManifests makes sure every manifest snap names exists (a stat
// each, or a one-byte read).
func (s *Store) checkManifests(ctx context.Context, snap *snapshot) error {
	st, stat := s.repo.(objectstore.VersionStater)
	for _, p := range snap.paths {
		for _, m := range snap.nodes[p].manifests {
			key := "manifests/" + m.id
			var err error
			if stat {
				_, err = st.StatVersion(ctx, key)
			} else {
				_, err = s.repo.GetRange(ctx, key, 0, 1)
			}
			if objectstore.IsNotFound(err) {
				return fmt.Errorf("%s: snapshot %s, array /%s: manifest %s is missing", s.ID(), snap.id, p, m.id)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Store) load(ctx context.Context) (*snapshot, error) {
	spec, repoInfo, err := specOf(ctx, s.repo)
	if err != nil {
		return nil, err
	}
	s.spec = spec
	id, err := resolveRef(ctx, s.repo, spec, repoInfo, s.ref)
	if err != nil {
		return nil, err
	}
	if cur := s.cur.Load(); cur != nil && cur.id == id {
		return cur, nil
	}
	return loadSnapshot(ctx, s.repo, id)
}

// Refresh follows the ref to the snapshot it names now (a branch's newest
// commit) and reports whether that changed. On error the old snapshot
// stays.
func (s *Store) Refresh(ctx context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.cur.Load()
	next, err := s.load(ctx)
	if err != nil || next == cur {
		return false, err
	}
	if err := s.checkManifests(ctx, next); err != nil {
		return false, err
	}
	s.cur.Store(next)
	return true, nil
}

// Snapshot returns the id of the snapshot read.
func (s *Store) Snapshot() string { return s.cur.Load().id }

// ID names the repository and the ref read.
func (s *Store) ID() string { return strings.TrimSuffix(s.repo.ID(), "/") }

// Identity names the repository and ref for cache keys.
func (s *Store) Identity() string {
	return "icechunk:" + objectstore.Identity(s.repo) + "@" + s.ref
}

// Local reports whether the repository and every virtual target it names
// are local files (so that callers need not keep a second copy).
func (s *Store) Local() bool {
	_, ok := s.repo.(*objectstore.Posix)
	return ok
}

// Close closes the repository's store and the target stores.
func (s *Store) Close() error {
	s.tg.Close()
	if c, ok := s.repo.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

func (s *Store) fail(op, key string, err error) error {
	return &objectstore.Error{Op: op, Store: s.ID(), Key: key, Err: err}
}

// chunk is one chunk reference of a manifest.
type chunk struct {
	inline   []byte
	native   string // chunk file id
	location string // virtual
	etag     string
	modified uint32
	off, n   int64
	isInline bool
}

// manifest is a parsed manifest: chunk references by node id, then by
// index (flattened, sorted as the file keeps them).
type manifest struct {
	arrays map[string][]indexed
}

type indexed struct {
	idx []uint32
	c   chunk
}

func (s *Store) manifest(ctx context.Context, id string) (*manifest, error) {
	s.mmu.Lock()
	if m, ok := s.manifests[id]; ok {
		s.mmu.Unlock()
		return m, nil
	}
	s.mmu.Unlock()
	_, payload, err := readFile(ctx, s.repo, "manifests/"+id, fileManifest)
	if objectstore.IsNotFound(err) {
		return nil, fmt.Errorf("manifest %s is missing: %w", id, ErrCorrupt)
	}
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(payload)
	if err != nil {
		return nil, fmt.Errorf("manifests/%s: %w", id, err)
	}
	s.mmu.Lock()
	if _, ok := s.manifests[id]; !ok {
		s.manifests[id] = m
		s.order = append(s.order, id)
		for len(s.order) > manifestsKept {
			delete(s.manifests, s.order[0])
			s.order = s.order[1:]
		}
	}
	s.mmu.Unlock()
	return m, nil
}

func parseManifest(payload []byte) (_ *manifest, err error) {
	defer guard(&err, "manifest")
	fm := format.GetRootAsManifest(payload, 0)
	var dict *zstd.Decoder
	if d := fm.LocationDictionaryBytes(); len(d) > 0 {
		if dict, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderDicts(d), zstd.WithDecoderMaxMemory(1<<20)); err != nil {
			return nil, fmt.Errorf("%w: location dictionary: %v", ErrCorrupt, err)
		}
		defer dict.Close()
	}
	m := &manifest{arrays: map[string][]indexed{}}
	var am format.ArrayManifest
	var cr format.ChunkRef
	for i := 0; i < fm.ArraysLength(); i++ {
		if !fm.Arrays(&am, i) {
			continue
		}
		nid := string(id8(am.NodeId(nil)))
		refs := make([]indexed, 0, am.RefsLength())
		for j := 0; j < am.RefsLength(); j++ {
			if !am.Refs(&cr, j) {
				continue
			}
			x := indexed{idx: make([]uint32, cr.IndexLength())}
			for d := range x.idx {
				x.idx[d] = cr.Index(d)
			}
			c := chunk{off: int64(cr.Offset()), n: int64(cr.Length())}
			if c.off < 0 || c.n < 0 {
				return nil, fmt.Errorf("%w: chunk %v: offset %d length %d", ErrCorrupt, x.idx, cr.Offset(), cr.Length())
			}
			switch {
			case cr.InlineLength() > 0 || (cr.ChunkId(nil) == nil && len(cr.Location()) == 0 && cr.CompressedLocationLength() == 0):
				c.isInline = true
				c.inline = append([]byte{}, cr.InlineBytes()...)
			case cr.ChunkId(nil) != nil:
				c.native = encodeID(id12(cr.ChunkId(nil)))
			case len(cr.Location()) > 0:
				c.location = string(cr.Location())
			default:
				if dict == nil {
					return nil, fmt.Errorf("%w: chunk %v: compressed location without a dictionary", ErrCorrupt, x.idx)
				}
				loc, err := dict.DecodeAll(cr.CompressedLocationBytes(), nil)
				if err != nil {
					return nil, fmt.Errorf("%w: chunk %v: compressed location: %v", ErrCorrupt, x.idx, err)
				}
				c.location = string(loc)
			}
			c.etag = string(cr.ChecksumEtag())
			c.modified = cr.ChecksumLastModified()
			x.c = c
			refs = append(refs, x)
		}
		sort.Slice(refs, func(a, b int) bool { return lessIdx(refs[a].idx, refs[b].idx) })
		m.arrays[nid] = append(m.arrays[nid], refs...)
	}
	return m, nil
}

func lessIdx(a, b []uint32) bool {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func equalIdx(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// entry is what a key names: a document or a chunk.
type entry struct {
	doc   []byte
	chunk *chunk
}

// lookup finds what key names in the current snapshot.
func (s *Store) lookup(ctx context.Context, op, key string) (string, entry, error) {
	k, err := objectstore.CleanKey(key, false)
	if err != nil {
		return "", entry{}, s.fail(op, key, err)
	}
	if err := ctx.Err(); err != nil {
		return "", entry{}, s.fail(op, k, err)
	}
	snap := s.cur.Load()
	if dir, ok := strings.CutSuffix(k, "zarr.json"); ok && (dir == "" || strings.HasSuffix(dir, "/")) {
		if n, ok := snap.nodes[strings.TrimSuffix(dir, "/")]; ok {
			return k, entry{doc: n.doc}, nil
		}
		return "", entry{}, s.fail(op, k, objectstore.ErrNotFound)
	}
	// The longest array path that prefixes the key.
	for p := k; ; {
		i := strings.LastIndex(p, "/")
		var arr string
		if i < 0 {
			arr = ""
		} else {
			arr = p[:i]
		}
		if n, ok := snap.nodes[arr]; ok && n.array {
			rest := k
			if arr != "" {
				rest = k[len(arr)+1:]
			}
			c, err := s.findChunk(ctx, n, rest)
			if err != nil {
				return "", entry{}, s.fail(op, k, err)
			}
			if c == nil {
				return "", entry{}, s.fail(op, k, objectstore.ErrNotFound)
			}
			return k, entry{chunk: c}, nil
		}
		if i < 0 {
			return "", entry{}, s.fail(op, k, objectstore.ErrNotFound)
		}
		p = arr
	}
}

func (s *Store) findChunk(ctx context.Context, n *node, rest string) (*chunk, error) {
	idx, ok := n.chunkIndex(rest)
	if !ok {
		return nil, nil
	}
	mid, ok := n.manifestFor(idx)
	if !ok {
		return nil, nil
	}
	m, err := s.manifest(ctx, mid)
	if err != nil {
		return nil, err
	}
	refs := m.arrays[n.id]
	i := sort.Search(len(refs), func(i int) bool { return !lessIdx(refs[i].idx, idx) })
	if i < len(refs) && equalIdx(refs[i].idx, idx) {
		c := refs[i].c
		return &c, nil
	}
	return nil, nil
}

// Get reads a whole key.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	b, _, err := s.GetVersion(ctx, key, nil)
	return b, err
}

// GetInto reads a whole key into buf.
func (s *Store) GetInto(ctx context.Context, key string, buf []byte) ([]byte, error) {
	b, _, err := s.GetVersion(ctx, key, buf)
	return b, err
}

// GetVersion reads a whole key and its version.
func (s *Store) GetVersion(ctx context.Context, key string, buf []byte) ([]byte, string, error) {
	k, e, err := s.lookup(ctx, "get", key)
	if err != nil {
		return nil, "", err
	}
	if e.chunk == nil {
		return append(buf[:0], e.doc...), hashVersion(e.doc), nil
	}
	c := e.chunk
	if lim := objectstore.SizeLimit(ctx); c.n > lim || int64(len(c.inline)) > lim {
		return nil, "", s.fail("get", k, fmt.Errorf("%w: chunk of %d bytes, at most %d expected", objectstore.ErrTooLarge, max(c.n, int64(len(c.inline))), lim))
	}
	b, v, err := s.read(ctx, c, 0, -1)
	if err != nil {
		return nil, "", s.fail("get", k, err)
	}
	return b, v, nil
}

// GetRange reads a byte range of a key.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	b, _, err := s.GetRangeVersion(ctx, key, off, length)
	return b, err
}

// GetRangeVersion reads a byte range of a key and the key's version.
func (s *Store) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	k, e, err := s.lookup(ctx, "get range", key)
	if err != nil {
		return nil, "", err
	}
	if length < 0 {
		return nil, "", s.fail("get range", k, fmt.Errorf("negative length %d", length))
	}
	size := int64(len(e.doc))
	if e.chunk != nil {
		size = e.chunk.size()
	}
	if off < 0 {
		off = size - length
	}
	if off < 0 || off+length > size {
		return nil, "", s.fail("get range", k, fmt.Errorf("%w: %d+%d, size %d", objectstore.ErrRange, off, length, size))
	}
	if e.chunk == nil {
		return append([]byte(nil), e.doc[off:off+length]...), hashVersion(e.doc), nil
	}
	b, v, err := s.read(ctx, e.chunk, off, length)
	if err != nil {
		return nil, "", s.fail("get range", k, err)
	}
	return b, v, nil
}

func (c *chunk) size() int64 {
	if c.isInline {
		return int64(len(c.inline))
	}
	return c.n
}

// read reads length bytes at off of a chunk (length < 0: all of it).
func (s *Store) read(ctx context.Context, c *chunk, off, length int64) ([]byte, string, error) {
	if length < 0 {
		off, length = 0, c.size()
	}
	switch {
	case c.isInline:
		return append([]byte(nil), c.inline[off:off+length]...), hashVersion(c.inline), nil
	case c.native != "":
		key := "chunks/" + c.native
		var b []byte
		var err error
		if v, ok := objectstore.AsVersioned(s.repo); ok {
			b, _, err = v.GetRangeVersion(ctx, key, c.off+off, length)
		} else {
			b, err = s.repo.GetRange(ctx, key, c.off+off, length)
		}
		if objectstore.IsNotFound(err) {
			err = fmt.Errorf("chunk file %s: %w", key, targets.ErrTargetMissing)
		}
		// Chunk files are never rewritten: their id and range are the version.
		return b, "n" + c.native + ":" + strconv.FormatInt(c.off, 10) + "+" + strconv.FormatInt(c.n, 10), err
	}
	t, err := s.tg.Resolve(ctx, c.location)
	if err != nil {
		return nil, "", err
	}
	b, tv, err := s.tg.Read(ctx, t, c.off+off, length)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", t.URL, err)
	}
	if err := c.checkTarget(t, tv); err != nil {
		return nil, "", err
	}
	return b, virtualVersion(c, tv), nil
}

// ErrStale is returned (wrapped) for a virtual chunk whose target changed
// since the chunk was committed (its ETag or modification time differs
// from the one recorded), as Icechunk refuses it.
var ErrStale = errors.New("virtual chunk's target changed since it was committed")

// checkTarget compares a target's version with the checksum the commit
// recorded: an S3 ETag, or a local file's modification time (seconds).
func (c *chunk) checkTarget(t targets.Target, version string) error {
	switch {
	case c.etag != "":
		if e, ok := strings.CutPrefix(version, "etag:"); ok && strings.Trim(e, `"`) != strings.Trim(c.etag, `"`) {
			return fmt.Errorf("%s: %w (ETag %s, committed %s)", t.URL, ErrStale, e, c.etag)
		}
	case c.modified != 0:
		// A local file's version is size-mtime(ns)-inode.
		parts := strings.Split(version, "-")
		if len(parts) >= 2 {
			if ns, err := strconv.ParseInt(parts[1], 10, 64); err == nil && ns/1e9 > int64(c.modified) {
				return fmt.Errorf("%s: %w (modified at %d, committed at %d)", t.URL, ErrStale, ns/1e9, c.modified)
			}
		}
	}
	return nil
}

func hashVersion(b []byte) string { return "i" + strconv.FormatUint(xxhash.Sum64(b), 16) }

func virtualVersion(c *chunk, target string) string {
	h := fnv.New64a()
	h.Write([]byte(c.location))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], uint64(c.off))
	binary.LittleEndian.PutUint64(b[8:], uint64(c.n))
	h.Write(b[:])
	return "v" + strconv.FormatUint(h.Sum64(), 16) + ":" + target
}

// List lists the children of a prefix.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	k, err := objectstore.CleanKey(prefix, true)
	if err != nil {
		return nil, s.fail("list", prefix, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, s.fail("list", k, err)
	}
	var keys []string
	if err := s.each(ctx, k, func(key string, _ entry) { keys = append(keys, key) }); err != nil {
		return nil, s.fail("list", k, err)
	}
	pre := ""
	if k != "" {
		pre = k + "/"
	}
	seen := map[string]bool{}
	var out []string
	for _, key := range keys {
		rest := strings.TrimPrefix(key, pre)
		name, _, dir := strings.Cut(rest, "/")
		if dir {
			name += "/"
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	if len(out) == 0 && k != "" {
		return nil, s.fail("list", k, objectstore.ErrNotFound)
	}
	sort.Strings(out)
	return out, nil
}

// each calls fn with every key below prefix: documents and chunks.
func (s *Store) each(ctx context.Context, prefix string, fn func(string, entry)) error {
	snap := s.cur.Load()
	pre := ""
	if prefix != "" {
		pre = prefix + "/"
	}
	for _, p := range snap.paths {
		n := snap.nodes[p]
		base := ""
		if p != "" {
			base = p + "/"
		}
		// Only a node below the prefix, or one the prefix lies inside
		// (its chunk keys), has keys below it.
		if !strings.HasPrefix(base, pre) && !strings.HasPrefix(pre, base) {
			continue
		}
		if strings.HasPrefix(base+"zarr.json", pre) {
			fn(base+"zarr.json", entry{doc: n.doc})
		}
		if !n.array {
			continue
		}
		for _, mr := range n.manifests {
			m, err := s.manifest(ctx, mr.id)
			if err != nil {
				return err
			}
			refs := m.arrays[n.id]
			for i := range refs {
				key := base + n.chunkKey(refs[i].idx)
				if strings.HasPrefix(key, pre) {
					fn(key, entry{chunk: &refs[i].c})
				}
			}
		}
	}
	return nil
}

// ListVersions lists every key below prefix with its version; virtual
// targets' versions are asked once per target object.
func (s *Store) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	k, err := objectstore.CleanKey(prefix, true)
	if err != nil {
		return s.fail("list", prefix, err)
	}
	type item struct {
		key string
		e   entry
	}
	var items []item
	if err := s.each(ctx, k, func(key string, e entry) { items = append(items, item{key, e}) }); err != nil {
		return s.fail("list", k, err)
	}
	byLoc := map[string]int{}
	var ts []targets.Target
	bad := map[string]bool{}
	for _, it := range items {
		c := it.e.chunk
		if c == nil || c.location == "" {
			continue
		}
		if _, ok := byLoc[c.location]; ok || bad[c.location] {
			continue
		}
		t, err := s.tg.Resolve(ctx, c.location)
		if err != nil {
			bad[c.location] = true
			continue
		}
		byLoc[c.location] = len(ts)
		ts = append(ts, t)
	}
	vers, errs, err := s.tg.Versions(ctx, ts)
	if err != nil {
		return s.fail("list", k, err)
	}
	for _, it := range items {
		c := it.e.chunk
		switch {
		case c == nil:
			fn(it.key, hashVersion(it.e.doc))
		case c.isInline:
			fn(it.key, hashVersion(c.inline))
		case c.native != "":
			fn(it.key, "n"+c.native+":"+strconv.FormatInt(c.off, 10)+"+"+strconv.FormatInt(c.n, 10))
		case bad[c.location]:
			fn(it.key, "unreadable")
		default:
			i := byLoc[c.location]
			if errs[i] != nil {
				fn(it.key, "unreadable")
				continue
			}
			fn(it.key, virtualVersion(c, vers[i]))
		}
	}
	return nil
}
