package targets

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/cespare/xxhash/v2"

	"github.com/zarrfs/zarrfs/objectstore"
)

// Ref is what one key of a virtual store names: bytes held inline, or a
// byte range of a target object.
type Ref struct {
	// Inline: the key's bytes are Data.
	Inline bool
	Data   []byte
	// URL names the target object, resolved by the Resolver.
	URL string
	// Object, used when URL is "", is a target already resolved whose
	// bytes never change (an Icechunk chunk file): Version is then the
	// key's version, and no store is asked for one.
	Object  Target
	Version string
	// Off and N are the range of the target that holds the key's bytes;
	// N < 0 means the whole object (Off is then 0).
	Off, N int64
	// Check, when set, vets the version of the target a read came from
	// before its bytes are served (Icechunk refuses a target changed
	// since the commit that names it).
	Check func(t Target, version string) error
}

// size is the size of the key's bytes, -1 when only the target knows it.
func (r *Ref) size() int64 {
	if r.Inline {
		return int64(len(r.Data))
	}
	return r.N
}

// version names the key's bytes: an inline key's by their hash, a range's
// by its target, offset and length and the target's own version, so that
// a new target, offset or length, or a target rewritten in place, is a new
// version.
func (r *Ref) version(target string) string {
	switch {
	case r.Inline:
		return "i" + strconv.FormatUint(xxhash.Sum64(r.Data), 16)
	case r.URL == "":
		return r.Version
	}
	h := fnv.New64a()
	h.Write([]byte(r.URL))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], uint64(r.Off))
	binary.LittleEndian.PutUint64(b[8:], uint64(r.N))
	h.Write(b[:])
	return "r" + strconv.FormatUint(h.Sum64(), 16) + ":" + target
}

// Index is the format's side of a virtual store (a kerchunk reference
// set, an Icechunk snapshot): the reference each key names. Keys and
// prefixes passed to it are clean (objectstore.CleanKey). An Index is
// immutable, or safe for concurrent use.
type Index interface {
	// Lookup returns the reference at key; ok is false when there is none.
	Lookup(ctx context.Context, key string) (r Ref, ok bool, err error)
	// Children lists the immediate children of dir ("" for the root),
	// sorted, directories with a trailing "/".
	Children(ctx context.Context, dir string) ([]string, error)
	// Each calls fn with every key below prefix ("" for all), at any
	// depth, and its reference.
	Each(ctx context.Context, prefix string, fn func(key string, r Ref)) error
}

// Store serves the keys of an Index as a versioned objectstore.Store,
// reading targets through a Resolver. The virtual stores embed it and add
// what is theirs (opening, Refresh, Close). It is safe for concurrent use
// when the Index is.
type Store struct {
	id    string
	tg    *Resolver
	index func() Index
}

var (
	_ objectstore.Store      = (*Store)(nil)
	_ objectstore.Versioned  = (*Store)(nil)
	_ objectstore.GetterInto = (*Store)(nil)
)

// NewStore returns the Store named id whose keys are those of index(),
// called once per operation, so that an operation sees one Index however
// the caller swaps it (a reference set read again, a branch's new
// commit).
func NewStore(id string, tg *Resolver, index func() Index) *Store {
	return &Store{id: id, tg: tg, index: index}
}

// ID names the store.
func (s *Store) ID() string { return s.id }

// Close closes the target stores read through; the virtual stores that
// embed a Store close what is theirs too.
func (s *Store) Close() error { return s.tg.Close() }

func (s *Store) fail(op, key string, err error) error {
	return &objectstore.Error{Op: op, Store: s.id, Key: key, Err: err}
}

// lookup returns the reference at key, or an ErrNotFound error.
func (s *Store) lookup(ctx context.Context, op, key string) (string, Ref, error) {
	k, err := objectstore.CleanKey(key, false)
	if err != nil {
		return "", Ref{}, s.fail(op, key, err)
	}
	if err := ctx.Err(); err != nil {
		return "", Ref{}, s.fail(op, k, err)
	}
	r, ok, err := s.index().Lookup(ctx, k)
	switch {
	case err != nil:
		return "", Ref{}, s.fail(op, k, err)
	case !ok:
		return "", Ref{}, s.fail(op, k, objectstore.ErrNotFound)
	}
	return k, r, nil
}

// Get reads a whole key.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	b, _, err := s.GetVersion(ctx, key, nil, 0)
	return b, err
}

// GetInto reads a whole key into buf.
func (s *Store) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	b, _, err := s.GetVersion(ctx, key, buf, limit)
	return b, err
}

// GetVersion reads a whole key of at most limit bytes (0:
// objectstore.DefaultSizeLimit) and its version.
func (s *Store) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	k, r, err := s.lookup(ctx, "get", key)
	if err != nil {
		return nil, "", err
	}
	if lim := objectstore.SizeLimit(limit); r.size() > lim {
		return nil, "", s.fail("get", k, fmt.Errorf("%w: %d bytes, at most %d expected", objectstore.ErrTooLarge, r.size(), lim))
	}
	if r.Inline {
		return append(buf[:0], r.Data...), r.version(""), nil
	}
	b, v, err := s.read(ctx, &r, r.Off, r.N, limit)
	if err != nil {
		return nil, "", s.fail("get", k, err)
	}
	return b, v, nil
}

// GetRange reads length bytes at off of a key (off < 0: its last length
// bytes).
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	b, _, err := s.GetRangeVersion(ctx, key, off, length)
	return b, err
}

// GetRangeVersion reads a byte range of a key and the key's version.
func (s *Store) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	k, r, err := s.lookup(ctx, "get range", key)
	if err != nil {
		return nil, "", err
	}
	if length < 0 {
		return nil, "", s.fail("get range", k, fmt.Errorf("negative length %d", length))
	}
	if size := r.size(); size >= 0 {
		if off < 0 {
			off = size - length
		}
		if off < 0 || off+length > size {
			return nil, "", s.fail("get range", k, fmt.Errorf("%w: %d+%d, size %d", objectstore.ErrRange, off, length, size))
		}
		if r.Inline {
			return append([]byte(nil), r.Data[off:off+length]...), r.version(""), nil
		}
		off += r.Off
	}
	// A reference to a whole target passes the range (a suffix one too)
	// to the target, which alone knows its size.
	b, v, err := s.read(ctx, &r, off, length, 0)
	if err != nil {
		return nil, "", s.fail("get range", k, err)
	}
	return b, v, nil
}

// read reads length bytes at off of r's target (length < 0: all of it).
func (s *Store) read(ctx context.Context, r *Ref, off, length, limit int64) ([]byte, string, error) {
	t := r.Object
	if r.URL != "" {
		var err error
		if t, err = s.tg.Resolve(ctx, r.URL); err != nil {
			return nil, "", err
		}
	}
	if length < 0 {
		off = 0
	}
	b, tv, err := s.tg.Read(ctx, t, off, length, limit)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", t.URL, err)
	}
	if r.Check != nil {
		if err := r.Check(t, tv); err != nil {
			return nil, "", err
		}
	}
	return b, r.version(tv), nil
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
	idx := s.index()
	out, err := idx.Children(ctx, k)
	if err != nil {
		return nil, s.fail("list", k, err)
	}
	if len(out) == 0 && k != "" {
		if _, ok, _ := idx.Lookup(ctx, k); ok {
			return nil, s.fail("list", k, fmt.Errorf("not a directory"))
		}
		return nil, s.fail("list", k, objectstore.ErrNotFound)
	}
	return out, nil
}

// ListVersions lists every key below prefix with its version: the
// targets' versions are asked once per target object (a stat of a local
// file, a listing of a remote directory). A key whose target cannot be
// resolved or read is listed too, with a version no read returns, so that
// reading it fails rather than reading as a missing chunk.
func (s *Store) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	k, err := objectstore.CleanKey(prefix, true)
	if err != nil {
		return s.fail("list", prefix, err)
	}
	type item struct {
		key string
		r   Ref
	}
	var items []item
	if err := s.index().Each(ctx, k, func(key string, r Ref) { items = append(items, item{key, r}) }); err != nil {
		return s.fail("list", k, err)
	}
	// One target per distinct URL; -1 for one that does not resolve.
	at := map[string]int{}
	var ts []Target
	for _, it := range items {
		u := it.r.URL
		if it.r.Inline || u == "" {
			continue
		}
		if _, ok := at[u]; ok {
			continue
		}
		t, err := s.tg.Resolve(ctx, u)
		if err != nil {
			at[u] = -1
			continue
		}
		at[u] = len(ts)
		ts = append(ts, t)
	}
	vers, errs, err := s.tg.Versions(ctx, ts)
	if err != nil {
		return s.fail("list", k, err)
	}
	for _, it := range items {
		r := &it.r
		if r.Inline || r.URL == "" {
			fn(it.key, r.version(""))
			continue
		}
		switch i := at[r.URL]; {
		case i < 0:
			fn(it.key, "unreadable")
		case errors.Is(errs[i], ErrTargetMissing):
			fn(it.key, "missing")
		case errs[i] != nil:
			fn(it.key, "unreadable")
		default:
			fn(it.key, r.version(vers[i]))
		}
	}
	return nil
}
