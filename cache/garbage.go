package cache

import (
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// BlobEntry is one blob of a layout directory as the index holds it.
type BlobEntry struct {
	Path     string // the mount path ("t/0042.npy")
	Identity string
	Size     int64
}

// Blobs returns every blob indexed under the layout directory, in no
// particular order (what other instances sharing the directory logged
// included).
func (c *Cache) Blobs(layout string) []BlobEntry {
	prefix := blobsDir + "/" + layout + "/"
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.tailLocked()
	var out []BlobEntry
	for key, e := range c.idx {
		if p, ok := strings.CutPrefix(key, prefix); ok {
			out = append(out, BlobEntry{Path: p, Identity: e.ident, Size: e.size})
		}
	}
	return out
}

// Demote makes the given blobs of a layout directory the first to be
// evicted, before any entry in use: garbage the caller knows will not be
// read again (a path its tree no longer has, a stale version). An access
// in the meantime makes a blob recently used again. It returns how many
// it found. The order is not kept across a restart.
func (c *Cache) Demote(layout string, paths []string) int {
	prefix := blobsDir + "/" + layout + "/"
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0
	}
	n := 0
	for _, p := range paths {
		if e := c.idx[prefix+p]; e != nil {
			c.lru.MoveToBack(e.elem)
			n++
		}
	}
	return n
}

// RemoveBlob deletes the blob at the layout directory's path now, whatever
// its identity, unless a Handle in some process holds it open. It reports
// whether the blob is gone (true also when there was none).
func (c *Cache) RemoveBlob(layout, path string) (bool, error) {
	rel, err := BlobKey{Layout: layout, Path: path}.rel()
	if err != nil {
		return false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false, ErrClosed
	}
	c.tailLocked()
	e := c.idx[rel]
	if e == nil {
		return true, nil
	}
	if e.pins > 0 {
		return false, nil
	}
	gone := c.evictOneLocked(e)
	if gone {
		removeEmptyDirs(filepath.Join(c.dir, blobsDir, layout), filepath.Dir(filepath.Join(c.dir, rel)))
	}
	return gone, nil
}

// removeEmptyDirs removes dir and its parents up to (not including) top
// while they are empty.
func removeEmptyDirs(top, dir string) {
	for dir != top && strings.HasPrefix(dir, top+string(filepath.Separator)) {
		if unix.Rmdir(dir) != nil { // fails unless empty
			return
		}
		dir = filepath.Dir(dir)
	}
}
