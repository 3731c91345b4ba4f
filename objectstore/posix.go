package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Posix is a Store over a directory of the local filesystem. Every access
// goes through an os.Root, so neither a key nor a symbolic link inside the
// store can reach a file outside it.
type Posix struct {
	root *os.Root
	id   string
}

var _ Store = (*Posix)(nil)

// OpenPosix opens the store rooted at dir (a path or a file:// URL).
func OpenPosix(dir string) (*Posix, error) {
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
			return nil, fmt.Errorf("%s: no such directory", dir)
		}
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s: not a directory", dir)
	}
	r, err := os.OpenRoot(abs)
	if err != nil {
		return nil, err
	}
	return &Posix{root: r, id: "file://" + abs}, nil
}

// ID returns the file:// URL of the store root.
func (p *Posix) ID() string { return p.id }

// Close releases the root directory handle.
func (p *Posix) Close() error { return p.root.Close() }

func (p *Posix) wrap(op, key string, err error) error {
	// ENOTDIR: a key below an object ("a/zarr.json/x") does not exist either,
	// as S3 reports it; it must not read as some other failure.
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		err = ErrNotFound
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
	f, err := p.root.OpenFile(k, os.O_RDONLY|syscall.O_NONBLOCK, 0)
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
	return p.GetInto(ctx, key, nil)
}

var _ GetterInto = (*Posix)(nil)

// GetInto reads a whole object into buf, growing it when too small.
func (p *Posix) GetInto(ctx context.Context, key string, buf []byte) ([]byte, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return nil, &Error{Op: "get", Store: p.id, Key: key, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, p.wrap("get", k, err)
	}
	f, st, err := p.open(k)
	if err != nil {
		return nil, p.wrap("get", k, err)
	}
	defer f.Close()
	if err := checkSize(ctx, st.Size()); err != nil {
		return nil, p.wrap("get", k, err)
	}
	n := int(st.Size())
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, p.wrap("get", k, err)
	}
	return buf, nil
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
		return nil, p.wrap("get range", k, fmt.Errorf("range %d+%d past end of object (size %d)", off, length, size))
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
	f, err := p.root.Open(dir)
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
		if e.IsDir() {
			n += "/"
		}
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}
