package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// Posix is a Store over a directory of the local filesystem. Every access
// goes through an os.Root, so neither a key nor a symbolic link inside the
// store can reach a file outside it (ErrOutsideStore), unless the store was
// opened with FollowSymlinks.
type Posix struct {
	root   *os.Root
	id     string
	dir    string // absolute path of the root
	follow bool

	beneath sync.Once // opens dirfd for StatVersion
	dirfd   int
}

var _ Store = (*Posix)(nil)

// ErrOutsideStore is returned (wrapped) for a key that resolves, through a
// symbolic link, to a file outside the store. It is permanent.
var ErrOutsideStore = errors.New("symbolic link leaves the store (--follow-symlinks reads it)")

// PosixOptions configures OpenPosixOptions. The zero value confines every
// access to the store's directory.
type PosixOptions struct {
	// FollowSymlinks follows symbolic links wherever they point, as
	// zarr-python does: stores whose chunks are links into an annex (git
	// annex, DVC) read through them. Keys themselves still cannot leave the
	// store.
	FollowSymlinks bool
}

// OpenPosix opens the store rooted at dir (a path or a file:// URL),
// confined to it.
func OpenPosix(dir string) (*Posix, error) { return OpenPosixOptions(dir, PosixOptions{}) }

// OpenPosixOptions opens the store rooted at dir with opts.
func OpenPosixOptions(dir string, opts PosixOptions) (*Posix, error) {
	if strings.HasPrefix(dir, "file://") {
		u, err := url.Parse(dir)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		dir = u.Path
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: no such directory", abs)
		}
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s: not a directory", abs)
	}
	r, err := os.OpenRoot(abs)
	if err != nil {
		return nil, err
	}
	return &Posix{root: r, id: "file://" + abs, dir: abs, follow: opts.FollowSymlinks}, nil
}

// ID returns the file:// URL of the store root.
func (p *Posix) ID() string { return p.id }

// Close releases the root directory handle.
func (p *Posix) Close() error {
	p.beneath.Do(func() { p.dirfd = -1 })
	if p.dirfd >= 0 {
		syscall.Close(p.dirfd)
		p.dirfd = -1
	}
	return p.root.Close()
}

func (p *Posix) wrap(op, key string, err error) error {
	// ENOTDIR: a key below an object ("a/zarr.json/x") does not exist either,
	// as S3 reports it; it must not read as some other failure.
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		err = ErrNotFound
	} else if escapes(err) {
		err = ErrOutsideStore
	} else if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		err = pe.Err // the key is already in the message
	}
	return &Error{Op: op, Store: p.id, Key: key, Err: err}
}

// open opens a regular file without blocking: a FIFO or device planted in
// a store must not hang a reader (O_NONBLOCK makes the open of a FIFO
// return at once; the mode check then refuses it). A directory is not an
// object: ErrNotFound.
func (p *Posix) open(k string) (*os.File, os.FileInfo, error) {
	var f *os.File
	var err error
	if p.follow {
		// The key is clean (no "..", not absolute): only links leave.
		f, err = os.OpenFile(filepath.Join(p.dir, filepath.FromSlash(k)), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	} else {
		f, err = p.root.OpenFile(k, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	}
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	switch {
	case err != nil:
	case st.IsDir():
		err = ErrNotFound
	case !st.Mode().IsRegular():
		err = fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// Get reads a whole object.
func (p *Posix) Get(ctx context.Context, key string) ([]byte, error) {
	return p.GetInto(ctx, key, nil, 0)
}

var _ GetterInto = (*Posix)(nil)

// GetInto reads a whole object into buf, growing it when too small.
func (p *Posix) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	b, _, err := p.GetVersion(ctx, key, buf, limit)
	return b, err
}

// GetRange reads length bytes at off, or the last length bytes when off < 0.
func (p *Posix) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return nil, &Error{Op: "get range", Store: p.id, Key: key, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, p.wrap("get range", k, err)
	}
	if length < 0 {
		return nil, p.wrap("get range", k, fmt.Errorf("negative length %d", length))
	}
	f, st, err := p.open(k)
	if err != nil {
		return nil, p.wrap("get range", k, err)
	}
	defer f.Close()
	size := st.Size()
	if off < 0 {
		off = size - length
	}
	if off < 0 || off+length > size {
		return nil, p.wrap("get range", k, fmt.Errorf("%w: %d+%d, size %d", ErrRange, off, length, size))
	}
	buf := make([]byte, length)
	if _, err := f.ReadAt(buf, off); err != nil && !(err == io.EOF && length == 0) {
		return nil, p.wrap("get range", k, err)
	}
	return buf, nil
}

// List returns the sorted names of the prefix's children; directories end in "/".
func (p *Posix) List(ctx context.Context, prefix string) ([]string, error) {
	k, err := CleanKey(prefix, true)
	if err != nil {
		return nil, &Error{Op: "list", Store: p.id, Key: prefix, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, p.wrap("list", k, err)
	}
	dir := k
	if dir == "" {
		dir = "."
	}
	var f *os.File
	if p.follow {
		f, err = os.Open(filepath.Join(p.dir, filepath.FromSlash(dir)))
	} else {
		f, err = p.root.Open(dir)
	}
	if err != nil {
		return nil, p.wrap("list", k, err)
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, p.wrap("list", k, err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || (e.Type()&fs.ModeSymlink != 0 && p.linksToDir(path.Join(k, n))) {
			n += "/"
		}
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// linksToDir reports whether the symbolic link at key k names a directory.
// A link that leaves the store counts when its target is a directory: it is
// listed, and reading below it fails with ErrOutsideStore (unless links are
// followed), so that what the store holds is left out with a reason
// rather than silently.
func (p *Posix) linksToDir(k string) bool {
	st, err := os.Stat(filepath.Join(p.dir, filepath.FromSlash(k)))
	return err == nil && st.IsDir()
}

// escapes reports whether err is os.Root refusing a path that leaves it.
func escapes(err error) bool {
	return err != nil && strings.Contains(err.Error(), "path escapes from parent")
}
