// Package objectstore reads the objects of a Zarr store: whole keys, byte
// ranges of keys, and the children of a prefix. It knows nothing of Zarr.
//
// Every Store is safe for concurrent use by many goroutines. Keys are
// "/"-separated paths relative to the store's root ("t/zarr.json",
// "t/c/0/0/0"); a Store refuses keys that would leave that root.
package objectstore

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
)

// ErrNotFound is returned (wrapped) when a key does not exist. Zarr reads a
// missing chunk as its fill value, so this error class must stay distinct
// from every other failure: a permission error or a timeout is never
// ErrNotFound.
var ErrNotFound = errors.New("not found")

// ErrInvalidKey is returned (wrapped) for a key that is empty, absolute, or
// escapes the store root.
var ErrInvalidKey = errors.New("invalid key")

// ErrTooLarge is returned (wrapped) by Get, GetInto and GetVersion for an
// object larger than the request's size limit (their limit argument, or
// DefaultSizeLimit): the object is refused before its bytes are read or
// its buffer allocated. It is permanent.
var ErrTooLarge = errors.New("object larger than expected")

// DefaultSizeLimit bounds the objects Get reads, and GetInto and
// GetVersion when given no limit of their own (0): so that no object a
// store holds can make a reader allocate without bound.
const DefaultSizeLimit = 2 << 30

// SizeLimit is the size limit a whole-object read given limit applies:
// limit, or DefaultSizeLimit for 0 (or less).
func SizeLimit(limit int64) int64 {
	if limit > 0 {
		return limit
	}
	return DefaultSizeLimit
}

func checkSize(limit, size int64) error {
	if lim := SizeLimit(limit); size > lim {
		return fmt.Errorf("%w: %d bytes, at most %d expected", ErrTooLarge, size, lim)
	}
	return nil
}

// GetLimit reads a whole object of s, refusing one larger than limit
// bytes (0: DefaultSizeLimit) with ErrTooLarge: before reading it where s
// reads into a buffer (GetterInto), else once read.
func GetLimit(ctx context.Context, s Store, key string, limit int64) ([]byte, error) {
	if gi, ok := s.(GetterInto); ok {
		return gi.GetInto(ctx, key, nil, limit)
	}
	b, err := s.Get(ctx, key)
	if err == nil {
		err = checkSize(limit, int64(len(b)))
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Store is the read-only interface every source implements.
type Store interface {
	// Get returns the whole object.
	Get(ctx context.Context, key string) ([]byte, error)
	// GetRange returns length bytes starting at off. With off < 0 it returns
	// the last length bytes of the object (a suffix range, as HTTP
	// "bytes=-N"), which is how a shard index at the end is read without
	// knowing the shard's size. A range that runs past the end of the
	// object is an error: callers know the sizes they ask for.
	GetRange(ctx context.Context, key string, off, length int64) ([]byte, error)
	// List returns the names of the immediate children of the prefix
	// (a "directory" key, with or without a trailing "/"), sorted; names of
	// children that have children of their own end in "/".
	List(ctx context.Context, prefix string) ([]string, error)
	// ID identifies the source for cache keys and messages, such as
	// "file:///data/era5.zarr" or "s3://bucket/era5.zarr". It never holds
	// secrets.
	ID() string
	// Close releases what the store holds (idle connections, a root
	// directory, a breaker's probe, the stores a virtual store reads
	// through); a decorator closes the store it wraps, so closing the
	// outermost store closes its chain. Requests after Close may fail.
	Close() error
}

// GetterInto is an optional upgrade of a Store: GetInto reads a whole
// object into buf (grown when too small) and returns the filled slice, so
// that hot paths reuse memory instead of allocating per chunk. An object
// larger than limit bytes (0: DefaultSizeLimit) is refused with
// ErrTooLarge before its bytes are read. Errors are those of Get.
type GetterInto interface {
	GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error)
}

// Identifier is an optional upgrade of a Store whose ID alone does not
// tell two sources apart (the same bucket and prefix on two S3 endpoints).
// Identity names the source for cache keys; it never holds secrets.
type Identifier interface {
	Identity() string
}

// Identity returns s's Identity when it has one, else its ID.
func Identity(s Store) string {
	if i, ok := s.(Identifier); ok {
		return i.Identity()
	}
	return s.ID()
}

// Wrapper is implemented by decorators (retry, deadline, breaker): Unwrap
// returns the store decorated.
type Wrapper interface {
	Unwrap() Store
}

// Unwrap returns the store a decorator wraps (Wrapper), or nil.
func Unwrap(s Store) Store {
	if u, ok := s.(Wrapper); ok {
		return u.Unwrap()
	}
	return nil
}

// Refresher is an optional upgrade of a virtual store (a reference set, a
// repository branch): Refresh reads what it serves again (the reference
// file, the branch's head) if that changed, and reports whether it did.
// On error the store keeps serving what it served.
type Refresher interface {
	Refresh(ctx context.Context) (bool, error)
}

// Localer is an optional upgrade of a virtual store: Local reports
// whether every object it serves lies in local files (so a caller need
// not keep a second copy of their bytes), whatever store it reads its
// references from.
type Localer interface {
	Local() bool
}

// IsLocal reports whether s reads the local filesystem (a Posix store,
// whatever decorators wrap it).
func IsLocal(s Store) bool {
	for ; s != nil; s = Unwrap(s) {
		if _, ok := s.(*Posix); ok {
			return true
		}
	}
	return false
}

// Error carries the store, key and operation that failed.
type Error struct {
	Op    string // "get", "get range", "list"
	Store string // Store.ID()
	Key   string
	Err   error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s/%s: %s: %v", strings.TrimSuffix(e.Store, "/"), e.Key, e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// IsNotFound reports whether err means the key does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// CleanKey validates a key and returns it in canonical form (no leading or
// trailing slash, no "." segments). Keys holding "..", backslashes, NUL
// bytes or absolute paths are refused with ErrInvalidKey. The empty key ""
// names the root and is allowed only when allowRoot is set (for List).
func CleanKey(key string, allowRoot bool) (string, error) {
	k := strings.TrimSuffix(key, "/")
	if k == "" || k == "." {
		if allowRoot {
			return "", nil
		}
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if strings.HasPrefix(k, "/") || strings.ContainsAny(k, "\\\x00") {
		return "", fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	for _, seg := range strings.Split(k, "/") {
		if seg == ".." {
			return "", fmt.Errorf("%w: %q leaves the store root", ErrInvalidKey, key)
		}
	}
	c := path.Clean(k)
	if c == "." {
		if allowRoot {
			return "", nil
		}
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	return c, nil
}
