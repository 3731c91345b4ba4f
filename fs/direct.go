package fs

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/layout"
)

// Direct mode (docs/design.md §9): every .npy file is a symbolic link
// that resolves to its blob in the cache, so readers that cannot read
// through FUSE (GPUDirect Storage: cuFile refuses FUSE descriptors) open the
// cache file itself.
//
// The kernel asks the daemon for a link's target (READLINK) both when it
// resolves a path and when a program calls readlink(2), as `ls -l` does for
// every link it lists; the two cannot be told apart. So the link a listing
// shows, MOUNT/train/00.npy -> ../.zarrfs/train/00.npy, costs nothing, and
// only its target, a second link in an unlisted mirror of the tree under
// MOUNT/.zarrfs, fills the blob when it is resolved and names the cache
// file. stat, open and realpath of a sample go through both links (the
// blob is filled, then opened on the cache's filesystem); lstat, readdir
// and `ls -l` stop at the first.
//
// Symlink caching stays off (go-fuse enables it only on request), so every
// resolution reaches the daemon: a resolved blob is leased, kept from
// eviction for the lease time, and an evicted blob is filled again on its
// next resolution.

// DefaultLease is how long a resolved blob is kept from eviction.
const DefaultLease = 10 * time.Minute

// resolveDir is the unlisted top-level directory that mirrors the tree
// for the second link. Zarr node names cannot start with a dot in a store
// written by zarr-python, and a store that has one anyway shadows nothing:
// the mirror is looked up before the tree.
const resolveDir = ".zarrfs"

const linkMode = syscall.S_IFLNK | 0o777

// shadowed reports whether the entry name of the tree's root is left out
// of a direct mode mount: one named resolveDir, which the mirror takes the
// place of, and the sidecar of an array of that name.
func shadowed(lay *layout.Layout, name string) bool {
	switch name {
	case resolveDir:
		return true
	case resolveDir + ".json":
		e, ok := lay.Root().Lookup(resolveDir)
		return ok && e.Kind == layout.KindDir
	}
	return false
}

// warnShadowed warns, once for a mount and again for a refresh that
// brings it back, that the store's entry named resolveDir is left out of
// the direct mode mount (prev is the tree before, nil at the start).
func (m *Mounted) warnShadowed(prev, next *layout.Layout) {
	if _, ok := next.Root().Lookup(resolveDir); !ok {
		return
	}
	if prev != nil {
		if _, had := prev.Root().Lookup(resolveDir); had {
			return
		}
	}
	m.log.Warn("store entry left out of the mount: direct mode needs the name for itself", "entry", resolveDir)
}

// linkTarget is the relative target of the listed link for mount path p:
// the same path under resolveDir, reached from p's directory.
func linkTarget(p string) string {
	return strings.Repeat("../", strings.Count(p, "/")) + resolveDir + "/" + p
}

// linkNode is a listed sample or whole-array file in direct mode: a link
// into the mirror, answered from memory.
type linkNode struct {
	roNode
	target string
}

// resolveNode is the mirror's link: resolving it fills and leases the blob.
type resolveNode struct {
	roNode
	path   string
	target string
}

var (
	_ gofs.NodeReadlinker = (*linkNode)(nil)
	_ gofs.NodeGetattrer  = (*linkNode)(nil)
	_ gofs.NodeReadlinker = (*resolveNode)(nil)
	_ gofs.NodeGetattrer  = (*resolveNode)(nil)
)

// Getattr is lstat: the link's own attributes; nothing is decoded.
func (n *linkNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr, linkMode, int64(len(n.target)), n.StableAttr().Ino)
	return 0
}

func (n *linkNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	return []byte(n.target), 0
}

func (n *resolveNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr, linkMode, int64(len(n.target)), n.StableAttr().Ino)
	return 0
}

// Readlink fills and leases the blob (the version the current layout
// names), then names its cache file.
func (n *resolveNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	e, ok := n.m.Layout().Lookup(n.path)
	if !ok || e.Kind != layout.KindBlob {
		return nil, syscall.ENOENT
	}
	n.m.opens.Add(1)
	if err := n.m.leases.resolve(n.m, e.Blob); err != nil {
		return nil, n.m.errno(e.Blob, err)
	}
	return []byte(n.target), 0
}

// leases keeps the blobs resolved within the lease time open (pinned, so no
// cache instance in any process evicts them) and closes each once its
// lease has run out. A link resolved again within its lease costs a map
// lookup.
type leases struct {
	d   time.Duration
	max int
	log *slog.Logger

	mu     sync.Mutex
	byPath map[string]*list.Element // of *lease
	order  list.List                // oldest expiry at the front
	closed bool
	warned bool
	stop   chan struct{}
	done   chan struct{}
}

type lease struct {
	path  string
	ident string // the version of the blob leased
	b     fill.Backing
	until time.Time
}

func newLeases(d time.Duration, log *slog.Logger) *leases {
	l := &leases{d: d, max: leaseLimit(), log: log, byPath: map[string]*list.Element{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go l.expire()
	return l
}

// leaseLimit bounds the leases by the descriptors the process may hold
// (each lease keeps one open), leaving room for everything else.
func leaseLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur < 2048 {
		return 512
	}
	return int(min(r.Cur-1024, 1<<20))
}

// resolve makes sure blob b is complete in the cache, in the version the
// current layout names, and leased until now plus the lease time. A lease
// of another version (the sample changed since) is replaced. It runs
// under the mount's life, as an open does (Mounted.open): a reader's
// signal does not interrupt it.
func (l *leases) resolve(m *Mounted, b layout.Blob) error {
	now := time.Now()
	p := b.Path()
	l.mu.Lock()
	_, leased := l.byPath[p]
	l.mu.Unlock()
	if leased {
		// Renewed when the version leased is still the current one; a
		// path not leased is not worth asking (the open below asks only
		// for a blob the cache holds).
		ident, err := m.Layout().Identity(m.life, b)
		if err != nil {
			return err
		}
		l.mu.Lock()
		if e, ok := l.byPath[p]; ok && e.Value.(*lease).ident == ident {
			if !written(e.Value.(*lease).b) {
				e.Value.(*lease).until = now.Add(l.d)
				l.order.MoveToBack(e)
				l.mu.Unlock()
				return nil
			}
			// Written through the link (root ignores the blob's
			// read-only mode): the lease ends, and the open below finds
			// the file changed and fills it again.
			old := l.removeLocked(e)
			l.mu.Unlock()
			old.Close()
		} else {
			l.mu.Unlock()
		}
	}

	// A blob larger than the whole cache budget is served from an unlinked
	// file, which no link can name: refuse it before filling it, and check
	// that the link's target is the very file leased.
	tooLarge := func() error {
		return fmt.Errorf("%s: %d bytes, larger than the cache budget: direct mode serves only blobs the cache can keep (raise --cache-size)", p, b.Size())
	}
	if !m.opts.Blobs.Keeps(b.Size()) {
		return tooLarge()
	}
	h, ident, err := m.open(b)
	if err != nil {
		return err
	}
	if !sameFile(h.File(), m.opts.Blobs.Path(m.Layout(), p)) {
		h.Close()
		return tooLarge()
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return h.Close()
	}
	var old fill.Backing
	if e, ok := l.byPath[p]; ok {
		if e.Value.(*lease).ident == ident {
			// A concurrent resolution leased it first.
			e.Value.(*lease).until = now.Add(l.d)
			l.order.MoveToBack(e)
			l.mu.Unlock()
			return h.Close()
		}
		old = l.removeLocked(e)
	}
	l.byPath[p] = l.order.PushBack(&lease{path: p, ident: ident, b: h, until: now.Add(l.d)})
	var early []fill.Backing
	for l.order.Len() > l.max {
		early = append(early, l.removeLocked(l.order.Front()))
		if !l.warned {
			l.warned = true
			l.log.Warn("more files resolved within the lease than open descriptors allow; the oldest leases end early",
				"leases", l.max, "lease", l.d)
		}
	}
	l.mu.Unlock()
	if old != nil {
		old.Close()
	}
	for _, b := range early {
		b.Close()
	}
	return nil
}

// written reports whether a leased blob's file was written since it was
// opened (cache.Handle.Changed: one fstat).
func written(b fill.Backing) bool {
	c, ok := b.(fill.Changer)
	return ok && c.Changed()
}

func (l *leases) removeLocked(e *list.Element) fill.Backing {
	ls := l.order.Remove(e).(*lease)
	delete(l.byPath, ls.path)
	return ls.b
}

// expire ends leases as they run out.
func (l *leases) expire() {
	defer close(l.done)
	tick := min(max(l.d/10, 50*time.Millisecond), 10*time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case now := <-t.C:
			var ended []fill.Backing
			l.mu.Lock()
			for e := l.order.Front(); e != nil && !e.Value.(*lease).until.After(now); e = l.order.Front() {
				ended = append(ended, l.removeLocked(e))
			}
			l.mu.Unlock()
			for _, b := range ended {
				b.Close()
			}
		}
	}
}

// held reports how many blobs are leased now.
func (l *leases) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}

// close ends every lease; later resolutions still fill but lease nothing.
func (l *leases) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	var all []fill.Backing
	for e := l.order.Front(); e != nil; e = l.order.Front() {
		all = append(all, l.removeLocked(e))
	}
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	for _, b := range all {
		b.Close()
	}
}

// sameFile reports whether path names the open file f.
func sameFile(f *os.File, path string) bool {
	if f == nil {
		return false
	}
	fst, err := f.Stat()
	if err != nil {
		return false
	}
	st, err := os.Stat(path)
	return err == nil && os.SameFile(fst, st)
}
