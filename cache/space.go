package cache

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// The cache's filesystem may fill up: the budget was larger than the disk,
// something else writes there, or blocks and journal take more than file
// contents. The cache then makes room itself (evicting least recently used
// entries) and tries again, and it never starts a fill that cannot fit.
// Without a budget (Options.Size 0) the budget is what the filesystem can
// hold, counted in its blocks.

// fsSpace is what statfs says of the cache's filesystem.
type fsSpace struct {
	total, avail, block int64
}

func statSpace(dir string) (fsSpace, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fsSpace{}, err
	}
	b := int64(st.Bsize)
	if b <= 0 {
		b = 4096
	}
	return fsSpace{total: int64(st.Blocks) * b, avail: int64(st.Bavail) * b, block: b}, nil
}

// headroom is the space the derived budget leaves free on a filesystem of
// total bytes, for the journal and directories: a twentieth, between
// 64 KiB and 1 GiB.
func headroom(total int64) int64 {
	return min(max(total/20, 64<<10), 1<<30)
}

// isNoSpace reports whether err means the filesystem (or the quota) is full.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// charge is what an entry of n bytes counts against the budget: n, or its
// blocks when the budget is the filesystem's.
func (c *Cache) charge(n int64) int64 {
	if n <= 0 {
		return n
	}
	return roundUp(n, c.unit)
}

// deriveBudget sets the budget from the filesystem: what the cache holds
// plus what is free, less headroom. An explicit budget larger than that is
// lowered to it, with a warning, since the disk could never hold it.
func (c *Cache) deriveBudget(explicit int64) {
	sp, err := statSpace(c.dir)
	if err != nil {
		return
	}
	fits := max(c.used+sp.avail-headroom(sp.total), sp.block)
	switch {
	case explicit == 0:
		c.budget, c.derived = fits, true
	case explicit > fits:
		c.log.Warn("cache budget larger than the cache's filesystem can hold; using what it can", "budget", explicit, "fits", fits)
		c.budget = fits
	}
}

// ensureSpace refuses, before any work, a blob that cannot fit the cache's
// filesystem, and makes room for one that fits only after evicting.
func (c *Cache) ensureSpace(rel string, size int64) error {
	sp, err := statSpace(c.dir)
	if err != nil {
		return nil // no statfs: let the write tell
	}
	if c.derived {
		// Space freed by others since Open raises a budget that is the
		// filesystem's (a lower one comes from evicting when it is full).
		c.mu.Lock()
		c.budget = max(c.budget, c.used+sp.avail-headroom(sp.total))
		c.mu.Unlock()
	}
	need := roundUp(size, sp.block)
	if need > sp.total {
		return fmt.Errorf("blob %s: %d bytes do not fit the cache's filesystem (%d bytes in all): %w", rel, size, sp.total, syscall.ENOSPC)
	}
	if need <= sp.avail {
		return nil
	}
	c.mu.Lock()
	room := c.makeRoomLocked(need)
	c.mu.Unlock()
	if !room {
		if sp, err = statSpace(c.dir); err == nil && need > sp.avail {
			return fmt.Errorf("blob %s: %d bytes do not fit the %d bytes free on the cache's filesystem, with every unpinned entry evicted: %w", rel, size, sp.avail, syscall.ENOSPC)
		}
	}
	return nil
}

// roundUp rounds n up to whole blocks.
func roundUp(n, block int64) int64 {
	if block <= 1 {
		return n
	}
	return (n + block - 1) / block * block
}

// makeRoomLocked evicts least recently used, unpinned entries until the
// filesystem has need bytes free, or nothing more can go. It reports
// whether the room is there: made by these evictions, or by others
// meanwhile (concurrent fills evict too, and a fill that failed removed
// its temp file), so that a write that found the filesystem full is tried
// again whenever it may succeed, and given up only when nothing is left to
// evict (or free: see writeback.flush). An eviction whose journal record cannot be written (the
// journal's filesystem is the full one) still unlinks the file: an
// indexed entry without its file is forgotten on first use, by every
// instance, and at the next recovery.
func (c *Cache) makeRoomLocked(need int64) bool {
	skipped, flushed := 0, false
	for {
		sp, err := statSpace(c.dir)
		if err != nil || sp.avail >= need {
			return true // no statfs: let the write tell
		}
		victim := c.victimLocked()
		if skipped >= c.lru.Len() || victim == nil {
			if flushed {
				return false
			}
			// Evicted blobs whose writeback has not started yet still
			// hold their blocks (writeback.flush): once those are
			// released, look again.
			c.wb.flush()
			flushed = true
			continue
		}
		if !c.evictEntryLocked(victim, true) {
			c.lru.MoveToFront(victim.elem)
			skipped++
		}
	}
}

// maxFullRetries bounds the attempts of one write on a full filesystem:
// each is made only when makeRoomLocked found the room, which concurrent
// writers may take first; this many in a row is not contention but a
// filesystem that keeps filling.
const maxFullRetries = 64

// whileFull runs write, a blob's fill or a chunk's store of size bytes at
// rel, and runs it again each time it finds the filesystem full and room
// for it can be made (makeRoomLocked), maxFullRetries times in all, until
// ctx ends. A write given up on because nothing is left to evict says so.
// The first retry of a write is logged.
func (c *Cache) whileFull(ctx context.Context, rel string, size int64, write func() error) error {
	for attempt := 1; ; attempt++ {
		err := write()
		if err == nil || !isNoSpace(err) || attempt == maxFullRetries || ctx.Err() != nil {
			return err
		}
		c.mu.Lock()
		room := c.makeRoomLocked(c.charge(size) + c.unit)
		c.mu.Unlock()
		if !room {
			return fmt.Errorf("%w, with every unpinned entry evicted", err)
		}
		if attempt == 1 {
			c.log.Info("cache filesystem full; evicted entries and writing again", "file", rel, "err", err)
		}
	}
}

// Keeps reports whether a blob of size bytes is kept once filled: one
// larger than the whole budget is served from an unlinked file instead.
func (c *Cache) Keeps(size int64) bool { return c.keeps(size, c.Budget()) }

func (c *Cache) keeps(size, budget int64) bool { return budget <= 0 || c.charge(size) <= budget }

// BudgetFromFilesystem reports whether the budget is what the cache's
// filesystem can hold, rather than a size given.
func (c *Cache) BudgetFromFilesystem() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.derived
}

// Budget is the cache's byte budget now (see Options.Size).
func (c *Cache) Budget() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.budget
}
