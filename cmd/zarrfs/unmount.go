package main

import (
	"errors"
	"fmt"
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
			return unmount(args[0], lazy, timeout)
		},
	}
	cmd.Flags().BoolVar(&lazy, "lazy", false, "detach the mountpoint at once, even with files open")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the daemon to exit")
	return cmd
}

func init() { rootCmd.AddCommand(newUnmountCmd()) }

func unmount(mountpoint string, lazy bool, timeout time.Duration) error {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	var sfs syscall.Statfs_t
	stale := errors.Is(syscall.Statfs(abs, &sfs), syscall.ENOTCONN)
	if !stale {
		abs = absMountpoint(abs)
	}
	rec, ok := findMount(abs)
	if ok && rec.Mountpoint != abs {
		ok = false // a mount above it, not this one
	}
	if !ok {
		if !stale && !mountedAt(abs) {
			return fmt.Errorf("%s: not mounted", mountpoint)
		}
		// No daemon of ours (it died, or another tool mounted it): detach.
		if err := detach(abs, lazy || stale); err != nil {
			return fmt.Errorf("%s: %w", mountpoint, err)
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
