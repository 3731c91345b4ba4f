package main

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// A running mount records where its blobs live in a small registry file, so
// that `zarrfs path MOUNT/FILE` can name the backing file without asking
// the daemon (GPUDirect Storage readers need the real file: GDS cannot read
// through FUSE).
type mountRecord struct {
	Mountpoint string `json:"mountpoint"`
	BlobDir    string `json:"blob_dir"`
	Source     string `json:"source"`
	PID        int    `json:"pid"`
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
	b, _ := json.Marshal(rec)
	dirs := registryDirs()
	if os.Getenv("XDG_RUNTIME_DIR") != "" {
		dirs = dirs[:min(2, len(dirs))]
	} else {
		dirs = dirs[:1]
	}
	var written []string
	var firstErr error
	for _, d := range dirs {
		f := filepath.Join(d, recordName(abs))
		err := os.MkdirAll(d, 0o700)
		if err == nil {
			tmp := f + ".tmp"
			if err = os.WriteFile(tmp, b, 0o644); err == nil {
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
	for _, dir := range registryDirs() {
		if r, ok := findMountIn(dir, abs); ok && (best == nil || len(r.Mountpoint) > len(best.Mountpoint)) {
			best = r
		}
	}
	return best, best != nil
}

func findMountIn(dir, abs string) (*mountRecord, bool) {
	ents, _ := os.ReadDir(dir)
	var best *mountRecord
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		// Trust only records written by this user (or root): the registry
		// may sit in a shared temporary folder.
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
		if abs != r.Mountpoint && !strings.HasPrefix(abs, r.Mountpoint+"/") {
			continue
		}
		if syscall.Kill(r.PID, 0) == syscall.ESRCH {
			continue // the daemon is gone
		}
		if best == nil || len(r.Mountpoint) > len(best.Mountpoint) {
			best = &r
		}
	}
	return best, best != nil
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
				return fmt.Errorf("%s: not inside a running zarrfs mount", args[0])
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

func init() { rootCmd.AddCommand(newPathCmd()) }
