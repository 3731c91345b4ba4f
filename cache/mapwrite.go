package cache

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/internal/parallel"
)

// A blob's data is tens of megabytes written in one WriteAt. A write(2) of
// it runs on one core for as long as the kernel takes to allocate and copy
// every page (tens of milliseconds for an ERA5-like sample), and two writes to
// one file do not run at once (the inode's lock): that is most of a lone
// fill's latency, which a reader of one sample at a time waits for. So a
// large write reserves its range (fallocate), maps it, and copies into the
// mapping from several goroutines, each populating its piece first
// (MADV_POPULATE_WRITE), so that the work is spread over the cores; the hash
// follows the pieces in order on the writer's goroutine.
//
// Only on tmpfs (mapsWrites), and only while few fills run (fewFills): the
// mapping costs more CPU than write(2) (the kernel zeroes the pages it
// reserves, which a write that covers them whole does not; BENCHMARKS.md,
// tuning choices), which pays only when cores would otherwise
// idle; a warm or a busy epoch, which keeps the cores busy with fills,
// writes with write(2).
//
// The reservation is what makes the mapping safe: once fallocate has
// succeeded the filesystem has the blocks, and a populate that still fails
// returns an error instead of a fault. A filesystem without fallocate, or a
// mapping refused, writes as before.

// mapWriteMin is the smallest write that goes through a mapping.
const mapWriteMin = 8 << 20

// mapPiece is what one goroutine populates and copies at a time.
const mapPiece = 2 << 20

// mapWriters bounds the goroutines copying one write.
const mapWriters = 8

// mapsWrites reports whether the cache's filesystem takes mapped writes
// well: tmpfs only. On ext4 a mapped write cost several times the CPU of
// write(2), each populated page going through the filesystem's write
// fault, and a lone fill's latency did not improve.
func (c *Cache) mapsWrites() bool {
	c.mapOnce.Do(func() {
		var st unix.Statfs_t
		c.mapOK = unix.Statfs(c.inst.dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
	})
	return c.mapOK
}

// fewFills reports whether n fills in flight leave cores idle enough for a
// mapped write: at most one per eight CPUs (one on smaller machines).
func fewFills(n int64) bool { return n <= max(1, int64(runtime.NumCPU()/8)) }

// errNoMap says the filesystem cannot take this write through a mapping;
// the caller writes it with write(2).
var errNoMap = errors.New("cache: write not mapped")

// testMapFault, set by tests, runs before each piece is copied; an error
// it returns fails the piece as a fault in the mapping would.
var testMapFault func(piece int) error

// writeMapped writes p at off of f through a shared mapping of the range.
// It returns errNoMap, having written no data (the range may be reserved),
// when the filesystem cannot;
// otherwise every byte of p is in the file when it returns nil. saw is
// called with the pieces of p in order as each is in place.
func writeMapped(f *os.File, p []byte, off int64, saw func(p []byte, off int64)) error {
	fd := int(f.Fd())
	if err := unix.Fallocate(fd, 0, off, int64(len(p))); err != nil {
		if isNoSpace(err) {
			return &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
		}
		return errNoMap // EOPNOTSUPP and the like
	}
	page := int64(os.Getpagesize())
	base := off &^ (page - 1)
	skip := int(off - base)
	m, err := unix.Mmap(fd, base, skip+len(p), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		// The range stays reserved, which a write(2) fills as well.
		return errNoMap
	}
	defer func() {
		_ = unix.Munmap(m)
		runtime.KeepAlive(f)
	}()

	// Piece i covers m[i*mapPiece:], less the bytes before the data in the
	// first page.
	pieces := (len(m) + mapPiece - 1) / mapPiece
	done := make([]chan error, pieces)
	for i := range done {
		done[i] = make(chan error, 1)
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		parallel.For(pieces, min(mapWriters, runtime.NumCPU()), func(i int) { done[i] <- copyPiece(m, p, skip, i) })
	}()
	var first error
	for i := range pieces {
		if err := <-done[i]; err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		if first == nil {
			lo, hi := pieceRange(i, skip, len(m))
			saw(p[lo-skip:hi-skip], off+int64(lo-skip))
		}
	}
	<-copied
	if first != nil {
		return &os.PathError{Op: "write", Path: f.Name(), Err: first}
	}
	return nil
}

// pieceRange is the part of the mapping (of length total, whose first skip
// bytes precede the data) that piece i copies.
func pieceRange(i, skip, total int) (lo, hi int) {
	return max(i*mapPiece, skip), min((i+1)*mapPiece, total)
}

// copyPiece populates piece i of the mapping m and copies its bytes of p
// there. A fault while copying (a page the filesystem could not give after
// all) is turned into an error rather than the process's end.
func copyPiece(m, p []byte, skip, i int) (err error) {
	lo, hi := pieceRange(i, skip, len(m))
	if testMapFault != nil {
		if err := testMapFault(i); err != nil {
			return err
		}
	}
	// The populate covers whole pages; a piece starts on one (mapPiece is
	// a multiple of the page size and the mapping starts on a page).
	plo := i * mapPiece
	if err := unix.Madvise(m[plo:hi], unix.MADV_POPULATE_WRITE); err != nil && !errors.Is(err, unix.EINVAL) {
		// EINVAL: a kernel before 5.14, which faults the pages in as the
		// copy touches them instead.
		return fmt.Errorf("populate: %w", err)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fault while copying into the mapping: %v: %w", r, syscall.EIO)
		}
	}()
	copy(m[lo:hi], p[lo-skip:hi-skip])
	return nil
}
