// Package kerchunk reads a kerchunk reference set as an objectstore.Store:
// every key is inline bytes or a byte range of a target file (a NetCDF4 or
// HDF5 file, another store's object), read through a targets.Resolver.
// Both forms are read: version 0 and 1 JSON ("refs", "templates", "gen")
// and the Parquet folder of fsspec's LazyReferenceMapper (".zmetadata" and
// "FIELD/refs.N.parq").
//
// Versions come from the targets: a key's version names its reference and
// the version of the target object it points into (a file's size, mtime,
// inode and ctime, an S3 object's ETag), so that a target rewritten in place is
// never served from a cache filled before. Refresh reads the reference set
// again when it changed.
//
// A Store is safe for concurrent use.
package kerchunk

import (
	"context"
	"errors"
	"fmt"
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
}

// ErrMalformed is returned (wrapped) by Open and Refresh for a reference
// set that cannot be parsed.
var ErrMalformed = errors.New("malformed reference set")

// Store is a reference set opened as a Store; its ID is the reference
// file's URL (the folder's for Parquet).
type Store struct {
	*targets.Store // Get, GetRange, List and their versions

	dir  objectstore.Store // holds the reference set
	name string            // the JSON file's key in dir; "" for a Parquet folder
	tg   *targets.Resolver

	mu  sync.Mutex // serialises Refresh
	cur atomic.Pointer[state]
}

type state struct {
	refs    refSet
	version string // of the reference file (.zmetadata for Parquet)
}

var (
	_ objectstore.Store      = (*Store)(nil)
	_ objectstore.Refresher  = (*Store)(nil)
	_ objectstore.Localer    = (*Store)(nil)
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
	s := &Store{dir: dir, name: name, tg: opts.Targets}
	id := strings.TrimSuffix(dir.ID(), "/")
	if name != "" {
		id += "/" + name
	}
	s.Store = targets.NewStore(id, s.tg, func() targets.Index { return index{s.cur.Load().refs} })
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
		doc, ver, err = v.GetVersion(ctx, key, nil, maxReferenceFile)
	} else {
		doc, err = objectstore.GetLimit(ctx, s.dir, key, maxReferenceFile)
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

// Local reports whether every target the references name is a local file,
// so that callers need not keep a second copy of their bytes. A Parquet
// set knows the targets of the record files read so far only: at open,
// none, so it reports true whatever its targets are.
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
	return s.dir.Close()
}

// index serves a reference set's keys to targets.Store.
type index struct{ refs refSet }

func (x index) ref(r ref) targets.Ref {
	if r.inline() {
		return targets.Ref{Inline: true, Data: r.data}
	}
	return targets.Ref{URL: x.refs.url(r.url), Off: r.off, N: r.n}
}

func (x index) Lookup(ctx context.Context, key string) (targets.Ref, bool, error) {
	r, ok, err := x.refs.lookup(ctx, key)
	if !ok || err != nil {
		return targets.Ref{}, false, err
	}
	return x.ref(r), true, nil
}

func (x index) Children(ctx context.Context, dir string) ([]string, error) {
	return x.refs.children(ctx, dir)
}

func (x index) Each(ctx context.Context, prefix string, fn func(string, targets.Ref)) error {
	return x.refs.each(ctx, prefix, func(key string, r ref) { fn(key, x.ref(r)) })
}
