// Package kerchunk reads a kerchunk reference set as an objectstore.Store:
// every key is inline bytes or a byte range of a target file (a NetCDF4 or
// HDF5 file, another store's object), read through a targets.Resolver.
// Both forms are read: version 0 and 1 JSON ("refs", "templates", "gen")
// and the Parquet folder of fsspec's LazyReferenceMapper (".zmetadata" and
// "FIELD/refs.N.parq").
//
// Versions come from the targets: a key's version names its reference and
// the version of the target object it points into (a file's size, mtime
// and inode, an S3 object's ETag), so that a target rewritten in place is
// never served from a cache filled before. Refresh reads the reference set
// again when it changed.
//
// A Store is safe for concurrent use.
package kerchunk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/targets"
)

// Options configures Open.
type Options struct {
	// Targets resolves and reads the URLs the references point to; the
	// Store owns it and closes it. Required.
	Targets *targets.Resolver
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

// ErrMalformed is returned (wrapped) by Open and Refresh for a reference
// set that cannot be parsed.
var ErrMalformed = errors.New("malformed reference set")

// Store is a reference set opened as a Store.
type Store struct {
	dir  objectstore.Store // holds the reference set
	name string            // the JSON file's key in dir; "" for a Parquet folder
	id   string
	tg   *targets.Resolver
	log  *slog.Logger

	mu  sync.Mutex // serialises Refresh
	cur atomic.Pointer[state]
}

type state struct {
	refs    refSet
	version string // of the reference file (.zmetadata for Parquet)
}

var (
	_ objectstore.Store      = (*Store)(nil)
	_ objectstore.Versioned  = (*Store)(nil)
	_ objectstore.GetterInto = (*Store)(nil)
)

// Open reads the reference set at key name of dir (a JSON file), or, when
// name is "", the Parquet reference folder at dir's root. The Store owns
// dir and opts.Targets: Close closes them.
func Open(ctx context.Context, dir objectstore.Store, name string, opts Options) (*Store, error) {
	if opts.Targets == nil {
		return nil, errors.New("kerchunk: Options.Targets is required")
	}
	s := &Store{dir: dir, name: name, tg: opts.Targets, log: opts.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.id = strings.TrimSuffix(dir.ID(), "/")
	if name != "" {
		s.id += "/" + name
	}
	st, err := s.load(ctx, "")
	if err != nil {
		return nil, err
	}
	s.cur.Store(st)
	return s, nil
}

// load reads the reference set; with prev set, it returns nil, nil when
// the reference file still has version prev.
func (s *Store) load(ctx context.Context, prev string) (*state, error) {
	key := s.name
	if key == "" {
		key = ".zmetadata"
	}
	var doc []byte
	var ver string
	var err error
	if v, ok := objectstore.AsVersioned(s.dir); ok {
		if st, ok := s.dir.(objectstore.VersionStater); ok && prev != "" {
			if sv, err := st.StatVersion(ctx, key); err == nil && sv == prev {
				return nil, nil
			}
		}
		doc, ver, err = v.GetVersion(objectstore.WithSizeLimit(ctx, maxReferenceFile), key, nil)
	} else {
		doc, err = s.dir.Get(objectstore.WithSizeLimit(ctx, maxReferenceFile), key)
		ver = "x" + strconv.FormatUint(xxhash.Sum64(doc), 16)
	}
	if err != nil {
		return nil, err
	}
	if prev != "" && ver == prev {
		return nil, nil
	}
	var refs refSet
	if s.name != "" {
		refs, err = parseJSON(doc)
	} else {
		refs, err = openParquet(ctx, s.dir, doc)
	}
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w: %w", strings.TrimSuffix(s.dir.ID(), "/"), key, ErrMalformed, err)
	}
	return &state{refs: refs, version: ver}, nil
}

// maxReferenceFile bounds the reference file read into memory.
const maxReferenceFile = 4 << 30

// Refresh reads the reference set again if its file changed since it was
// read, so that reads made after it returns see the new references. It
// reports whether it did. On error the old references stay.
func (s *Store) Refresh(ctx context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.cur.Load()
	next, err := s.load(ctx, cur.version)
	if err != nil || next == nil {
		return false, err
	}
	s.cur.Store(next)
	return true, nil
}

// ID names the reference set: its file's URL (its folder's for Parquet).
func (s *Store) ID() string { return s.id }

// Local reports whether every target the references name is a local file,
// so that callers need not keep a second copy of their bytes.
func (s *Store) Local() bool {
	refs := s.cur.Load().refs
	for i := 0; i < refs.urlCount(); i++ {
		if !s.tg.IsLocal(refs.url(int32(i))) {
			return false
		}
	}
	return true
}

// Close closes the reference set's folder and the target stores.
func (s *Store) Close() error {
	s.tg.Close()
	if c, ok := s.dir.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

func (s *Store) fail(op, key string, err error) error {
	return &objectstore.Error{Op: op, Store: s.id, Key: key, Err: err}
}

// lookup returns the reference at key, or an ErrNotFound error.
func (s *Store) lookup(ctx context.Context, op, key string) (string, ref, refSet, error) {
	k, err := objectstore.CleanKey(key, false)
	if err != nil {
		return "", ref{}, nil, s.fail(op, key, err)
	}
	if err := ctx.Err(); err != nil {
		return "", ref{}, nil, s.fail(op, k, err)
	}
	refs := s.cur.Load().refs
	r, ok, err := refs.lookup(ctx, k)
	switch {
	case err != nil:
		return "", ref{}, nil, s.fail(op, k, err)
	case !ok:
		return "", ref{}, nil, s.fail(op, k, objectstore.ErrNotFound)
	}
	return k, r, refs, nil
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
	k, r, refs, err := s.lookup(ctx, "get", key)
	if err != nil {
		return nil, "", err
	}
	if r.inline() {
		if lim := objectstore.SizeLimit(ctx); int64(len(r.data)) > lim {
			return nil, "", s.fail("get", k, fmt.Errorf("%w: %d bytes, at most %d expected", objectstore.ErrTooLarge, len(r.data), lim))
		}
		return append(buf[:0], r.data...), inlineVersion(r.data), nil
	}
	if r.n >= 0 {
		if lim := objectstore.SizeLimit(ctx); r.n > lim {
			return nil, "", s.fail("get", k, fmt.Errorf("%w: %d bytes, at most %d expected", objectstore.ErrTooLarge, r.n, lim))
		}
	}
	u := refs.url(r.url)
	t, err := s.tg.Resolve(ctx, u)
	if err != nil {
		return nil, "", s.fail("get", k, err)
	}
	off, n := r.off, r.n
	b, tv, err := s.tg.Read(ctx, t, off, n)
	if err != nil {
		return nil, "", s.fail("get", k, fmt.Errorf("%s: %w", t.URL, err))
	}
	return b, refVersion(u, r, tv), nil
}

// GetRange reads length bytes at off of a key (off < 0: its last length
// bytes).
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	b, _, err := s.GetRangeVersion(ctx, key, off, length)
	return b, err
}

// GetRangeVersion reads a byte range of a key and the key's version.
func (s *Store) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	k, r, refs, err := s.lookup(ctx, "get range", key)
	if err != nil {
		return nil, "", err
	}
	if length < 0 {
		return nil, "", s.fail("get range", k, fmt.Errorf("negative length %d", length))
	}
	if r.inline() {
		size := int64(len(r.data))
		if off < 0 {
			off = size - length
		}
		if off < 0 || off+length > size {
			return nil, "", s.fail("get range", k, fmt.Errorf("%w: %d+%d, size %d", objectstore.ErrRange, off, length, size))
		}
		return append([]byte(nil), r.data[off:off+length]...), inlineVersion(r.data), nil
	}
	u := refs.url(r.url)
	t, err := s.tg.Resolve(ctx, u)
	if err != nil {
		return nil, "", s.fail("get range", k, err)
	}
	toff := off
	if r.n >= 0 {
		if off < 0 {
			off = r.n - length
		}
		if off < 0 || off+length > r.n {
			return nil, "", s.fail("get range", k, fmt.Errorf("%w: %d+%d, size %d", objectstore.ErrRange, off, length, r.n))
		}
		toff = r.off + off
	}
	b, tv, err := s.tg.Read(ctx, t, toff, length)
	if err != nil {
		return nil, "", s.fail("get range", k, fmt.Errorf("%s: %w", t.URL, err))
	}
	return b, refVersion(u, r, tv), nil
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
	refs := s.cur.Load().refs
	out, err := refs.children(ctx, k)
	if err != nil {
		return nil, s.fail("list", k, err)
	}
	if len(out) == 0 && k != "" {
		if _, ok, _ := refs.lookup(ctx, k); ok {
			return nil, s.fail("list", k, fmt.Errorf("not a directory"))
		}
		return nil, s.fail("list", k, objectstore.ErrNotFound)
	}
	return out, nil
}

// ListVersions lists every key below prefix with its version: the
// targets' versions are asked once per target object (a stat of a local
// file, a listing of a remote directory). A key whose target cannot be
// resolved or does not exist is listed too, with a version of its own, so
// that reading it fails rather than reading as a missing chunk.
func (s *Store) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	k, err := objectstore.CleanKey(prefix, true)
	if err != nil {
		return s.fail("list", prefix, err)
	}
	refs := s.cur.Load().refs
	type entry struct {
		key string
		r   ref
	}
	var entries []entry
	if err := refs.each(ctx, k, func(key string, r ref) { entries = append(entries, entry{key, r}) }); err != nil {
		return s.fail("list", k, err)
	}
	// One target per distinct URL.
	byURL := map[int32]int{}
	var ts []targets.Target
	var urls []int32
	unresolved := map[int32]bool{}
	for _, e := range entries {
		if e.r.inline() {
			continue
		}
		if _, ok := byURL[e.r.url]; ok || unresolved[e.r.url] {
			continue
		}
		t, err := s.tg.Resolve(ctx, refs.url(e.r.url))
		if err != nil {
			unresolved[e.r.url] = true
			continue
		}
		byURL[e.r.url] = len(ts)
		ts = append(ts, t)
		urls = append(urls, e.r.url)
	}
	vers, missing, err := s.tg.Versions(ctx, ts)
	if err != nil {
		return s.fail("list", k, err)
	}
	for _, e := range entries {
		switch {
		case e.r.inline():
			fn(e.key, inlineVersion(e.r.data))
		case unresolved[e.r.url]:
			fn(e.key, "unreadable")
		default:
			i := byURL[e.r.url]
			if missing[i] != nil {
				fn(e.key, "missing")
				continue
			}
			fn(e.key, refVersion(refs.url(e.r.url), e.r, vers[i]))
		}
	}
	return nil
}

func inlineVersion(b []byte) string {
	return "i" + strconv.FormatUint(xxhash.Sum64(b), 16)
}

// refVersion names a reference and the version of its target: a new
// target, offset or length, or a target rewritten, is a new version.
func refVersion(u string, r ref, target string) string {
	h := fnv.New64a()
	h.Write([]byte(u))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], uint64(r.off))
	binary.LittleEndian.PutUint64(b[8:], uint64(r.n))
	h.Write(b[:])
	return "r" + strconv.FormatUint(h.Sum64(), 16) + ":" + target
}
