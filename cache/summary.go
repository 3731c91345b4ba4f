package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
)

// Summary is what a cache directory holds, read from its journal without
// opening the cache (no lock taken, nothing recovered or written), for
// `zarrfs status --cache`.
type Summary struct {
	Dir           string
	Blobs, Chunks int
	BlobBytes     int64
	ChunkBytes    int64
	Layouts       []LayoutSummary
	// Running counts the instances (mounts, warms) using the cache now.
	Running int
}

// LayoutSummary is the blobs of one layout directory.
type LayoutSummary struct {
	ID    string
	Blobs int
	Bytes int64
}

// Summarize reads the journal of the cache at dir. Entries a running
// instance has not logged yet are missing, and entries a killed one left
// are counted until the next Open checks them.
func Summarize(dir string) (Summary, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Summary{}, err
	}
	s := Summary{Dir: abs}
	buf, err := os.ReadFile(filepath.Join(abs, journalRel))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(abs); serr != nil {
			return s, fmt.Errorf("cache %s: %w", abs, serr)
		}
		return s, nil // a cache never written to
	}
	if err != nil {
		return s, fmt.Errorf("cache %s: %w", abs, err)
	}
	if err := checkHeader(buf); err != nil {
		return s, fmt.Errorf("cache %s: journal: %w", abs, err)
	}
	live := map[string]int64{}
	scanRecords(buf[len(journalHeader):], map[string]string{}, func(r record) {
		switch r.op {
		case opAdd:
			live[r.key] = r.size
		case opDel:
			delete(live, r.key)
		}
	})
	layouts := map[string]*LayoutSummary{}
	for key, size := range live {
		top, rest, _ := cutFirst(key)
		switch top {
		case blobsDir:
			s.Blobs++
			s.BlobBytes += size
			id, _, _ := cutFirst(rest)
			l := layouts[id]
			if l == nil {
				l = &LayoutSummary{ID: id}
				layouts[id] = l
			}
			l.Blobs++
			l.Bytes += size
		case chunksDir:
			s.Chunks++
			s.ChunkBytes += size
		}
	}
	for _, l := range layouts {
		s.Layouts = append(s.Layouts, *l)
	}
	sort.Slice(s.Layouts, func(i, j int) bool { return s.Layouts[i].ID < s.Layouts[j].ID })
	// A live instance holds its temp lock exclusively.
	locks, _ := filepath.Glob(filepath.Join(abs, tmpDir, "*.lock"))
	for _, lp := range locks {
		f, err := os.Open(lp)
		if err != nil {
			continue
		}
		if flock(f, syscall.LOCK_SH|syscall.LOCK_NB) != nil {
			s.Running++
		}
		f.Close()
	}
	return s, nil
}
