package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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

// registryDir is $XDG_RUNTIME_DIR/zarrfs/mounts, /run/zarrfs/mounts for
// root, else a per-user folder under the temp directory.
func registryDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "zarrfs", "mounts")
	}
	if os.Geteuid() == 0 {
		return "/run/zarrfs/mounts"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("zarrfs-%d", os.Geteuid()), "mounts")
}

func recordFile(mountpoint string) string {
	h := sha256.Sum256([]byte(mountpoint))
	return filepath.Join(registryDir(), hex.EncodeToString(h[:8])+".json")
}

// registerMount writes the record of a live mount; the returned func removes it.
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
	if err := os.MkdirAll(registryDir(), 0o700); err != nil {
		return nil, err
	}
	f := recordFile(abs)
	tmp := f + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, f); err != nil {
		return nil, err
	}
	return func() { os.Remove(f) }, nil
}

// findMount returns the record of the live mount holding abs, if any.
func findMount(abs string) (*mountRecord, bool) {
	ents, _ := os.ReadDir(registryDir())
	var best *mountRecord
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(registryDir(), e.Name())
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
