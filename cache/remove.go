package cache

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// RemoveEmpty removes the cache directory dir when no instance has it open
// and it holds nothing cached: no journal record of an entry, no file
// under blobs/ or chunks/. It is for a command that made dir (Open makes
// it) and then failed before it cached anything: a first run with a
// mistake leaves no directory behind. It reports whether dir is gone.
func RemoveEmpty(dir string) bool {
	lf, err := os.OpenFile(filepath.Join(dir, lockRel), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer lf.Close()
	// Exclusive: no Cache in any process has dir open, and none can open
	// it until the lock goes with the directory.
	if ofdLock(lf, syscall.F_WRLCK, false) != nil {
		return false
	}
	j, err := os.ReadFile(filepath.Join(dir, journalRel))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if len(j) > 0 {
		if checkHeader(j) != nil {
			return false
		}
		adds := 0
		scanRecords(j[len(journalHeader):], map[string]string{}, func(r record) {
			if r.op == opAdd {
				adds++
			}
		})
		if adds > 0 {
			return false
		}
	}
	for _, d := range []string{blobsDir, chunksDir} {
		found := false
		filepath.WalkDir(filepath.Join(dir, d), func(_ string, e fs.DirEntry, err error) error {
			if err != nil && !errors.Is(err, fs.ErrNotExist) || err == nil && !e.IsDir() {
				found = true
				return filepath.SkipAll
			}
			return nil
		})
		if found {
			return false
		}
	}
	return os.RemoveAll(dir) == nil
}
