// Package targets resolves the URLs that virtual stores (kerchunk
// references, Icechunk virtual chunks) point into, and reads byte ranges of
// the objects they name: local files inside the allowed folders, and
// objects of the remote stores the caller knows how to open (s3://, gs://,
// https://...), each opened once and shared, and only where the caller's
// Scope allows (scope.go). Store is what the virtual
// stores share: a versioned objectstore.Store over an Index, the format's
// map from keys to inline bytes or target ranges.
//
// A Resolver adds no request limit of its own: the target stores bound
// their requests in flight (MaxInFlight of S3, GCS and HTTP), and zarr
// bounds the fetches of each read. A Resolver is safe for concurrent use.
package targets

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/zarrfs/zarrfs/objectstore"
)

// Opener opens the store rooted at a URL root such as "s3://bucket",
// "gs://bucket" or "https://host:port" (scheme, "://" and authority; no
// path). Keys of the store are the URL's path without its leading "/".
type Opener func(ctx context.Context, root string) (objectstore.Store, error)

// Openers maps a URL scheme ("s3", "gs", "https", "http") to its Opener.
// Adding a kind of remote store is one entry. Local files ("file" URLs and
// absolute paths) are read by the Resolver itself, within LocalRoot.
type Openers map[string]Opener

// ErrScheme is returned (wrapped) for a URL whose scheme no Opener reads.
var ErrScheme = errors.New("URL scheme not read by zarrfs")

// ErrTargetMissing is returned (wrapped) when the object a reference
// points to does not exist. It is not objectstore.ErrNotFound: the key that
// holds the reference exists, and must fail, not read as a missing chunk.
var ErrTargetMissing = errors.New("target does not exist")

// Options configures New. The zero value reads no local file and no
// remote store.
type Options struct {
	// Openers open the remote stores, by scheme.
	Openers Openers
	// Aliases maps a scheme to another ("gcs" to "gs", "s3a" to "s3"),
	// as fsspec spells them.
	Aliases map[string]string
	// Scope is where targets may lie (scope.go): every target is checked
	// against it before any store is opened or asked.
	Scope Scope
	// FollowSymlinks lets symbolic links found inside a local place of
	// the Scope lead out of it, as a local store's --follow-symlinks lets
	// its links leave it (files in a git-annex or DVC cache). It never
	// widens the Scope: a target's own path must lie in it.
	FollowSymlinks bool
	// Base resolves relative URLs: a directory URL ("s3://b/refs") or a
	// local directory path. "" refuses relative URLs.
	Base string
}

// Target is one object a reference points to.
type Target struct {
	Store objectstore.Store
	Key   string
	URL   string // as resolved (absolute), for messages
}

// Resolver resolves URLs to Targets and reads them.
type Resolver struct {
	opts   Options
	places []place

	stores Kept[objectstore.Store] // by root ("file://FOLDER" for a local place), each opened once
}

// New returns a Resolver. Close releases the stores it opened.
func New(opts Options) (*Resolver, error) {
	places, err := parsePlaces(opts.Scope.Places)
	if err != nil {
		return nil, err
	}
	return &Resolver{opts: opts, places: places}, nil
}

// Close releases the stores the Resolver opened.
func (r *Resolver) Close() error {
	for _, s := range r.stores.Drain() {
		s.Close()
	}
	return nil
}

// Absolute returns raw as an absolute URL or path: relative ones are
// joined to Options.Base.
func (r *Resolver) Absolute(raw string) (string, error) {
	if raw == "" {
		return "", fmt.Errorf("empty URL")
	}
	if scheme(raw) != "" || strings.HasPrefix(raw, "/") {
		return raw, nil
	}
	base := r.opts.Base
	if base == "" {
		return "", fmt.Errorf("%s: relative URL and no base to resolve it against", raw)
	}
	if scheme(base) == "" || scheme(base) == "file" {
		b := strings.TrimPrefix(base, "file://")
		return filepath.Join(b, filepath.FromSlash(raw)), nil
	}
	return strings.TrimSuffix(base, "/") + "/" + path.Clean(raw), nil
}

// IsLocal reports whether raw (resolved against the base) names a local
// file.
func (r *Resolver) IsLocal(raw string) bool {
	abs, err := r.Absolute(raw)
	if err != nil {
		return false
	}
	s := scheme(abs)
	return s == "" || s == "file"
}

// scheme returns the lower-case scheme of a URL, "" for a path. A Windows
// drive letter is no scheme (it never reaches here, but "c:x" must not
// read as one).
func scheme(raw string) string {
	i := strings.Index(raw, "://")
	if i <= 1 {
		return ""
	}
	s := strings.ToLower(raw[:i])
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') {
			return ""
		}
	}
	return s
}

// Resolve returns the Target raw names, opening its store on first use.
// A target outside the Scope is refused (a *ScopeError) before any store
// is opened or asked.
func (r *Resolver) Resolve(ctx context.Context, raw string) (Target, error) {
	abs, err := r.Absolute(raw)
	if err != nil {
		return Target{}, err
	}
	s := scheme(abs)
	if a, ok := r.opts.Aliases[s]; ok {
		abs = a + abs[len(s):]
		s = a
	}
	if s == "" || s == "file" {
		return r.resolveLocal(ctx, abs)
	}
	op, ok := r.opts.Openers[s]
	if !ok {
		return Target{}, fmt.Errorf("%s: %w (%q)", redact(abs), ErrScheme, s)
	}
	rest := abs[len(s)+3:]
	host, key, _ := strings.Cut(rest, "/")
	if host == "" || strings.Contains(host, "@") {
		return Target{}, fmt.Errorf("%s: want %s://HOST/PATH without credentials", redact(abs), s)
	}
	if key, err = objectstore.CleanKey(key, false); err != nil {
		return Target{}, fmt.Errorf("%s: %w", redact(abs), err)
	}
	origin, _, err := splitURL(s + "://" + host + "/")
	if err != nil {
		return Target{}, fmt.Errorf("%s: %w", redact(abs), err)
	}
	if err := r.checkRemote(abs, origin, key); err != nil {
		return Target{}, err
	}
	st, err := r.stores.Get(ctx, origin, func(ctx context.Context) (objectstore.Store, error) { return op(ctx, origin) })
	if err != nil {
		return Target{}, fmt.Errorf("%s: %w", origin, err)
	}
	return Target{Store: st, Key: key, URL: abs}, nil
}

// redact drops what a URL may carry besides scheme, host and path.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" {
		u.User = nil
		u.RawQuery = ""
		u.Fragment = ""
		return u.String()
	}
	return raw
}

func (r *Resolver) resolveLocal(ctx context.Context, abs string) (Target, error) {
	p := abs
	if strings.HasPrefix(p, "file://") {
		u, err := url.Parse(p)
		if err != nil {
			return Target{}, fmt.Errorf("%s: %w", abs, err)
		}
		if u.Host != "" && u.Host != "localhost" {
			return Target{}, fmt.Errorf("%s: file URL of another host", abs)
		}
		p = u.Path
	}
	if !filepath.IsAbs(p) {
		return Target{}, fmt.Errorf("%s: not an absolute path", abs)
	}
	p = filepath.Clean(p)
	dir, err := r.localPlace(p)
	if err != nil {
		return Target{}, err
	}
	rel, _ := filepath.Rel(dir, p)
	st, err := r.stores.Get(ctx, "file://"+dir, func(context.Context) (objectstore.Store, error) {
		s, err := objectstore.OpenPosixOptions(dir, objectstore.PosixOptions{FollowSymlinks: r.opts.FollowSymlinks})
		if err != nil {
			return nil, err
		}
		return s, nil
	})
	if err != nil {
		return Target{}, err
	}
	return Target{Store: st, Key: filepath.ToSlash(rel), URL: "file://" + p}, nil
}

// Read reads length bytes at off of t (length < 0: the whole object, of at
// most limit bytes, 0: objectstore.DefaultSizeLimit) and the version of
// the object they came from ("" from a store that cannot tell). A missing
// object is ErrTargetMissing.
func (r *Resolver) Read(ctx context.Context, t Target, off, length, limit int64) ([]byte, string, error) {
	var b []byte
	var ver string
	var err error
	if length < 0 {
		if v, ok := objectstore.AsVersioned(t.Store); ok {
			b, ver, err = v.GetVersion(ctx, t.Key, nil, limit)
		} else {
			b, err = objectstore.GetLimit(ctx, t.Store, t.Key, limit)
		}
	} else {
		b, ver, err = getRange(ctx, t, off, length)
	}
	if objectstore.IsNotFound(err) {
		err = fmt.Errorf("%w: %v", ErrTargetMissing, err)
	}
	return b, ver, err
}

// Versions returns the current version of every target in ts (by index;
// "" where the store cannot tell), and for each missing one
// the error in errs (ErrTargetMissing for one that does not exist). Local targets are asked one by one (a stat
// each); a remote store is listed once per directory the targets lie in.
func (r *Resolver) Versions(ctx context.Context, ts []Target) (vers []string, errs []error, err error) {
	vers = make([]string, len(ts))
	errs = make([]error, len(ts))
	type dirKey struct {
		s   objectstore.Store
		dir string
	}
	listed := map[dirKey]map[string]string{}
	var mu sync.Mutex
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, t := range ts {
		// A decorator (retry, breaker) is a VersionStater whatever it
		// wraps: ask only one whose store can answer (an S3 target lists).
		if st, ok := objectstore.AsVersionStater(t.Store); ok {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				v, e := st.StatVersion(ctx, t.Key)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case objectstore.IsNotFound(e):
					errs[i] = fmt.Errorf("%s: %w", t.URL, ErrTargetMissing)
				case e != nil:
					// This target fails its own reads; the others list.
					errs[i] = fmt.Errorf("%s: %w", t.URL, e)
				default:
					vers[i] = v
				}
			}()
			continue
		}
		v, ok := objectstore.AsVersioned(t.Store)
		if !ok {
			continue
		}
		dk := dirKey{t.Store, path.Dir(t.Key)}
		if dk.dir == "." {
			dk.dir = ""
		}
		m, ok := listed[dk]
		if !ok {
			m = map[string]string{}
			if e := v.ListVersions(ctx, dk.dir, func(k, ver string) { m[k] = ver }); e != nil {
				wg.Wait()
				return nil, nil, e
			}
			listed[dk] = m
		}
		if ver, ok := m[t.Key]; ok {
			vers[i] = ver
		} else {
			errs[i] = fmt.Errorf("%s: %w", t.URL, ErrTargetMissing)
		}
	}
	wg.Wait()
	return vers, errs, nil
}

func getRange(ctx context.Context, t Target, off, n int64) ([]byte, string, error) {
	if v, ok := objectstore.AsVersioned(t.Store); ok {
		return v.GetRangeVersion(ctx, t.Key, off, n)
	}
	b, err := t.Store.GetRange(ctx, t.Key, off, n)
	if err == nil && int64(len(b)) != n {
		err = fmt.Errorf("%s: %d bytes for a %d-byte range", t.URL, len(b), n)
	}
	return b, "", err
}
