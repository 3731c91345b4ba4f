package main

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/internal/mountinfo"
)

// A running mount records where its blobs live in a small registry file, so
// that `zarrfs path MOUNT/FILE` can name the backing file without asking
// the daemon (GPUDirect Storage readers need the real file: GDS cannot read
// through FUSE). `zarrfs status` and `zarrfs unmount` find the daemon there
// too, and its status socket beside the record.
type mountRecord struct {
	Mountpoint string `json:"mountpoint"`
	BlobDir    string `json:"blob_dir"`
	Source     string `json:"source"`
	PID        int    `json:"pid"`
	// Started is the daemon's start time (/proc/PID/stat, clock ticks
	// since boot): a PID reused by another process does not match it.
	Started uint64 `json:"started,omitempty"`
}

// registryDirs are the folders mount records live in: first the one that
// depends only on the user ($XDG_RUNTIME_DIR's usual place, /run/user/UID,
// or /run for root, else a per-user folder under /tmp), so that `zarrfs
// path` finds a mount whatever environment either process has; then
// $XDG_RUNTIME_DIR and the temp directory, where older mounts and other
// environments put them.
func registryDirs() []string {
	uid := os.Geteuid()
	var dirs []string
	add := func(d string) {
		if d != "" && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	switch run := fmt.Sprintf("/run/user/%d", uid); {
	case uid == 0:
		add("/run/zarrfs/mounts")
	case ownedDir(run):
		add(filepath.Join(run, "zarrfs", "mounts"))
	default:
		add(filepath.Join("/tmp", fmt.Sprintf("zarrfs-%d", uid), "mounts"))
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		add(filepath.Join(d, "zarrfs", "mounts"))
	}
	add(filepath.Join(os.TempDir(), fmt.Sprintf("zarrfs-%d", uid), "mounts"))
	return dirs
}

// registryDir is the user's own registry folder, the first of
// registryDirs: where records, status sockets and helper logs go.
func registryDir() string { return registryDirs()[0] }

// ownedDir reports whether d is a directory owned by this user.
func ownedDir(d string) bool {
	st, err := os.Stat(d)
	if err != nil || !st.IsDir() {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && sys.Uid == uint32(os.Geteuid())
}

func recordName(mountpoint string) string {
	h := sha256.Sum256([]byte(mountpoint))
	return hex.EncodeToString(h[:8]) + ".json"
}

// recordFile is the record of the mount at mountpoint in the user's own
// registry folder.
func recordFile(mountpoint string) string {
	return filepath.Join(registryDir(), recordName(mountpoint))
}

// privateRegistry creates the registry folder dir (the user's own when
// empty) owner-only and checks that it (and the folder above it, which may
// sit in a shared temporary folder) belongs to the caller: records name
// the cache, which is no one else's to read.
func privateRegistry(dirs ...string) error {
	dir := registryDir()
	if len(dirs) > 0 {
		dir = dirs[0]
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, d := range []string{filepath.Dir(dir), dir} {
		st, err := os.Lstat(d)
		if err != nil {
			return err
		}
		if !st.IsDir() || !ownedByUs(st) {
			return fmt.Errorf("%s: not a folder of this user", d)
		}
		if st.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(d, st.Mode().Perm()&0o700); err != nil {
				return err
			}
		}
	}
	return nil
}

// registerMount writes the record of a live mount into the user's registry
// folder (and $XDG_RUNTIME_DIR's, when that differs); the returned func
// removes it.
func registerMount(mountpoint, blobDir, source string) (func(), error) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	rec := mountRecord{Mountpoint: abs, BlobDir: blobDir, Source: source, PID: os.Getpid()}
	rec.Started, _ = procStarted(rec.PID)
	b, _ := json.Marshal(rec)
	dirs := registryDirs()[:1]
	if xdg := os.Getenv("XDG_RUNTIME_DIR"); xdg != "" {
		if d := filepath.Join(xdg, "zarrfs", "mounts"); d != dirs[0] {
			dirs = append(dirs, d)
		}
	}
	var written []string
	var firstErr error
	for _, d := range dirs {
		f := filepath.Join(d, recordName(abs))
		err := privateRegistry(d)
		if err == nil {
			tmp := f + ".tmp"
			if err = os.WriteFile(tmp, b, 0o600); err == nil {
				err = os.Rename(tmp, f)
			}
		}
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		written = append(written, f)
	}
	if len(written) == 0 {
		return nil, firstErr
	}
	return func() {
		for _, f := range written {
			os.Remove(f)
		}
	}, nil
}

// findMount returns the record of the live mount holding abs, if any.
func findMount(abs string) (*mountRecord, bool) {
	var best *mountRecord
	for _, r := range allMounts() {
		if abs != r.Mountpoint && !strings.HasPrefix(abs, r.Mountpoint+"/") {
			continue
		}
		if best == nil || len(r.Mountpoint) > len(best.Mountpoint) {
			best = r
		}
	}
	return best, best != nil
}

// allMounts returns the records of this user's live mounts in every
// registry folder, one per mount, by mountpoint.
func allMounts() []*mountRecord {
	var out []*mountRecord
	seen := map[string]bool{}
	for _, dir := range registryDirs() {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".json") {
				continue
			}
			p := filepath.Join(dir, e.Name())
			// Trust only records written by this user (or root): the
			// registry may sit in a shared temporary folder.
			if st, err := os.Lstat(p); err != nil || !st.Mode().IsRegular() || !ownedByUs(st) {
				continue
			}
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			var r mountRecord
			if json.Unmarshal(b, &r) != nil {
				continue
			}
			if !r.alive() {
				continue // the daemon is gone
			}
			if k := fmt.Sprint(r.Mountpoint, r.PID); !seen[k] {
				seen[k] = true
				out = append(out, &r)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Mountpoint < out[j].Mountpoint })
	return out
}

func ownedByUs(st os.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && (sys.Uid == uint32(os.Geteuid()) || sys.Uid == 0)
}

func newPathCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "path MOUNT/FILE",
		Short: "Print the cache file that backs a mounted .npy file (for GPUDirect Storage readers)",
		Args:  exactArgs(1, "MOUNT/FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			abs, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			// A mountpoint reached through a symbolic link resolves to the
			// mount; the file itself is not resolved, since in direct mode
			// it is a link into the cache, and resolving it would fill it.
			if real, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
				abs = filepath.Join(real, filepath.Base(abs))
			}
			rec, ok := findMount(abs)
			if !ok {
				return notOurMount(args[0], abs)
			}
			rel := strings.TrimPrefix(strings.TrimPrefix(abs, rec.Mountpoint), "/")
			if rel == "" || !strings.HasSuffix(rel, ".npy") {
				return fmt.Errorf("%s: not a .npy file of the mount (only blobs have backing files)", args[0])
			}
			backing := filepath.Join(rec.BlobDir, filepath.FromSlash(rel))
			if _, err := os.Stat(backing); err != nil {
				if _, err := os.Lstat(abs); err != nil {
					return fmt.Errorf("%s: %w", args[0], err)
				}
				return fmt.Errorf("%s: not in the cache yet (open it once, or run zarrfs warm); it will be %s", args[0], backing)
			}
			fmt.Fprintln(cmd.OutOrStdout(), backing)
			return nil
		},
	}
}

// notOurMount explains why abs has no record: it is not in a zarrfs mount,
// or in one of another user, whose cache files are not the caller's to
// know, or in one whose record this user's registry lacks.
func notOurMount(arg, abs string) error {
	mnt, uid, ok := zarrfsMountOf(abs)
	switch {
	case !ok:
		return fmt.Errorf("%s: not inside a running zarrfs mount", arg)
	case uid != os.Geteuid():
		return fmt.Errorf("%s: the zarrfs mount at %s belongs to %s; zarrfs path answers only for your own mounts",
			arg, mnt, describeUser(uid))
	default:
		return fmt.Errorf("%s: the zarrfs mount at %s is not in %s (started with another XDG_RUNTIME_DIR?)", arg, mnt, registryDir())
	}
}

func describeUser(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		return fmt.Sprintf("%s (uid %d)", u.Username, uid)
	}
	return fmt.Sprintf("uid %d", uid)
}

// zarrfsMountOf finds the innermost zarrfs FUSE mount holding abs in
// /proc/self/mountinfo, and the uid that mounted it (the user_id option).
func zarrfsMountOf(abs string) (mountpoint string, uid int, ok bool) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return "", 0, false
	}
	ours := slices.DeleteFunc(mounts, func(e mountinfo.Entry) bool { _, _, ok := zarrfsMount(e); return !ok })
	e, ok := mountinfo.Containing(ours, abs)
	if !ok {
		return "", 0, false
	}
	return zarrfsMount(e)
}

// zarrfsMount returns the mountpoint and owner (the user_id option) of a
// zarrfs FUSE mount.
func zarrfsMount(e mountinfo.Entry) (mountpoint string, uid int, ok bool) {
	if e.FSType != "fuse.zarrfs" {
		return "", 0, false
	}
	v, found := e.Option("user_id")
	n, err := strconv.Atoi(v)
	if !found || err != nil {
		return "", 0, false
	}
	return e.Mountpoint, n, true
}

// alive reports whether the record's daemon still runs: its PID names a
// live process, started when the daemon did. A daemon
// that died without removing its record (killed, or its machine's PIDs
// wrapped) leaves a PID another process may take.
func (r *mountRecord) alive() bool {
	if !running(r.PID) {
		return false
	}
	if r.Started == 0 {
		return true // a record of an older daemon
	}
	_, started, ok := procStat(r.PID)
	return !ok || started == r.Started
}

// running reports whether pid is a process that has not exited (a zombie
// waiting for its parent has). It may be another user's (root's mount).
func running(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) == syscall.ESRCH {
		return false
	}
	state, _, ok := procStat(pid)
	return !ok || state != 'Z'
}

// procStarted returns a process's start time in clock ticks since boot.
func procStarted(pid int) (uint64, bool) {
	_, started, ok := procStat(pid)
	return started, ok
}

// procStat returns a process's state and start time in clock ticks since
// boot, fields 3 and 22 of /proc/PID/stat.
func procStat(pid int) (state byte, started uint64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return f[0][0], v, err == nil
}
