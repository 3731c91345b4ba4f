package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/zarrfs/zarrfs/internal/mountinfo"
)

func newUnmountCmd() *cobra.Command {
	var lazy bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "unmount MOUNTPOINT",
		Short: "Unmount a zarrfs mount and wait for its daemon to exit",
		Long: `Stop the daemon serving MOUNTPOINT (SIGTERM: it unmounts, lazily if files
are open, and exits) and wait until it has exited and the mountpoint is
free. With --lazy the mountpoint is detached at once, even while files are
open (they stay readable until closed). A mountpoint left by a daemon that
died is detached too.`,
		Args: exactArgs(1, "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return usagef("--timeout %v: want a positive duration", timeout)
			}
			return unmount(cmd.OutOrStdout(), args[0], lazy, timeout)
		},
	}
	cmd.Flags().BoolVar(&lazy, "lazy", false, "detach the mountpoint at once, even with files open")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the daemon to exit")
	return cmd
}

func unmount(out io.Writer, mountpoint string, lazy bool, timeout time.Duration) error {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	mountpoint = abs // messages name it absolute, as the mount's line does
	stale := staleMount(abs)
	if !stale {
		abs = absMountpoint(abs)
	}
	rec, ok := findMount(abs)
	var inside *mountRecord
	if ok && rec.Mountpoint != abs {
		inside, ok = rec, false // a mount above it, not this one
	}
	if !ok {
		// No daemon of ours: say what is there, and detach only a zarrfs
		// mount (one whose daemon died, or that this user's registry does
		// not know); another filesystem is not ours to unmount.
		e, mounted := mountAt(abs)
		switch {
		case !mounted && stale:
			return fmt.Errorf("%s: transport endpoint is not connected, and not in this process's mount table", mountpoint)
		case !mounted && inside != nil:
			return fmt.Errorf("%s: not a mount point: it is inside the zarrfs mount at %s (zarrfs unmount %s)", mountpoint, inside.Mountpoint, inside.Mountpoint)
		case !mounted:
			if _, err := os.Stat(abs); err != nil {
				return fmt.Errorf("%s: %w", mountpoint, dirErr(err))
			}
			return fmt.Errorf("%s: not mounted", mountpoint)
		case e.FSType != "fuse.zarrfs":
			return fmt.Errorf("%s: mounted as %s (%s), not zarrfs; zarrfs unmount leaves it alone (use umount)", mountpoint, e.FSType, e.Source)
		}
		if err := detach(abs, lazy || stale); err != nil {
			return fmt.Errorf("%s: %w", mountpoint, err)
		}
		if stale {
			fmt.Fprintf(out, "zarrfs: %s: a stale mount (its daemon had died: transport endpoint is not connected); detached\n", mountpoint)
		} else {
			fmt.Fprintf(out, "zarrfs: %s: a zarrfs mount of %s with no daemon in this user's registry (%s); detached\n", mountpoint, e.Source, registryDir())
		}
		return nil
	}
	if lazy {
		if err := detach(abs, true); err != nil {
			return fmt.Errorf("%s: %w", mountpoint, err)
		}
	}
	if err := syscall.Kill(rec.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%s: signal daemon %d: %w", mountpoint, rec.PID, err)
	}
	deadline := time.Now().Add(timeout)
	for running(rec.PID) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: daemon %d still running after %v (files open? try --lazy)", mountpoint, rec.PID, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if mountedAt(abs) {
		return fmt.Errorf("%s: daemon %d exited but the mountpoint is still mounted", mountpoint, rec.PID)
	}
	return nil
}

// detach unmounts p (lazily: even while busy) without a daemon's help.
func detach(p string, lazy bool) error {
	flags := 0
	if lazy {
		flags = syscall.MNT_DETACH
	}
	if os.Geteuid() == 0 {
		if err := syscall.Unmount(p, flags); err == nil {
			return nil
		}
	}
	args := []string{"-u", p}
	if lazy {
		args = []string{"-uz", p}
	}
	for _, bin := range []string{"fusermount3", "fusermount"} {
		if path, err := exec.LookPath(bin); err == nil {
			if out, err := exec.Command(path, args...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %v: %s", bin, err, strings.Join(strings.Fields(string(out)), " "))
			}
			return nil
		}
	}
	return errors.New("cannot unmount: not root and no fusermount3")
}

// mountedAt reports whether p is a mountpoint, from /proc/self/mountinfo.
func mountedAt(p string) bool {
	mounts, _ := mountinfo.Read()
	for _, e := range mounts {
		if e.Mountpoint == p {
			return true
		}
	}
	return false
}
