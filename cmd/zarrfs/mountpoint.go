package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/zarrfs/zarrfs/internal/mountinfo"
)

// checkMountpoint refuses a mountpoint a mount would make a mess of, before
// the source is opened: a path that is missing or not a directory, a
// directory that holds files (the mount would hide them until unmounted,
// and a reader would find the mount's files where it expected its own),
// and a directory that is itself the top of another mount (stacking hides
// that filesystem; a live zarrfs mount is refused with the command that
// stops it). A stale zarrfs mount, left by a killed daemon, is let through:
// the mount clears it first.
func checkMountpoint(mountpoint string) error {
	if staleMount(mountpoint) {
		return nil
	}
	st, err := os.Stat(mountpoint)
	switch {
	case errors.Is(err, syscall.ENOTCONN):
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: no such directory", mountpoint)
	case err != nil:
		return fmt.Errorf("%s: %w", mountpoint, unwrapPath(err))
	case !st.IsDir():
		return fmt.Errorf("%s: not a directory", mountpoint)
	}
	abs := absMountpoint(mountpoint)
	if e, ok := mountAt(abs); ok {
		if e.FSType == "fuse.zarrfs" {
			// As fs.Mount words it, should a mount start there meanwhile.
			return fmt.Errorf("%s: already a zarrfs mount (of %s); unmount it first (zarrfs unmount %s) or choose another directory",
				mountpoint, e.Source, mountpoint)
		}
		return fmt.Errorf("%s: already a mount point (%s %s): a mount there would hide it; choose another directory",
			mountpoint, e.FSType, e.Source)
	}
	d, err := os.Open(mountpoint)
	if err != nil {
		return fmt.Errorf("%s: %w", mountpoint, unwrapPath(err))
	}
	defer d.Close()
	names, err := d.Readdirnames(2)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w", mountpoint, unwrapPath(err))
	}
	if len(names) > 0 {
		what := fmt.Sprintf("%q", filepath.Join(mountpoint, names[0]))
		if len(names) > 1 {
			what += " and more"
		}
		return fmt.Errorf("%s: not empty (holds %s): a mount would hide its files; choose an empty directory", mountpoint, what)
	}
	return nil
}

// staleMount reports whether path is a FUSE mount whose daemon died.
// statfs always reaches the filesystem, where stat may be answered from
// attributes the kernel cached before the daemon died.
func staleMount(path string) bool {
	var sfs syscall.Statfs_t
	return errors.Is(syscall.Statfs(path, &sfs), syscall.ENOTCONN)
}

// mountAt returns the topmost mount whose mountpoint is abs.
func mountAt(abs string) (mountinfo.Entry, bool) {
	mounts, _ := mountinfo.Read()
	var found mountinfo.Entry
	ok := false
	for _, e := range mounts {
		if e.Mountpoint == abs {
			found, ok = e, true
		}
	}
	return found, ok
}

// dirErr words a failed stat of a directory the command line names: "no
// such directory" for one that is missing, else the error without the
// path (the message names it once).
func dirErr(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errors.New("no such directory")
	}
	return unwrapPath(err)
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
