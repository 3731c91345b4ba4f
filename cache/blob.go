package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// BlobKey names a decoded blob. The two parts become its path under
// Dir/blobs, so the blob tier mirrors the mount's tree and readers that
// cannot go through FUSE (GPUDirect Storage) can open the warmed copy.
type BlobKey struct {
	// Layout is one directory name per source and layout: a hash the caller
	// computes from everything that determines the bytes (source identity,
	// metadata hashes, --align, view definition), so that a change to any
	// of them lands in a new directory and never serves a stale blob. One
	// path element: no "/", not "." or "..".
	Layout string
	// Path is the mounted file's path inside the mount ("t/0042.npy"),
	// slash-separated, relative and clean.
	Path string
	// Identity names what the bytes were built from (a hash the caller
	// computes from the inputs that may change under a stable path: the
	// identities of the source chunks read, the metadata), recorded with
	// the blob. An indexed blob whose recorded Identity differs is stale:
	// GetBlob fills the key again and replaces it. Empty is an identity
	// like any other. When set, it must satisfy ValidIdentity. It plays no
	// part in the blob's path.
	Identity string
}

func (k BlobKey) rel() (string, error) {
	if k.Layout == "" || k.Layout == "." || k.Layout == ".." || strings.ContainsAny(k.Layout, "/\x00") ||
		!fs.ValidPath(k.Path) || k.Path == "." || (k.Identity != "" && !ValidIdentity(k.Identity)) {
		return "", fmt.Errorf("blob %q/%q: %w", k.Layout, k.Path, ErrInvalidKey)
	}
	return blobsDir + "/" + k.Layout + "/" + k.Path, nil
}

// BlobPath is where the complete blob for k lives (it may not exist).
func (c *Cache) BlobPath(k BlobKey) string {
	return filepath.Join(c.dir, blobsDir, k.Layout, filepath.FromSlash(k.Path))
}

// BlobDir is the directory that mirrors the mount's tree for one layout.
func (c *Cache) BlobDir(layout string) string {
	return filepath.Join(c.dir, blobsDir, layout)
}

// HasBlob reports whether the complete blob for k, with k's Identity, is
// indexed and present.
func (c *Cache) HasBlob(k BlobKey) bool {
	rel, err := k.rel()
	if err != nil {
		return false
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.tailLocked()
	e := c.idx[rel]
	var size, mtime int64
	if e != nil {
		size, mtime = e.size, e.mtime
	}
	current := e != nil && e.ident == k.Identity
	c.mu.Unlock()
	if !current {
		return false
	}
	fi, err := os.Stat(filepath.Join(c.dir, rel))
	return err == nil && fi.Mode().IsRegular() && fi.Size() == size && (mtime == 0 || fi.ModTime().UnixNano() == mtime)
}

// Holds reports whether the index holds a blob at k's path, whatever its
// identity (k.Identity plays no part): what a caller checks before it asks
// the source what the identity is, since a blob the cache never held needs
// filling whatever it is (GetBlob with learn).
func (c *Cache) Holds(k BlobKey) bool {
	k.Identity = ""
	rel, err := k.rel()
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.closed && c.lookupLocked(rel) != nil
}

// Handle is an open, pinned, complete blob. While it is open the file is
// neither evicted nor unlinked, by this Cache or any other sharing the
// directory. Keep it open as long as anything (the kernel, for FUSE
// passthrough) reads through its descriptor.
type Handle struct {
	c    *Cache
	e    *entry
	f    *os.File
	path string
	size int64
	// mtime is the file's modification time when it was opened
	// (UnixNano), for Changed.
	mtime int64
	// filled: the caller waited on a fill of the blob (its own or one it
	// shared) that wrote it, rather than finding it in the cache.
	filled bool
	once   sync.Once
}

// File is a read-only descriptor on the complete blob.
func (h *Handle) File() *os.File { return h.f }

// Path is the blob's path in the cache directory (BlobPath of its key).
func (h *Handle) Path() string { return h.path }

// Size is the blob's size in bytes.
func (h *Handle) Size() int64 { return h.size }

// Filled reports whether the Handle's caller waited on a fill of the blob
// (its own, or one it shared) that wrote it, rather than finding it
// complete in the cache under the identity it asked for, or at the path it
// had before (a link, adoptBlob).
func (h *Handle) Filled() bool { return h.filled }

// Changed reports whether the blob's file was written since the Handle
// was opened: its size or modification time is not what they were. Blobs
// are read-only, but root ignores that (a write through a direct mode
// link). It costs one fstat.
func (h *Handle) Changed() bool {
	fi, err := h.f.Stat()
	return err != nil || fi.Size() != h.size || fi.ModTime().UnixNano() != h.mtime
}

// Close closes the descriptor and unpins the blob. Calls after the first
// do nothing.
func (h *Handle) Close() error {
	var err error
	h.once.Do(func() {
		err = h.f.Close()
		c := h.c
		c.mu.Lock()
		if h.e != nil {
			h.e.pins--
			if h.e.pins == 0 && !c.closed {
				c.evictLocked()
			}
		}
		c.mu.Unlock()
	})
	return err
}

// GetBlob returns an open, pinned Handle on the complete blob for k, and
// the identity it is recorded under, running fill once when it is absent
// or indexed with another Identity (stale). A stale blob is replaced by an
// atomic rename: a reader that has the old file open keeps reading it, and
// the path never names a partial file.
//
// With learn nil, k.Identity is the blob's identity. With learn set, the
// identity is known only once the blob is filled (the versions of the
// source chunks, taken from the responses that fetched them): k.Identity
// is ignored, fill runs without looking at the index (it is for a path the
// index does not hold, Holds), then learn names what it read, and the blob
// is published under that identity, replacing any blob at the path. An
// error of learn fails the fill (wrapped, as fill's are) and publishes
// nothing. A GetBlob of the path with a known identity waits for such a
// fill before it fills one of its own.
//
// fill must write exactly size bytes into f, a fresh temp file on the
// cache's filesystem (not in the blob's final directory: temp files live
// under Dir/tmp so that recovery finds torn ones without walking the blob
// tree). The cache then checks the size, records the checksum of the
// contents (checksum.go), fsyncs the file and links it into place, so a
// blob is visible only complete and survives a power loss intact. A blob that is visible is
// never replaced or rewritten: two fills of one key racing in two processes
// both succeed, the first link wins and the other copy is discarded.
//
// Concurrent calls for one key (one path that learns, or one path and
// identity) share one fill; each gets its own Handle. A caller whose ctx
// ends returns ctx.Err() while the fill goes on for the others (it is
// cancelled when no caller is left, or at Close). A fill error is returned
// to every caller sharing it, leaves nothing visible and is not
// remembered: the next call fills again. Errors wrap the blob's path.
func (c *Cache) GetBlob(ctx context.Context, k BlobKey, size int64, fill func(ctx context.Context, f Writer) error, learn func() (string, error)) (*Handle, string, error) {
	if learn != nil {
		k.Identity = ""
	}
	rel, err := k.rel()
	if err != nil {
		return nil, "", err
	}
	if size < 0 {
		return nil, "", fmt.Errorf("blob %s: negative size %d", rel, size)
	}
	if learn != nil {
		c.counts.blobMisses.Add(1)
		return c.fillShared(ctx, rel, learnFlight(rel), k, size, fill, learn)
	}
	// Fills of one path for two identities (an old and a new view of the
	// source) are separate flights; the later publish wins the path.
	for {
		if err := ctx.Err(); err != nil {
			return nil, "", err
		}
		h, err := c.openIndexed(rel, size, k.Identity)
		if h != nil {
			c.counts.blobHits.Add(1)
		}
		if err != nil || h != nil {
			return h, k.Identity, err
		}
		if c.awaitLearning(ctx, rel) {
			// A fill of rel learning its identity (a reader ahead, or
			// readahead) was running: it most likely published this one.
			continue
		}
		c.counts.blobMisses.Add(1)
		h, id, err := c.fillShared(ctx, rel, rel+"\x00="+k.Identity, k, size, fill, nil)
		if !errors.Is(err, errRetry) {
			return h, id, err
		}
	}
}

// learnFlight is the flight key of a fill of rel that learns its identity;
// one of a known identity is rel, "\x00=" and the identity.
func learnFlight(rel string) string { return rel + "\x00?" }

// filled is what one shared blob fill made: the blob and its identity;
// adopted when it linked a blob held at another path (adoptBlob).
type filled struct {
	f       *os.File
	ident   string
	adopted bool
}

// fillShared runs the fill of rel as the flight named key, shared by
// every caller of the same key, and gives each caller its own Handle. A
// fill of a known identity first links a blob of the same identity held
// at another path (adoptBlob), and reports errRetry when the key became
// indexed meanwhile.
func (c *Cache) fillShared(ctx context.Context, rel, key string, k BlobKey, size int64, fill func(ctx context.Context, f Writer) error, learn func() (string, error)) (*Handle, string, error) {
	ready := func() bool { e := c.idx[rel]; return e != nil && e.ident == k.Identity }
	if learn != nil {
		ready = func() bool { return false }
	}
	type opened struct {
		h     *Handle
		ident string
	}
	o, err := join(c, c.blobFlights, key, ctx, ready,
		func(ctx context.Context) (filled, error) {
			if learn == nil {
				if f := c.adoptBlob(rel, k, size); f != nil {
					return filled{f, k.Identity, true}, nil
				}
			}
			ident := k.Identity
			f, err := c.fillBlob(ctx, rel, size, func() (string, error) {
				if learn == nil {
					return ident, nil
				}
				id, err := learn()
				if err == nil && id != "" && !ValidIdentity(id) {
					err = fmt.Errorf("identity %q: %w", id, ErrInvalidKey)
				}
				ident = id
				return id, err
			}, fill)
			return filled{f, ident, false}, err
		},
		func(v filled, _ bool) (opened, error) {
			h, err := c.dupHandle(rel, v.f, size)
			if h != nil {
				h.filled = !v.adopted
			}
			return opened{h, v.ident}, err
		},
		func(v filled) { v.f.Close() },
	)
	return o.h, o.ident, err
}

// awaitLearning waits for a fill of rel that learns its identity, or for
// ctx to end, and reports whether there was one to wait for.
func (c *Cache) awaitLearning(ctx context.Context, rel string) bool {
	c.mu.Lock()
	f := c.blobFlights[learnFlight(rel)]
	c.mu.Unlock()
	if f == nil {
		return false
	}
	select {
	case <-f.done:
	case <-ctx.Done():
	}
	return true
}

// adoptBlob links a blob indexed elsewhere in k's layout directory with k's
// identity and size to rel, as a fill of rel would publish it, and returns
// a read-only descriptor on it, locked shared; nil when there is none (or
// it vanished meanwhile). Equal identities name equal bytes, so this is a
// fill that costs a link: the path of a sample changed, its data did not.
func (c *Cache) adoptBlob(rel string, k BlobKey, size int64) *os.File {
	if k.Identity == "" {
		return nil
	}
	c.mu.Lock()
	e := c.byIdent[k.Layout+"\x00"+k.Identity]
	if e == nil || e.size != size || e.key == rel || c.closed {
		c.mu.Unlock()
		return nil
	}
	from, sum := e.key, e.sum
	e.pins++ // not evicted by this instance meanwhile
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		e.pins--
		c.mu.Unlock()
	}()
	src := filepath.Join(c.dir, from)
	f, err := openRO(src)
	if err != nil {
		return nil
	}
	// An evictor elsewhere holds LOCK_EX while it unlinks: once we hold
	// LOCK_SH, the path names our file or nothing.
	if flock(f, syscall.LOCK_SH) != nil || !sameFile(f, src) {
		f.Close()
		return nil
	}
	tmp := filepath.Join(c.inst.dir, "adopt-"+randomID())
	if os.Link(src, tmp) != nil || !sameFile(f, tmp) {
		os.Remove(tmp)
		f.Close()
		return nil
	}
	defer os.Remove(tmp)
	unreserve := c.reserve(size)
	if err := c.publish(rel, tmp, size, sum, k.Identity); err != nil {
		unreserve()
		f.Close()
		return nil
	}
	c.log.Debug("cache blob linked from another path of the same identity", "blob", rel, "from", from)
	return f
}

// openIndexed opens rel if the index has it with identity ident. It returns
// nil, nil when the blob is absent or stale, or was evicted or damaged
// under us (then it is forgotten and the caller fills it again).
func (c *Cache) openIndexed(rel string, size int64, ident string) (*Handle, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	e := c.lookupLocked(rel)
	if e != nil && e.ident != ident {
		// Another instance may have replaced it meanwhile.
		c.tailLocked()
		e = c.idx[rel]
	}
	if e == nil || e.ident != ident {
		// Absent, or stale: the fill replaces it. A stale entry stays
		// indexed (its file is still there) until then.
		c.mu.Unlock()
		return nil, nil
	}
	e.pins++
	c.lru.MoveToFront(e.elem)
	want, wantTime := e.size, e.mtime
	c.mu.Unlock()

	p := filepath.Join(c.dir, rel)
	f, err := openRO(p)
	ok := err == nil
	if ok {
		// A shared lock first, then the checks: an evictor elsewhere holds
		// LOCK_EX while it unlinks, so after our lock the path either
		// still names our file or the file is gone.
		ok = flock(f, syscall.LOCK_SH) == nil
	}
	var mtime int64
	written := false
	if ok {
		// One fstat serves every check (this is every open of a mounted
		// file, so each syscall counts).
		fi, err := f.Stat()
		pi, perr := os.Stat(p)
		ok = err == nil && perr == nil && os.SameFile(fi, pi) &&
			fi.Mode().IsRegular() && fi.Size() == want && want == size
		if ok {
			mtime = fi.ModTime().UnixNano()
			// Written in place since it was published or first opened:
			// blobs are read-only, but not to root (a write through a
			// direct mode link). Never served: filled again.
			written = wantTime != 0 && mtime != wantTime
			ok = !written
		} else if err == nil && perr == nil && os.SameFile(fi, pi) && fi.Mode().IsRegular() && want == size {
			written = true // truncated or extended in place
		}
	}
	if !ok {
		if f != nil {
			f.Close()
		}
		if written {
			c.log.Warn("cache file written since it was cached; dropped and filled again (blobs are read-only: do not write through direct mode links)",
				"file", p)
		}
		c.mu.Lock()
		e.pins--
		c.removeLocked(e)
		c.mu.Unlock()
		return nil, nil
	}
	if wantTime == 0 {
		c.mu.Lock()
		if e.mtime == 0 {
			e.mtime = mtime
		}
		c.mu.Unlock()
	}
	return &Handle{c: c, e: e, f: f, path: p, size: size, mtime: mtime}, nil
}

// openRO opens a file read-only without os.Open's attempt to register a
// regular file with the network poller (a failing epoll_ctl and fcntls per
// open).
func openRO(p string) (*os.File, error) {
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// dupHandle gives one caller of a shared fill its own descriptor. The
// duplicate shares the open file (and its lock) with the fill's, which is
// still open, so the blob cannot have been evicted in between.
func (c *Cache) dupHandle(rel string, f *os.File, size int64) (*Handle, error) {
	p := filepath.Join(c.dir, rel)
	df, err := dupFile(f, p)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", rel, err)
	}
	h := &Handle{c: c, f: df, path: p, size: size}
	if fi, err := df.Stat(); err == nil {
		h.mtime = fi.ModTime().UnixNano()
	}
	c.mu.Lock()
	if e := c.idx[rel]; e != nil {
		e.pins++
		h.e = e
	}
	c.mu.Unlock()
	return h, nil
}

// dupFile returns a second descriptor of f's open file, named name, closed
// on exec like every descriptor Go opens.
func dupFile(f *os.File, name string) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "dup", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Writer is what a fill writes a blob's bytes to: the blob's temporary
// file, through a wrapper that hashes the bytes as they go by.
type Writer interface {
	io.Writer
	io.WriterAt
}

// hashingWriter hashes what a fill writes, as long as it writes the file
// from its start in order (Fill writes the header, then the data in
// order): the journal's checksum then needs no second pass over the file.
// Any other write turns it off, and the file is read back and hashed.
type hashingWriter struct {
	c      *Cache // lends the buffer a file is read back through
	f      *os.File
	d      hasher
	next   int64 // bytes hashed: where an in-order write starts
	pos    int64 // the file offset Write writes at
	broken bool
	noMap  bool // the filesystem cannot take writes through a mapping
	// filling counts the fills in flight (nil: never map); see fewFills.
	filling *atomic.Int64
}

// hashPiece is how much a write hands the kernel before it hashes what it
// wrote: the hash then reads bytes the kernel's copy just brought into the
// core's cache, instead of a second pass over a sample from memory (a
// sample is tens of megabytes, and the second pass cost as much CPU as
// the write itself). A quarter of a MiB, the piece and its copy in the
// page cache, stays in a core's L2 cache: against 1 MiB pieces a fill
// takes less CPU (the hash, the source's copy and the unshuffle all gain;
// BENCHMARKS.md, tuning choices), for more write calls, which cost
// microseconds each.
const hashPiece = 256 << 10

func (h *hashingWriter) WriteAt(p []byte, off int64) (int, error) {
	if len(p) >= mapWriteMin && !h.noMap && h.filling != nil && fewFills(h.filling.Load()) {
		switch err := writeMapped(h.f, p, off, h.saw); {
		case err == nil:
			return len(p), nil
		case !errors.Is(err, errNoMap):
			return 0, err
		}
		h.noMap = true
	}
	done := 0
	for done < len(p) {
		// Pieces end on multiples of hashPiece in the file, so that the
		// segment hash (checksum.go) takes each whole.
		end := min(done+hashPiece-int((off+int64(done))%hashPiece), len(p))
		n, err := h.f.WriteAt(p[done:end], off+int64(done))
		h.saw(p[done:done+n], off+int64(done))
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (h *hashingWriter) Write(p []byte) (int, error) {
	n, err := h.WriteAt(p, h.pos)
	h.pos += int64(n)
	return n, err
}

func (h *hashingWriter) saw(p []byte, off int64) {
	if h.broken || off != h.next {
		h.broken = true
		return
	}
	h.d.Write(p)
	h.next += int64(len(p))
}

// sum returns the checksum of the file's first size bytes: the running
// one when the fill wrote exactly them in order, else read back from the
// file.
func (h *hashingWriter) sum(size int64) (checksum, error) {
	if !h.broken && h.next == size {
		return h.d.sum(), nil
	}
	buf := h.c.hashBuf()
	defer h.c.freeHashBuf(buf)
	_, tree := h.d.(*treeHash)
	return hashFile(h.f, size, buf, tree)
}

// fillBlob runs the fill and returns a read-only descriptor, locked
// shared, on the now-visible blob. A blob that cannot fit the cache's
// filesystem fails at once; a fill that finds the filesystem full (other
// writers, blocks beyond the budget) makes room by evicting and runs again,
// for as long as the room can be found (whileFull).
func (c *Cache) fillBlob(ctx context.Context, rel string, size int64, ident func() (string, error), fill func(ctx context.Context, f Writer) error) (*os.File, error) {
	if err := c.ensureSpace(rel, size); err != nil {
		return nil, err
	}
	var f *os.File
	err := c.whileFull(ctx, rel, size, func() (err error) {
		f, err = c.fillBlobOnce(ctx, rel, size, ident, fill)
		return err
	})
	return f, err
}

// fillBlobOnce runs one fill, and publishes it under the identity ident
// names once it has run.
func (c *Cache) fillBlobOnce(ctx context.Context, rel string, size int64, identity func() (string, error), fill func(ctx context.Context, f Writer) error) (_ *os.File, err error) {
	// A blob larger than the whole budget would evict everything and then
	// itself: it is filled and served from an unlinked temp file instead,
	// never indexed.
	budget := c.Budget()
	oversize := !c.keeps(size, budget)
	committed := oversize
	if !oversize {
		unreserve := c.reserve(size)
		defer func() {
			if !committed {
				unreserve()
			}
		}()
	}

	tmp, err := os.CreateTemp(c.inst.dir, "blob-*")
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", rel, err)
	}
	tmpName := tmp.Name()
	defer func() {
		if tmp != nil {
			tmp.Close()
		}
		os.Remove(tmpName)
	}()
	hw := &hashingWriter{c: c, f: tmp, d: newHasher(c.treeSums.Load())}
	if c.mapsWrites() {
		hw.filling = &c.counts.filling
	}
	c.counts.filling.Add(1)
	err = fill(ctx, hw)
	c.counts.filling.Add(-1)
	if err != nil {
		return nil, fmt.Errorf("blob %s: fill: %w", rel, err)
	}
	fi, err := tmp.Stat()
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", rel, err)
	}
	if fi.Size() != size {
		return nil, fmt.Errorf("blob %s: %w: %d bytes, want %d", rel, ErrFillSize, fi.Size(), size)
	}
	ident, err := identity()
	if err != nil {
		return nil, fmt.Errorf("blob %s: fill: %w", rel, err)
	}
	sum, err := hw.sum(size)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", rel, err)
	}
	// No fsync here, on the path a reader waits for: the journal's
	// checksum covers a power loss (see syncAll). The blob's writeback is
	// started soon after, in the background (writeback), so that the disk
	// writes while later fills decode, rather than all at once when a warm
	// ends or memory runs short, and no fill waits for the disk's queue.
	c.wb.start(tmp)
	if err := tmp.Close(); err != nil {
		tmp = nil
		return nil, fmt.Errorf("blob %s: %w", rel, err)
	}
	tmp = nil
	ro, err := os.Open(tmpName)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", rel, err)
	}
	if oversize {
		c.log.Warn("blob larger than the cache budget served without caching", "blob", rel, "bytes", size, "budget", budget)
		return ro, nil // the deferred Remove unlinks it; ro keeps it readable
	}
	if err := flock(ro, syscall.LOCK_SH); err != nil {
		ro.Close()
		return nil, fmt.Errorf("blob %s: lock: %w", rel, err)
	}
	if err := c.publish(rel, tmpName, size, sum, ident); err != nil {
		ro.Close()
		return nil, err
	}
	committed = true
	// If another instance's identical copy won the link, pin that one, so
	// the file at Path is the one our Handles keep from eviction. Ours
	// stays readable through ro if theirs vanished meanwhile.
	final := filepath.Join(c.dir, rel)
	if !sameFile(ro, final) {
		if f, err := os.Open(final); err == nil {
			if flock(f, syscall.LOCK_SH) == nil && sameFile(f, final) {
				ro.Close()
				return f, nil
			}
			f.Close()
		}
	}
	return ro, nil
}

// publish logs the entry, links the finished temp file into place and
// indexes it, turning the caller's reservation of size bytes into the
// entry. The record goes first: a kill between the two leaves a record
// without a file (forgotten on first use or at recovery), never a file
// without a record that nobody accounts for; a kill after the record of a
// replacement but before its rename leaves the old file under the new
// record, which fails verification at recovery and is dropped.
func (c *Cache) publish(rel, tmpName string, size int64, sum checksum, ident string) error {
	final := filepath.Join(c.dir, rel)
	if err := c.prepare(rel, tmpName); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", rel, ErrClosed)
	}
	// A file indexed with other bytes is a stale version being replaced.
	prev := c.idx[rel]
	replacing := prev != nil && (prev.sum != sum || prev.size != size)
	rec := record{op: opAdd, size: size, sum: sum, ident: ident, key: rel}
	err := c.appendLocked(rec)
	if isNoSpace(err) && c.makeRoomLocked(c.unit+4096) {
		err = c.appendLocked(rec)
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	err = os.Link(tmpName, final)
	if errors.Is(err, fs.ErrExist) {
		err = nil
		// Either another instance linked the same blob first (identical
		// bytes: keep theirs unless damaged; rare, so checking the whole
		// file is affordable), or the file is the stale version this fill
		// replaces. The rename replaces it atomically: the path never
		// names a missing or partial file, and readers of the old one
		// keep it.
		keep := false
		if !replacing {
			buf := c.hashBuf()
			keep = verifyFile(final, size, sum, buf) == nil
			c.freeHashBuf(buf)
		}
		if !keep {
			err = os.Rename(tmpName, final)
		}
	} else if err != nil {
		// Filesystems without hard links: rename, which replaces.
		err = os.Rename(tmpName, final)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	// The time the file has now is the one it keeps while nothing writes
	// it (openIndexed); the file at the path is ours, or the identical
	// one another instance linked first.
	var mtime int64
	if fi, err := os.Stat(final); err == nil {
		mtime = fi.ModTime().UnixNano()
	}
	c.mu.Lock()
	c.inflight -= c.charge(size) // the reservation becomes the entry
	e := c.insertLocked(record{size: size, sum: sum, ident: ident, writer: c.inst.id, key: rel}, true)
	e.mtime = mtime
	c.evictLocked()
	c.mu.Unlock()
	return nil
}
