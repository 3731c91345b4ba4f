package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Open file description locks (Linux 3.15+). Unlike flock, converting an
// OFD read lock into a write lock with F_OFD_SETLK either succeeds or fails
// with EAGAIN leaving the read lock in place, which is what lets a running
// instance try "am I alone?" and compact the journal without ever dropping
// its share of the directory lock. They belong to the open file, not the
// process, so two Cache values in one process exclude each other exactly as
// two processes do (the tests rely on this).
const (
	fOFDSetLK  = 37 // F_OFD_SETLK
	fOFDSetLKW = 38 // F_OFD_SETLKW
)

// ofdLock sets the whole-file lock typ (syscall.F_RDLCK, F_WRLCK, F_UNLCK)
// on f. Without wait it returns an error wrapping syscall.EAGAIN when
// another open file holds a conflicting lock.
func ofdLock(f *os.File, typ int16, wait bool) error {
	lk := syscall.Flock_t{Type: typ, Whence: 0, Start: 0, Len: 0}
	cmd := fOFDSetLK
	if wait {
		cmd = fOFDSetLKW
	}
	for {
		err := syscall.FcntlFlock(f.Fd(), cmd, &lk)
		if err != syscall.EINTR {
			return err
		}
	}
}

func isWouldBlock(err error) bool {
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EACCES)
}

// flock takes a BSD lock on f, retrying on EINTR. Blob files use these:
// a Handle holds LOCK_SH on its descriptor for as long as it is open, and an
// evictor (in any process) must get LOCK_EX|LOCK_NB before it unlinks, so a
// file open by a reader anywhere is never unlinked.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// sameFile reports whether path still names the file open as f. A reader
// that waited for its lock re-checks this: the file may have been evicted
// (unlinked) between its open and its lock.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	if err != nil {
		return false
	}
	return os.SameFile(a, b)
}

// instance is one live Cache's private temp directory, tmp/<id>/, guarded
// by tmp/<id>.lock held with LOCK_EX for the life of the Cache. A temp
// directory whose lock file anyone can lock belongs to a process that died:
// its files are torn fills, removed at the next Open in any process.
type instance struct {
	id   string
	dir  string
	lock *os.File
}

func newInstance(tmpRoot string) (*instance, error) {
	for attempt := 0; ; attempt++ {
		id := randomID()
		lp := filepath.Join(tmpRoot, id+".lock")
		f, err := os.OpenFile(lp, os.O_RDWR|os.O_CREATE|os.O_EXCL, privateFile)
		if err != nil {
			if errors.Is(err, os.ErrExist) && attempt < 10 {
				continue
			}
			return nil, fmt.Errorf("cache temp lock %s: %w", lp, err)
		}
		if err := flock(f, syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("cache temp lock %s: %w", lp, err)
		}
		// A sweeper may have locked and removed the fresh file before we
		// locked it; then our lock is on an orphan inode. Start over.
		if !sameFile(f, lp) {
			f.Close()
			continue
		}
		dir := filepath.Join(tmpRoot, id)
		if err := os.Mkdir(dir, privateDir); err != nil {
			f.Close()
			os.Remove(lp)
			return nil, fmt.Errorf("cache temp dir %s: %w", dir, err)
		}
		return &instance{id: id, dir: dir, lock: f}, nil
	}
}

// close removes the temp directory, then the lock file, then releases the
// lock, in that order so a sweeper never sees a lockable directory that is
// still in use.
func (in *instance) close() {
	os.RemoveAll(in.dir)
	os.Remove(in.lock.Name())
	in.lock.Close()
}

// sweepTemps removes the temp directories of dead instances and returns how
// many files it removed. With exclusive set (the caller holds the directory
// lock for writing, so no other instance is alive) it also removes stray
// entries that have no lock file at all.
func sweepTemps(tmpRoot, self string, exclusive bool) (int, error) {
	ents, err := os.ReadDir(tmpRoot)
	if err != nil {
		return 0, fmt.Errorf("cache temp dir %s: %w", tmpRoot, err)
	}
	locks := map[string]bool{}
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".lock"); ok {
			locks[id] = true
		}
	}
	removed := 0
	count := func(p string) {
		filepath.WalkDir(p, func(_ string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				removed++
			}
			return nil
		})
	}
	for id := range locks {
		if id == self {
			continue
		}
		lp := filepath.Join(tmpRoot, id+".lock")
		f, err := os.OpenFile(lp, os.O_RDWR, 0)
		if err != nil {
			continue // removed by another sweeper meanwhile
		}
		if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close() // alive
			continue
		}
		d := filepath.Join(tmpRoot, id)
		count(d)
		os.RemoveAll(d)
		os.Remove(lp)
		f.Close()
	}
	if exclusive {
		for _, e := range ents {
			name := e.Name()
			id, isLock := strings.CutSuffix(name, ".lock")
			if isLock || id == self || locks[id] {
				continue // lock files, and directories handled above
			}
			p := filepath.Join(tmpRoot, name)
			count(p)
			os.RemoveAll(p)
		}
	}
	return removed, nil
}
