package fs

import (
	"bytes"
	"context"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/zarrfs/zarrfs/layout"
)

// maxNewNames bounds the new names of one directory the kernel is told
// about at a refresh; any further ones it learns when its cached failed
// lookups expire (the negative timeout is the refresh interval).
const maxNewNames = 4096

// refreshLoop builds the tree anew every RefreshEvery, and when a fill
// found the metadata changed, until the mount's life ends (Mounted.end),
// which also cancels a refresh in flight.
func (m *Mounted) refreshLoop() {
	defer close(m.refreshDone)
	t := time.NewTicker(m.opts.RefreshEvery)
	defer t.Stop()
	for {
		select {
		case <-m.life.Done():
			return
		case <-t.C:
		case <-m.refreshNow:
			m.log.Info("re-reading the metadata now: a chunk it names is gone")
			t.Reset(m.opts.RefreshEvery)
		}
		m.refresh(m.life)
	}
}

// refresh swaps in a new layout and tells the kernel what changed.
func (m *Mounted) refresh(ctx context.Context) {
	start := time.Now()
	cur := m.Layout()
	next, err := m.opts.Refresh(ctx, cur)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("re-reading the metadata failed; serving the tree as it was", "err", err)
		}
		return
	}
	if next.ID != cur.ID {
		// The cache directory names the source and the options, which a
		// refresh cannot change.
		m.log.Error("refresh produced a layout of another source; ignored", "was", cur.ID, "now", next.ID)
		next.Close()
		return
	}
	if m.opts.Direct {
		m.warnShadowed(cur, next)
	}
	m.lay.Store(next)
	n := m.notify(cur, next)
	cur.Close()
	m.log.Debug("metadata refreshed", "files", next.Files, "kernel_notified", n, "duration", time.Since(start))
}

// notify tells the kernel which of the names, listings and files it may
// have cached changed between old and new: the listing of every directory
// whose names changed, every name that no longer exists or changed kind,
// new names (their failed lookups may be cached), and the data and size of
// sidecars and whole-array files whose bytes changed. Only inodes the
// kernel knows are walked. It returns the number of notifications sent.
func (m *Mounted) notify(old, new *layout.Layout) int {
	n := m.notifyDir(&m.root.Inode, "", old, new, false)
	if m.opts.Direct {
		if mirror := m.root.GetChild(resolveDir); mirror != nil {
			n += m.notifyDir(mirror, "", old, new, true)
		}
	}
	return n
}

func (m *Mounted) notifyDir(in *gofs.Inode, p string, old, new *layout.Layout, mirror bool) int {
	oe, _ := old.Lookup(p)
	ne, _ := new.Lookup(p)
	if oe.Kind != layout.KindDir || ne.Kind != layout.KindDir {
		return 0
	}
	sent := 0
	od, nd := oe.Dir, ne.Dir
	same := od.SameNames(nd)
	if !same {
		if !mirror {
			in.NotifyContent(0, 0) // the cached listing
			sent++
		}
		// Names that appeared: the kernel may hold failed lookups of them.
		for i, k := 0, 0; i < nd.Len() && k < maxNewNames; i++ {
			name := nd.Entry(i).Name
			if _, ok := od.Lookup(name); !ok {
				in.NotifyEntry(name)
				sent++
				k++
			}
		}
	}
	for name, child := range in.Children() {
		cp := name
		if p != "" {
			cp = p + "/" + name
		}
		if p == "" && name == resolveDir && !mirror {
			continue // the mirror, walked on its own
		}
		o, ook := old.Lookup(cp)
		e, ok := new.Lookup(cp)
		if !ok || !ook || e.Kind != o.Kind {
			in.NotifyEntry(name)
			sent++
			continue
		}
		switch e.Kind {
		case layout.KindDir:
			// A sample directory's files change only with its names.
			if !e.Dir.IsSampleDir() || !o.Dir.SameNames(e.Dir) {
				sent += m.notifyDir(child, cp, old, new, mirror)
			}
		case layout.KindSidecar:
			if !bytes.Equal(o.Data, e.Data) {
				child.NotifyContent(0, 0)
				sent++
			}
		case layout.KindBlob:
			// A sample's size never changes; a whole array's does when it
			// grows. Samples whose bytes change are replaced by a new
			// backing file, which their next open tells the kernel about.
			if !mirror && o.Blob.Size() != e.Blob.Size() {
				child.NotifyContent(0, 0)
				sent++
			}
		}
	}
	return sent
}
