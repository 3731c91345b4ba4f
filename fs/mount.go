// Package fs serves a layout.Layout as a read-only FUSE filesystem.
//
// The tree is computed by package layout, so lookups, stat and directory
// listings answer from memory and never decode. Opening a blob gets its
// backing file from the blob cache, which runs one fill per blob
// (concurrent opens wait for it) and publishes only complete files; reads then
// go straight from the kernel to the backing file (FUSE passthrough) where the
// kernel allows it, and otherwise are spliced from the backing descriptor.
//
// A layout is immutable; a mount that follows a growing store
// (Options.Refresh) builds a new one every --metadata-ttl and swaps it in.
// Nodes name paths and answer from the current layout; the kernel caches
// names and attributes for the TTL at most, and is told at each swap which
// listings and files changed. An open file keeps the version it opened.
//
// Concurrency: go-fuse calls node methods from many goroutines; nodes hold
// only their path, the current layout is an atomic pointer, and the
// per-mount fault log is guarded by a mutex.
package fs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/internal/mountinfo"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// Options configure Mount. Zero values mean the documented defaults.
type Options struct {
	// Mountpoint is the directory to mount on; required.
	Mountpoint string
	// Layout is the tree to serve; required.
	Layout *layout.Layout
	// Blobs provides backing files; required.
	Blobs fill.Blobs
	// Logger receives one line per failed fill (array, chunk key, cause)
	// and mount events. Nil discards.
	Logger *slog.Logger
	// AllowOther lets users other than the mounting one read the mount.
	AllowOther bool
	// MaxBackground bounds the kernel's asynchronous requests (readahead).
	// Zero means 64, enough for 16 concurrent readers.
	MaxBackground int
	// DisablePassthrough serves every read through the daemon, even where
	// the kernel could read the backing file directly (for benchmarks and
	// for debugging).
	DisablePassthrough bool
	// Debug logs every FUSE request (very verbose).
	Debug bool
	// Direct makes every .npy file a symbolic link to its blob in the
	// cache (docs/design.md §9), for readers that cannot read through
	// FUSE. Resolving a link fills the blob first.
	Direct bool
	// Lease is how long a blob whose link was resolved is kept from
	// eviction, in direct mode. Zero means DefaultLease.
	Lease time.Duration
	// Readahead is how many samples are filled in the background ahead of
	// a reader walking a sample directory in order (see
	// fill.WithReadahead).
	// Zero means none.
	Readahead int
	// MaxInodes bounds the files the kernel may hold looked up at once
	// (each costs the daemon about a kilobyte): past it, the oldest are
	// invalidated and looked up again when needed. Zero means
	// DefaultMaxInodes.
	MaxInodes int

	// Refresh, when set, builds the tree anew from the source as it is now
	// (metadata re-read, arrays listed again); the mount calls it every
	// RefreshEvery with the layout it serves, swaps in what it returns,
	// tells the kernel which names, listings and files changed, and closes
	// the old layout. An error is logged and the current tree kept.
	Refresh func(ctx context.Context, cur *layout.Layout) (*layout.Layout, error)
	// RefreshEvery is --metadata-ttl: how often Refresh runs, and how long
	// the kernel may cache names and attributes. Zero: never (the tree is
	// fixed, and the kernel caches for an hour). A fill that finds the
	// metadata changed (zarr.ErrMetadataChanged: a chunk deleted by an
	// array's shrinking) runs Refresh at once.
	RefreshEvery time.Duration
}

// Mounted is a live mount.
type Mounted struct {
	opts   Options
	log    *slog.Logger
	server *fuse.Server
	owner  fuse.Owner
	mtime  time.Time
	lay    atomic.Pointer[layout.Layout]
	root   *dirNode

	refreshDone chan struct{}
	refreshNow  chan struct{} // a fill found the metadata changed

	mu       sync.Mutex
	reported map[string]bool // fault keys already logged

	leases *leases // direct mode only
	inodes *inodeCap

	// Counters for Stats.
	opens, openFiles atomic.Int64
	errors           map[string]int64 // failed opens by Group, guarded by mu

	unmountOnce sync.Once

	// life is what fills and refreshes run under: cancelled when the
	// mount ends (Mounted.end), not when the kernel interrupts the request
	// that asked for a fill.
	life       context.Context
	endLife    context.CancelFunc
	unmountErr error
}

// maxReported bounds the fault keys remembered for logging once each.
const maxReported = 10000

// ErrStaleMount is wrapped in the message logged when a mountpoint left by a
// killed daemon is cleared.
var ErrStaleMount = errors.New("transport endpoint is not connected")

// attrTimeout is how long the kernel may cache names and attributes of a
// tree that does not change while mounted.
const attrTimeout = time.Hour

// Mount mounts the layout and returns once the filesystem is live.
func Mount(ctx context.Context, opts Options) (*Mounted, error) {
	if opts.Mountpoint == "" || opts.Layout == nil || opts.Blobs == nil {
		return nil, errors.New("fs: Mount needs a mountpoint, a layout and blobs")
	}
	m := &Mounted{
		opts:     opts,
		log:      opts.Logger,
		owner:    fuse.Owner{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())},
		mtime:    time.Now().Truncate(time.Second),
		reported: map[string]bool{},
	}
	m.life, m.endLife = context.WithCancel(context.Background())
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if opts.Lease < 0 {
		return nil, fmt.Errorf("fs: negative lease %v", opts.Lease)
	}
	if opts.Lease == 0 {
		opts.Lease = DefaultLease
		m.opts.Lease = DefaultLease
	}
	if err := ClearStale(opts.Mountpoint, m.log); err != nil {
		return nil, err
	}
	if src, ok := liveMount(opts.Mountpoint); ok {
		// Mounting over it would hide the first mount's tree: refuse.
		return nil, fmt.Errorf("%s: already a zarrfs mount (of %s); unmount it first (zarrfs unmount %s)", opts.Mountpoint, src, opts.Mountpoint)
	}
	st, err := os.Stat(opts.Mountpoint)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opts.Mountpoint, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s: not a directory", opts.Mountpoint)
	}

	if opts.RefreshEvery < 0 {
		return nil, fmt.Errorf("fs: negative refresh interval %v", opts.RefreshEvery)
	}
	if opts.Readahead < 0 || opts.MaxInodes < 0 {
		return nil, fmt.Errorf("fs: readahead %d, max inodes %d: want 0 (the default) or more", opts.Readahead, opts.MaxInodes)
	}
	m.lay.Store(opts.Layout)
	if opts.Readahead > 0 {
		m.opts.Blobs = fill.WithReadahead(opts.Blobs, m.Layout, opts.Readahead, m.log)
	}
	root := &dirNode{roNode: roNode{m: m}, path: ""}
	m.root = root
	mo := m.fuseOptions()
	if opts.Direct {
		m.warnShadowed(nil, opts.Layout)
	}
	if opts.Direct {
		// The kernel must ask for a link's target at every resolution, so
		// that resolving refills an evicted blob: no symlink caching
		// (go-fuse leaves it off unless EnableSymlinkCaching is set).
		m.leases = newLeases(opts.Lease, m.log)
	}
	m.inodes = newInodeCap(cmp.Or(opts.MaxInodes, DefaultMaxInodes))
	server, err := gofs.Mount(opts.Mountpoint, root, mo)
	if err != nil {
		if m.leases != nil {
			m.leases.close()
		}
		m.inodes.close()
		return nil, fmt.Errorf("mount %s: %w", opts.Mountpoint, err)
	}
	m.server = server
	m.refreshDone = make(chan struct{})
	m.refreshNow = make(chan struct{}, 1)
	if opts.Refresh != nil && opts.RefreshEvery > 0 {
		go m.refreshLoop()
	} else {
		close(m.refreshDone)
	}
	return m, nil
}

// fuseOptions are the mount's options: read-only in the kernel (the nodes
// refuse writes too, so each layer alone keeps the mount read-only), with
// long attribute timeouts for a tree that never changes, and timeouts of
// the refresh interval for one that follows its store.
func (m *Mounted) fuseOptions() *gofs.Options {
	timeout := attrTimeout
	if m.opts.Refresh != nil && m.opts.RefreshEvery > 0 {
		// Names, attributes and failed lookups expire with the metadata;
		// a refresh that changes them also tells the kernel at once.
		timeout = min(timeout, m.opts.RefreshEvery)
	}
	mo := &gofs.Options{
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
		UID:             m.owner.Uid,
		GID:             m.owner.Gid,
		MountOptions: fuse.MountOptions{
			AllowOther:    m.opts.AllowOther,
			FsName:        m.opts.Layout.SourceID,
			Name:          "zarrfs",
			MaxWrite:      1 << 20, // also max_read: 1 MiB requests
			MaxReadAhead:  1 << 20,
			MaxBackground: m.opts.MaxBackground,
			// Nothing here has extended attributes; saying so saves a
			// getxattr round trip per read on some kernels.
			DisableXAttrs: true,
			// READDIRPLUS only where the reader stats what it lists (ls
			// -l), as the kernel finds out by itself: a plain listing (a
			// glob of a directory of a million samples) then makes the
			// kernel look up, and the daemon keep an inode for, none of
			// its entries.
			ExtraCapabilities: fuse.CAP_READDIRPLUS_AUTO,
			// A backing file may itself live on a stacked filesystem
			// (overlayfs in a container); depth 2 keeps passthrough
			// available there.
			MaxStackDepth: 2,
			Debug:         m.opts.Debug,
			// The read-only flag makes the kernel refuse writes before
			// they reach us; the nodes refuse them too.
			Options:          []string{"ro", "default_permissions"},
			DirectMount:      os.Geteuid() == 0,
			DirectMountFlags: syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV,
		},
	}
	if mo.MaxBackground == 0 {
		mo.MaxBackground = 64
	}
	if m.opts.DisablePassthrough {
		mo.DisabledCapabilities = fuse.CAP_PASSTHROUGH
	}
	return mo
}

// Stats is what a mount did since it started.
type Stats struct {
	// Opens counts opens of sample files (plain mode) and resolutions of
	// their links (direct mode).
	Opens int64
	// OpenFiles is the files open now (plain mode) or leased (direct).
	OpenFiles int64
	// Errors counts failed opens by array or view (Group).
	Errors map[string]int64
}

// Stats returns the counts so far.
func (m *Mounted) Stats() Stats {
	s := Stats{Opens: m.opens.Load(), OpenFiles: m.openFiles.Load() + int64(m.Leased()), Errors: map[string]int64{}}
	m.mu.Lock()
	for k, v := range m.errors {
		s.Errors[k] = v
	}
	m.mu.Unlock()
	return s
}

// Layout returns the tree the mount serves now.
func (m *Mounted) Layout() *layout.Layout { return m.lay.Load() }

// Leased reports how many blobs a direct mount keeps leased now.
func (m *Mounted) Leased() int {
	if m.leases == nil {
		return 0
	}
	return m.leases.held()
}

// end ends the mount's life, at unmount: it cancels the fills in flight,
// stops the refresh loop and waits for it, releases every blob leased by
// direct mode, and stops the inode bound. It may be called again.
func (m *Mounted) end() {
	m.endLife()
	<-m.refreshDone
	if m.leases != nil {
		m.leases.close()
	}
	m.inodes.close()
}

// Passthrough reports whether the kernel accepted FUSE passthrough for this
// mount (reads of opened blobs bypass the daemon).
func (m *Mounted) Passthrough() bool {
	return m.server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0 && !m.opts.DisablePassthrough
}

// Wait blocks until the filesystem is unmounted, then ends the mount
// (fills in flight, refreshes, the leases of direct mode).
func (m *Mounted) Wait() {
	m.server.Wait()
	m.end()
}

// Unmount detaches the filesystem. When files are still open (readers
// active) it detaches lazily: the mountpoint disappears at once, and
// readers keep their open files until the process exits. It waits up to
// grace for the serving loops to finish after a lazy detach.
func (m *Mounted) Unmount(grace time.Duration) error {
	m.unmountOnce.Do(func() {
		done := make(chan error, 1)
		go func() { done <- m.server.Unmount() }()
		select {
		case err := <-done:
			if err == nil {
				return
			}
		case <-time.After(500 * time.Millisecond):
		}
		m.log.Info("mountpoint busy, detaching lazily", "mountpoint", m.opts.Mountpoint)
		if err := lazyUnmount(m.opts.Mountpoint); err != nil {
			m.unmountErr = fmt.Errorf("unmount %s: %w", m.opts.Mountpoint, err)
			return
		}
		w := make(chan struct{})
		go func() { m.server.Wait(); close(w) }()
		select {
		case <-w:
		case <-time.After(grace):
		}
	})
	m.end()
	return m.unmountErr
}

// ClearStale detects a mountpoint left by a daemon that was killed (stat
// fails with ENOTCONN) and detaches it lazily, logging one line.
func ClearStale(mountpoint string, log *slog.Logger) error {
	// statfs always reaches the filesystem, where stat may be answered
	// from attributes the kernel cached before the daemon died.
	var sfs syscall.Statfs_t
	err := syscall.Statfs(mountpoint, &sfs)
	if !errors.Is(err, syscall.ENOTCONN) {
		if _, err = os.Stat(mountpoint); !errors.Is(err, syscall.ENOTCONN) {
			return nil
		}
	}
	if log != nil {
		log.Warn("clearing stale mount left by a killed daemon", "mountpoint", mountpoint, "cause", ErrStaleMount)
	}
	if err := lazyUnmount(mountpoint); err != nil {
		return fmt.Errorf("%s: stale mount (%w) could not be cleared: %v; run: zarrfs unmount %s", mountpoint, ErrStaleMount, err, mountpoint)
	}
	return nil
}

// liveMount reports whether mountpoint is the top of a zarrfs mount, and
// its source, from /proc/self/mountinfo.
func liveMount(mountpoint string) (source string, ok bool) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return "", false
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	mounts, _ := mountinfo.Read()
	for _, e := range mounts {
		// The last matching line is the mount on top.
		if e.Mountpoint == abs {
			source, ok = e.Source, e.FSType == "fuse.zarrfs"
		}
	}
	return source, ok
}

// lazyUnmount detaches a mount even while it is busy.
func lazyUnmount(mp string) error {
	if os.Geteuid() == 0 {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err == nil || errors.Is(err, syscall.EINVAL) {
			return nil
		}
	}
	for _, bin := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(bin); err == nil {
			out, err := exec.Command(p, "-uz", mp).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s -uz: %v: %s", bin, err, out)
			}
			return nil
		}
	}
	return errors.New("no fusermount3 found to unmount")
}

// open returns the blob's backing file, filling it if the cache lacks it
// or holds another version of it, and the identity it was opened under.
//
// The fill runs under the mount's life, not the request's context, which
// go-fuse cancels when the kernel interrupts the request: any signal the
// reader catches does that (a Go program's runtime preempts its threads
// with signals), and answering EINTR then fails an open(2) that SA_RESTART
// promised to restart. A reader killed while it waits is answered by the
// kernel; the fill goes on and serves the next open.
func (m *Mounted) open(b layout.Blob) (fill.Backing, string, error) {
	return m.opts.Blobs.Open(m.life, m.Layout(), b)
}

// errno maps a failed open to the error the reader sees, and logs the cause
// once per failing chunk (or per blob when no chunk is named): the one place
// where errors become errno values.
func (m *Mounted) errno(b layout.Blob, err error) syscall.Errno {
	switch {
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	}
	if errors.Is(err, zarr.ErrMetadataChanged) {
		// The tree names what the store no longer holds: read it again
		// now rather than at the next --metadata-ttl.
		select {
		case m.refreshNow <- struct{}{}:
		default:
		}
	}
	key := b.Path()
	attrs := []any{"file", b.Path()}
	var ce *zarr.ChunkError
	if errors.As(err, &ce) {
		key = ce.Array + "\x00" + ce.Key
		attrs = append(attrs, "array", ce.Array, "chunk", ce.Key, "cause", ce.Err.Error())
	} else {
		if src := b.Sources(); len(src) > 0 && src[0].Array != nil {
			attrs = append(attrs, "array", src[0].Array.Path)
		}
		attrs = append(attrs, "cause", err.Error())
	}
	m.mu.Lock()
	first := !m.reported[key]
	if len(m.reported) >= maxReported {
		clear(m.reported) // bounded: a long outage touches every chunk
	}
	m.reported[key] = true
	if m.errors == nil {
		m.errors = map[string]int64{}
	}
	m.errors[fill.Group(b.Path())]++
	m.mu.Unlock()
	if first {
		m.log.Error("cannot fill file", attrs...)
	} else {
		m.log.Debug("cannot fill file", attrs...)
	}
	return syscall.EIO
}
