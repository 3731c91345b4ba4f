package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Versioned is an optional upgrade of a Store that names the version of
// every object it reads and lists objects with their versions, so that a
// cache can tell an unchanged object from one rewritten in place without
// reading it again. A version is an opaque, non-empty string that changes
// whenever the object's bytes may have changed: S3's ETag, a local file's
// size, modification time, inode and change time. The version a read
// reports and the one a listing reports for the same object state are
// equal.
//
// Use AsVersioned to get one: a decorator may implement the methods while
// the store it wraps cannot tell versions.
type Versioned interface {
	// GetVersion reads a whole object into buf (grown when too small), as
	// GetterInto does (limit included), and returns the version of the
	// bytes it read, taken from the same response: no extra request.
	GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error)
	// GetRangeVersion reads a byte range as GetRange does, and returns the
	// version of the object the range belongs to.
	GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error)
	// ListVersions calls fn with the key and version of every object below
	// prefix (a "directory" key; "" for the whole store), at any depth, in
	// no particular order. A prefix with nothing below it lists nothing.
	ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error
}

// VersionStater is an optional upgrade of a Versioned store for which
// asking one object's version is cheaper than listing (a local
// filesystem: one stat, against reading every directory): StatVersion
// returns the version of the object at key, as a read would report it, or
// an ErrNotFound error. A listing of such a store is made lazily, key by
// key.
type VersionStater interface {
	StatVersion(ctx context.Context, key string) (string, error)
}

// AsVersioned returns s as a Versioned store, when it can tell versions.
func AsVersioned(s Store) (Versioned, bool) {
	if d, ok := s.(interface{ versioned() bool }); ok && !d.versioned() {
		return nil, false
	}
	v, ok := s.(Versioned)
	return v, ok
}

// Posix versions: size, modification time (ns), inode and change time
// (ns). The change time is what makes a rewrite show when the other three
// stay: a file rewritten in place with bytes of the same length whose
// modification time is then restored (touch -d, cp -p, tar x, rsync -t,
// or two writes within one timestamp tick) keeps its size, mtime and
// inode, but every write and every utimes moves its ctime, which no user
// can set. A chmod, chown or new hard link moves it too: such a file is
// read again once, never served stale.

var _ Versioned = (*Posix)(nil)

func posixVersion(fi fs.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return statVersion(st.Size, st.Mtim.Sec*1e9+st.Mtim.Nsec, st.Ino, st.Ctim.Sec*1e9+st.Ctim.Nsec)
	}
	return strconv.FormatInt(fi.Size(), 10) + "-" + strconv.FormatInt(fi.ModTime().UnixNano(), 10)
}

// statVersion is a local file's version: size-mtime-inode-ctime, times in
// nanoseconds. The modification time stays second, where Icechunk's check
// of a virtual chunk's target reads it.
func statVersion(size, mtime int64, ino uint64, ctime int64) string {
	b := make([]byte, 0, 64)
	b = strconv.AppendInt(b, size, 10)
	b = append(b, '-')
	b = strconv.AppendInt(b, mtime, 10)
	b = append(b, '-')
	b = strconv.AppendUint(b, ino, 10)
	b = append(b, '-')
	b = strconv.AppendInt(b, ctime, 10)
	return string(b)
}

// GetVersion reads a whole object and its version (from the descriptor it
// read through).
func (p *Posix) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	f, st, k, err := p.openWhole(ctx, key, limit)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	n := int(st.Size())
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, "", p.wrap("get", k, err)
	}
	return buf, posixVersion(st), nil
}

// openWhole opens key for a read of the whole object of at most limit
// bytes: the file, its stat, the cleaned key, or the error to return.
func (p *Posix) openWhole(ctx context.Context, key string, limit int64) (*os.File, os.FileInfo, string, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return nil, nil, "", &Error{Op: "get", Store: p.id, Key: key, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, "", p.wrap("get", k, err)
	}
	f, st, err := p.open(k)
	if err != nil {
		return nil, nil, "", p.wrap("get", k, err)
	}
	if err := checkSize(limit, st.Size()); err != nil {
		f.Close()
		return nil, nil, "", p.wrap("get", k, err)
	}
	return f, st, k, nil
}

var _ pieceReader = (*Posix)(nil)

// getVersionPieces is GetVersion a piece at a time (see pieceReader).
func (p *Posix) getVersionPieces(ctx context.Context, key string, piece []byte, limit int64, put func(b []byte, off, size int64) error) (string, error) {
	f, st, k, err := p.openWhole(ctx, key, limit)
	if err != nil {
		return "", err
	}
	defer f.Close()
	size := st.Size()
	if size == 0 {
		if err := put(nil, 0, 0); err != nil {
			return "", err
		}
	}
	for off := int64(0); off < size; {
		b := piece[:min(int64(len(piece)), size-off)]
		if _, err := io.ReadFull(f, b); err != nil {
			return "", p.wrap("get", k, err)
		}
		if err := put(b, off, size); err != nil {
			return "", err
		}
		off += int64(len(b))
	}
	return posixVersion(st), nil
}

// GetRangeVersion reads a byte range and the version of its file.
func (p *Posix) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return nil, "", &Error{Op: "get range", Store: p.id, Key: key, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, "", p.wrap("get range", k, err)
	}
	if length < 0 {
		return nil, "", p.wrap("get range", k, fmt.Errorf("negative length %d", length))
	}
	f, st, err := p.open(k)
	if err != nil {
		return nil, "", p.wrap("get range", k, err)
	}
	defer f.Close()
	size := st.Size()
	if off < 0 {
		off = size - length
	}
	if off < 0 || off+length > size {
		return nil, "", p.wrap("get range", k, fmt.Errorf("%w: %d+%d past end of object (size %d)", ErrRange, off, length, size))
	}
	buf := make([]byte, length)
	if _, err := f.ReadAt(buf, off); err != nil && !(err == io.EOF && length == 0) {
		return nil, "", p.wrap("get range", k, err)
	}
	return buf, posixVersion(st), nil
}

var _ VersionStater = (*Posix)(nil)

// StatVersion returns the version of the file at key (following symbolic
// links inside the store, as a read does).
func (p *Posix) StatVersion(ctx context.Context, key string) (string, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return "", &Error{Op: "stat", Store: p.id, Key: key, Err: err}
	}
	if !p.follow {
		if v, err, ok := p.statBeneath(k); ok {
			if err != nil {
				return "", p.wrap("stat", k, err)
			}
			return v, nil
		}
	}
	fi, err := p.stat(k)
	switch {
	case err != nil:
		return "", p.wrap("stat", k, err)
	case fi.IsDir():
		return "", p.wrap("stat", k, ErrNotFound)
	case !fi.Mode().IsRegular():
		return "", p.wrap("stat", k, fmt.Errorf("not a regular file (%s)", fi.Mode().Type()))
	}
	return posixVersion(fi), nil
}

// statBeneath stats k with one openat2 confined to the store's directory
// (RESOLVE_BENEATH: no "..", no link, no absolute path leads out of it),
// three system calls where os.Root's walk takes two per path element:
// listing a chunk of a v3 store four levels down is most of what checking a
// warm blob costs. ok is false where openat2 is not available.
func (p *Posix) statBeneath(k string) (v string, err error, ok bool) {
	p.beneath.Do(func() {
		fd, err := unix.Open(p.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			p.dirfd = fd
		} else {
			p.dirfd = -1
		}
	})
	if p.dirfd < 0 {
		return "", nil, false
	}
	fd, err := unix.Openat2(p.dirfd, k, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM):
		return "", nil, false // no openat2 (old kernel, seccomp)
	case errors.Is(err, unix.EXDEV):
		return "", ErrOutsideStore, true
	case err != nil:
		return "", err, true
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err, true
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return "", ErrNotFound, true
	default:
		return "", fmt.Errorf("not a regular file (mode %o)", st.Mode), true
	}
	return statVersion(st.Size, st.Mtim.Sec*1e9+st.Mtim.Nsec, st.Ino, st.Ctim.Sec*1e9+st.Ctim.Nsec), nil, true
}

// ListVersions walks the directory tree below prefix. Symbolic links to
// files are listed with the version of the file they name, as a read sees
// it; links to directories are not followed.
func (p *Posix) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	k, err := CleanKey(prefix, true)
	if err != nil {
		return &Error{Op: "list", Store: p.id, Key: prefix, Err: err}
	}
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		if err := ctx.Err(); err != nil {
			return p.wrap("list", dir, err)
		}
		name := dir
		if name == "" {
			name = "."
		}
		f, err := p.root.Open(name)
		if err != nil {
			return err
		}
		ents, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return err
		}
		for _, e := range ents {
			key := e.Name()
			if dir != "" {
				key = dir + "/" + key
			}
			switch {
			case e.IsDir():
				if depth < 64 {
					if err := walk(key, depth+1); err != nil {
						return err
					}
				}
			case e.Type().IsRegular():
				fi, err := e.Info()
				if err != nil {
					continue // removed meanwhile
				}
				fn(key, posixVersion(fi))
			case e.Type()&os.ModeSymlink != 0:
				fi, err := p.stat(key)
				if err == nil && fi.Mode().IsRegular() {
					fn(key, posixVersion(fi))
				}
			}
		}
		return nil
	}
	err = walk(k, 0)
	if err != nil && (k != "" && isNotExist(err)) {
		return nil // nothing below the prefix
	}
	if err != nil {
		return p.wrap("list", path.Clean("/" + k)[1:], err)
	}
	return nil
}

// stat follows links as open does: within the store, or anywhere with
// FollowSymlinks.
func (p *Posix) stat(k string) (os.FileInfo, error) {
	if p.follow {
		return os.Stat(filepath.Join(p.dir, filepath.FromSlash(k)))
	}
	return p.root.Stat(k)
}

func isNotExist(err error) bool {
	return os.IsNotExist(err) || err == syscall.ENOTDIR
}

// S3 versions are ETags: both a GET's response and a listing carry them.

var _ Versioned = (*S3)(nil)

func s3Version(etag string) string { return "etag:" + etag }

// ListVersions lists every object below prefix with one recursive listing
// (one request per thousand objects).
func (s *S3) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	k, err := CleanKey(prefix, true)
	if err != nil {
		return &Error{Op: "list", Store: s.id, Key: prefix, Err: err}
	}
	if err := s.listVersions(ctx, k, fn); err != nil {
		return &Error{Op: "list", Store: s.id, Key: k, Err: err}
	}
	return nil
}

// The Retry and Breaker decorators pass versioned reads and listings through
// their do, as they do plain ones: Retry retries them (a listing that fails
// midway is started over; fn may then see a key twice), Breaker gates them.

// via runs versioned operations on inner through a decorator's do.
type via struct {
	inner Store
	do    func(ctx context.Context, op, key string, f func(ctx context.Context) error) error
}

func (w via) versioned() (Versioned, bool) { return AsVersioned(w.inner) }

func (w via) getVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	v, ok := w.versioned()
	if !ok {
		return nil, "", &Error{Op: "get", Store: w.inner.ID(), Key: key, Err: errNotVersioned}
	}
	var out []byte
	var ver string
	err := w.do(ctx, "get", key, func(ctx context.Context) (err error) {
		out, ver, err = v.GetVersion(ctx, key, buf, limit)
		return err
	})
	return out, ver, err
}

func (w via) getRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	v, ok := w.versioned()
	if !ok {
		return nil, "", &Error{Op: "get range", Store: w.inner.ID(), Key: key, Err: errNotVersioned}
	}
	var out []byte
	var ver string
	err := w.do(ctx, "get range", key, func(ctx context.Context) (err error) {
		out, ver, err = v.GetRangeVersion(ctx, key, off, length)
		return err
	})
	return out, ver, err
}

func (w via) listVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	v, ok := w.versioned()
	if !ok {
		return &Error{Op: "list", Store: w.inner.ID(), Key: prefix, Err: errNotVersioned}
	}
	return w.do(ctx, "list", prefix, func(ctx context.Context) error {
		return v.ListVersions(ctx, prefix, fn)
	})
}

var errNotVersioned = fmt.Errorf("store cannot tell object versions")

// GetVersion retries the inner store's GetVersion.
func (r *Retry) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	return via{r.Store, r.do}.getVersion(ctx, key, buf, limit)
}

// GetRangeVersion retries the inner store's GetRangeVersion.
func (r *Retry) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	return via{r.Store, r.do}.getRangeVersion(ctx, key, off, length)
}

// ListVersions retries the inner store's ListVersions.
func (r *Retry) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	return via{r.Store, r.do}.listVersions(ctx, prefix, fn)
}

// GetVersion forwards to the inner store's GetVersion through the breaker.
func (b *Breaker) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	return via{b.Store, b.do}.getVersion(ctx, key, buf, limit)
}

// GetRangeVersion forwards to the inner store's GetRangeVersion through the breaker.
func (b *Breaker) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	return via{b.Store, b.do}.getRangeVersion(ctx, key, off, length)
}

// ListVersions forwards to the inner store's ListVersions through the breaker.
func (b *Breaker) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	return via{b.Store, b.do}.listVersions(ctx, prefix, fn)
}

// AsVersionStater returns s as a VersionStater, when it can ask one
// object's version: a decorator implements StatVersion whatever the store
// it wraps, and answers here only when that store can.
func AsVersionStater(s Store) (VersionStater, bool) {
	if d, ok := s.(interface{ statesVersions() bool }); ok && !d.statesVersions() {
		return nil, false
	}
	v, ok := s.(VersionStater)
	return v, ok
}

// ListingPager is an optional upgrade of a store that can both list with
// versions and ask one object's version (GCS): ObjectsPerListing is how
// many objects one listing request returns. Listing a prefix of more
// objects than that costs more requests than asking, one by one, the
// versions a reader needs of it, so a reader of a few chunks of a large
// array asks (VersionStater) rather than lists. A VersionStater without it
// is always asked.
type ListingPager interface {
	ObjectsPerListing() int
}

// ObjectsPerListing returns what s's ListingPager says, or 0 when s (or
// the store it decorates) has none.
func ObjectsPerListing(s Store) int {
	for {
		if p, ok := s.(ListingPager); ok {
			return p.ObjectsPerListing()
		}
		if s = Unwrap(s); s == nil {
			return 0
		}
	}
}

func (w via) stater() (VersionStater, bool) { return AsVersionStater(w.inner) }

func (w via) statVersion(ctx context.Context, key string) (string, error) {
	st, ok := w.stater()
	if !ok {
		return "", &Error{Op: "stat", Store: w.inner.ID(), Key: key, Err: errNotVersioned}
	}
	var ver string
	err := w.do(ctx, "stat", key, func(ctx context.Context) (err error) {
		ver, err = st.StatVersion(ctx, key)
		return err
	})
	return ver, err
}

// StatVersion retries the inner store's StatVersion.
func (r *Retry) StatVersion(ctx context.Context, key string) (string, error) {
	return via{r.Store, r.do}.statVersion(ctx, key)
}

// StatVersion forwards to the inner store's StatVersion through the breaker.
func (b *Breaker) StatVersion(ctx context.Context, key string) (string, error) {
	return via{b.Store, b.do}.statVersion(ctx, key)
}

// TrustMetadata wraps s so that it tells no versions: whoever reads
// through it (zarr, the cache) then takes the metadata's hash as the
// version of every chunk, asks for no version and lists nothing, and a
// chunk rewritten in place under unchanged metadata is not noticed. It is
// for archives that never rewrite a chunk (they only append, or never
// change): a chunk then costs exactly its read.
func TrustMetadata(s Store) Store { return &trusting{decorator{s}} }

type trusting struct{ decorator }

func (t *trusting) versioned() bool      { return false }
func (t *trusting) statesVersions() bool { return false }

// GetInto forwards to the inner store's GetInto (or Get).
func (t *trusting) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	return t.getInto(ctx, key, buf, limit)
}

// DescribeVersions says in one line how s tells a chunk rewritten in place
// and what that costs a reader (for `zarrfs inspect`): what the versions
// are, and whether they come from listings, one request per chunk, or not
// at all. An HTTP store says what its server's responses carried so far.
func DescribeVersions(s Store) string {
	_, versioned := AsVersioned(s)
	_, states := AsVersionStater(s)
	inner := s
	for {
		u := Unwrap(inner)
		if u == nil {
			break
		}
		inner = u
	}
	if !versioned {
		if _, local := inner.(*Posix); local {
			return "none"
		}
		return "the metadata's (--chunk-versions metadata): a chunk rewritten in place under unchanged metadata is not noticed; no request beyond the reads"
	}
	const trust = "; --chunk-versions metadata saves it for archives that never rewrite a chunk"
	// A first read takes each chunk's version from the response that
	// fetches it; a file cached before is revalidated by asking.
	revalidated := func(ask string) string {
		return "from the response of each chunk read; a file cached before costs " + ask + " per chunk the first time it is opened after each --metadata-ttl"
	}
	switch st := inner.(type) {
	case *Posix:
		return "size, modification time, inode and change time, one stat per chunk before it is read (a first read too), and per chunk of a file cached before the first time it is opened after each --metadata-ttl"
	case *S3:
		return "ETag, from one listing per array read (a thousand chunks per request)"
	case *GCS:
		return fmt.Sprintf("object generation: listed for arrays of up to %d chunks, else %s%s", st.ObjectsPerListing(), revalidated("one metadata request"), trust)
	case *HTTP:
		switch st.Validators() {
		case "etag":
			return "ETag, " + revalidated("one HEAD") + trust
		case "last-modified":
			return "Last-Modified, to the second, and size (a rewrite of a chunk within the second it was read that keeps its size is not noticed), " + revalidated("one HEAD") + trust
		case "none":
			return "none: the server sends neither ETag nor Last-Modified, so a chunk rewritten in place is not noticed (--chunk-versions metadata says so and saves a HEAD per chunk of a cached file)"
		case "":
			return "ETag or Last-Modified, as the server sends them, " + revalidated("one HEAD") + trust
		}
		return "ETag or Last-Modified (the server sends " + st.Validators() + "), " + revalidated("one HEAD") + trust
	}
	if states {
		return "from the response of each chunk read, asked once per chunk of a file cached before"
	}
	return "listed per array read"
}
