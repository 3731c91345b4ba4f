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
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

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
}

// Store is one snapshot of a repository, as a Store.
type Store struct {
	*targets.Store // Get, GetRange, List and their versions

	repo objectstore.Store
	ref  string
	spec int
	tg   *targets.Resolver

	mu  sync.Mutex // serialises Refresh
	cur atomic.Pointer[snapshot]

	manifests targets.Kept[*manifest] // by id; immutable files
}

var (
	_ objectstore.Store      = (*Store)(nil)
	_ objectstore.Refresher  = (*Store)(nil)
	_ objectstore.Localer    = (*Store)(nil)
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
	s := &Store{repo: repo, ref: opts.Ref, tg: opts.Targets}
	s.manifests.Max = manifestsKept
	if s.ref == "" {
		s.ref = "main"
	}
	s.Store = targets.NewStore(strings.TrimSuffix(repo.ID(), "/"), s.tg, func() targets.Index { return index{s, s.cur.Load()} })
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

// Identity names the repository and ref for cache keys.
func (s *Store) Identity() string {
	return "icechunk:" + objectstore.Identity(s.repo) + "@" + s.ref
}

// Local reports whether the repository is local, so that callers need not
// keep a second copy of its chunks. Virtual chunks' targets are not looked
// at (that would read every manifest): a local repository whose virtual
// chunks lie on S3 reports true.
func (s *Store) Local() bool {
	_, ok := s.repo.(*objectstore.Posix)
	return ok
}

// Close closes the repository's store and the target stores.
func (s *Store) Close() error {
	s.tg.Close()
	return s.repo.Close()
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

	// checked holds, by node id and extent, whether the node's chunks in
	// this manifest lie within the extent a snapshot gives it (nil) or
	// not: checked once, on the first lookup through that extent.
	mu      sync.Mutex
	checked map[string]error
}

// within checks, once per node and extent, that every chunk of node n in
// m lies in the extent r: a manifest holding a chunk outside the extent it
// is listed under would have it looked for in no manifest (or another)
// and read as the fill value.
func (m *manifest) within(n *node, r manifestRef) error {
	key := n.id + "\x00" + fmt.Sprint(r.lo, r.hi)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err, ok := m.checked[key]; ok {
		return err
	}
	var err error
	for _, x := range m.arrays[n.id] {
		if !r.holds(x.idx) {
			err = fmt.Errorf("%w: manifest %s holds chunk %v of array %q, outside the extent %v..%v the snapshot lists it under", errCorrupt, r.id, x.idx, "/"+n.path, r.lo, r.hi)
			break
		}
	}
	if m.checked == nil {
		m.checked = map[string]error{}
	}
	m.checked[key] = err
	return err
}

type indexed struct {
	idx []uint32
	c   chunk
}

// manifest returns the parsed manifest id, read once however many
// fills ask for it at the same time.
func (s *Store) manifest(ctx context.Context, id string) (*manifest, error) {
	return s.manifests.Get(ctx, id, func(ctx context.Context) (*manifest, error) {
		_, payload, err := readFile(ctx, s.repo, "manifests/"+id, fileManifest)
		if objectstore.IsNotFound(err) {
			return nil, fmt.Errorf("manifest %s is missing: %w", id, errCorrupt)
		}
		if err != nil {
			return nil, err
		}
		m, err := parseManifest(payload)
		if err != nil {
			return nil, fmt.Errorf("manifests/%s: %w", id, err)
		}
		return m, nil
	})
}

func parseManifest(payload []byte) (_ *manifest, err error) {
	defer guard(&err, "manifest")
	fm := format.GetRootAsManifest(payload, 0)
	var dict *zstd.Decoder
	if d := fm.LocationDictionaryBytes(); len(d) > 0 {
		if dict, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderDicts(d), zstd.WithDecoderMaxMemory(1<<20)); err != nil {
			return nil, fmt.Errorf("%w: location dictionary: %v", errCorrupt, err)
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
				return nil, fmt.Errorf("%w: chunk %v: offset %d length %d", errCorrupt, x.idx, cr.Offset(), cr.Length())
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
					return nil, fmt.Errorf("%w: chunk %v: compressed location without a dictionary", errCorrupt, x.idx)
				}
				loc, err := dict.DecodeAll(cr.CompressedLocationBytes(), nil)
				if err != nil {
					return nil, fmt.Errorf("%w: chunk %v: compressed location: %v", errCorrupt, x.idx, err)
				}
				c.location = string(loc)
			}
			c.etag = string(cr.ChecksumEtag())
			c.modified = cr.ChecksumLastModified()
			x.c = c
			refs = append(refs, x)
		}
		m.arrays[nid] = append(m.arrays[nid], refs...)
	}
	for nid, refs := range m.arrays {
		slices.SortFunc(refs, func(a, b indexed) int { return slices.Compare(a.idx, b.idx) })
		for i := 1; i < len(refs); i++ {
			if slices.Equal(refs[i].idx, refs[i-1].idx) {
				return nil, fmt.Errorf("%w: chunk %v of node %x referenced twice", errCorrupt, refs[i].idx, nid)
			}
		}
	}
	return m, nil
}

// index serves a snapshot's keys to targets.Store: each node's zarr.json,
// and the chunks its manifests hold.
type index struct {
	s    *Store
	snap *snapshot
}

// Lookup finds what key names in the snapshot.
func (x index) Lookup(ctx context.Context, key string) (targets.Ref, bool, error) {
	if dir, ok := strings.CutSuffix(key, "zarr.json"); ok && (dir == "" || strings.HasSuffix(dir, "/")) {
		if n, ok := x.snap.nodes[strings.TrimSuffix(dir, "/")]; ok {
			return targets.Ref{Inline: true, Data: n.doc}, true, nil
		}
		return targets.Ref{}, false, nil
	}
	// The longest array path that prefixes the key.
	for p := key; ; {
		i := strings.LastIndex(p, "/")
		arr := ""
		if i >= 0 {
			arr = p[:i]
		}
		if n, ok := x.snap.nodes[arr]; ok && n.array {
			rest := key
			if arr != "" {
				rest = key[len(arr)+1:]
			}
			c, err := x.s.findChunk(ctx, n, rest)
			if err != nil || c == nil {
				return targets.Ref{}, false, err
			}
			return x.s.chunkRef(c), true, nil
		}
		if i < 0 {
			return targets.Ref{}, false, nil
		}
		p = arr
	}
}

func (s *Store) findChunk(ctx context.Context, n *node, rest string) (*chunk, error) {
	idx, ok := n.chunkIndex(rest)
	if !ok {
		return nil, nil
	}
	mr, ok, err := n.manifestFor(idx)
	if err != nil || !ok {
		return nil, err
	}
	m, err := s.manifest(ctx, mr.id)
	if err != nil {
		return nil, err
	}
	if err := m.within(n, mr); err != nil {
		return nil, err
	}
	refs := m.arrays[n.id]
	if i, ok := slices.BinarySearchFunc(refs, idx, func(r indexed, t []uint32) int { return slices.Compare(r.idx, t) }); ok {
		return &refs[i].c, nil
	}
	return nil, nil
}

// chunkRef is what a chunk reference reads: inline bytes, a range of a chunk
// file of the repository (never rewritten: its id and range are the
// version), or a range of a virtual chunk's target, vetted against the
// checksum its commit recorded.
func (s *Store) chunkRef(c *chunk) targets.Ref {
	switch {
	case c.isInline:
		return targets.Ref{Inline: true, Data: c.inline}
	case c.native != "":
		key := "chunks/" + c.native
		return targets.Ref{
			Object:  targets.Target{Store: s.repo, Key: key, URL: s.ID() + "/" + key},
			Version: "n" + c.native + ":" + strconv.FormatInt(c.off, 10) + "+" + strconv.FormatInt(c.n, 10),
			Off:     c.off, N: c.n,
		}
	}
	return targets.Ref{URL: c.location, Off: c.off, N: c.n, Check: c.checkTarget}
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
		// A local file's version is size-mtime(ns)-inode-ctime(ns).
		parts := strings.Split(version, "-")
		if len(parts) >= 2 {
			if ns, err := strconv.ParseInt(parts[1], 10, 64); err == nil && ns/1e9 > int64(c.modified) {
				return fmt.Errorf("%s: %w (modified at %d, committed at %d)", t.URL, ErrStale, ns/1e9, c.modified)
			}
		}
	}
	return nil
}

// Children lists the children of dir: the names of the keys below it.
func (x index) Children(ctx context.Context, dir string) ([]string, error) {
	pre := ""
	if dir != "" {
		pre = dir + "/"
	}
	seen := map[string]bool{}
	var out []string
	err := x.Each(ctx, dir, func(key string, _ targets.Ref) {
		name, _, sub := strings.Cut(strings.TrimPrefix(key, pre), "/")
		if sub {
			name += "/"
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	})
	sort.Strings(out)
	return out, err
}

// Each calls fn with every key below prefix: documents and chunks.
func (x index) Each(ctx context.Context, prefix string, fn func(string, targets.Ref)) error {
	pre := ""
	if prefix != "" {
		pre = prefix + "/"
	}
	for _, p := range x.snap.paths {
		n := x.snap.nodes[p]
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
			fn(base+"zarr.json", targets.Ref{Inline: true, Data: n.doc})
		}
		if !n.array {
			continue
		}
		for _, mr := range n.manifests {
			m, err := x.s.manifest(ctx, mr.id)
			if err != nil {
				return err
			}
			refs := m.arrays[n.id]
			for i := range refs {
				key := base + n.chunkKey(refs[i].idx)
				if strings.HasPrefix(key, pre) {
					fn(key, x.s.chunkRef(&refs[i].c))
				}
			}
		}
	}
	return nil
}
