package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	zfs "github.com/zarrfs/zarrfs/fs"
	"github.com/zarrfs/zarrfs/fs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

func init() { rootCmd.AddCommand(newMountCmd()) }

// mountFlags holds the flags of `zarrfs mount`.
type mountFlags struct {
	src        sourceFlags
	cacheDir   string
	cacheSize  string
	sampleDim  string
	align      int64
	allowOther bool
	noPassthru bool
	// --view, --decode, --readahead and --metrics go here.
}

func newMountCmd() *cobra.Command {
	var f mountFlags
	cmd := &cobra.Command{
		Use:   "mount SOURCE MOUNTPOINT",
		Short: "Mount a Zarr store as a read-only tree of .npy files (foreground; Ctrl-C unmounts)",
		Long: `Mount a Zarr store (local path, file:// or s3:// URL) at MOUNTPOINT.

Every array with a sample dimension (--sample-dim, default "time") becomes a
directory of one .npy file per sample; every other array one .npy file; each
array also gets a .json description. Files are decoded on first open into the
--cache directory and read from there. Runs in the foreground until SIGINT or
SIGTERM, then unmounts.`,
		Args: exactArgs(2, "SOURCE and MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMount(cmd, &f, args[0], args[1])
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cacheDir, "cache", "", "cache directory for decoded blobs (default $XDG_CACHE_HOME/zarrfs or ~/.cache/zarrfs)")
	fl.StringVar(&f.cacheSize, "cache-size", "0", "cache budget, such as 500GiB; 0 means unlimited")
	fl.StringVar(&f.sampleDim, "sample-dim", layout.DefaultSampleDim, "dimension whose indices become one file each")
	fl.Int64Var(&f.align, "align", layout.DefaultAlign, "offset of the data in every .npy file (multiple of 64)")
	fl.BoolVar(&f.allowOther, "allow-other", false, "let other users read the mount (needs user_allow_other in /etc/fuse.conf when not root)")
	fl.BoolVar(&f.noPassthru, "no-passthrough", false, "serve reads through the daemon even where the kernel supports FUSE passthrough")
	_ = fl.MarkHidden("no-passthrough")
	f.src.register(cmd)
	// Flags still to come (owned by the command-line wiring): --view FILE
	// (repeatable), --decode auto|cpu|gpu, --readahead N, --metrics ADDR.
	return cmd
}

// defaultCacheDir is $XDG_CACHE_HOME/zarrfs, else ~/.cache/zarrfs.
func defaultCacheDir() (string, error) {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "zarrfs"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no --cache given and no home directory: %w", err)
	}
	return filepath.Join(home, ".cache", "zarrfs"), nil
}

// openSource opens the store a mount serves: a local path or file:// URL,
// or an s3:// URL through the shared S3 flags.
func openSource(ctx context.Context, f *sourceFlags, src string) (objectstore.Store, error) {
	return f.openStore(ctx, src)
}

func runMount(cmd *cobra.Command, f *mountFlags, src, mountpoint string) error {
	ctx := cmd.Context()
	log, err := newLogger(cmd)
	if err != nil {
		return err
	}
	f.src.logger = log
	size, err := cache.ParseSize(f.cacheSize)
	if err != nil {
		return usagef("--cache-size %q: %v", f.cacheSize, err)
	}
	if f.align%64 != 0 || f.align <= 0 || f.align > layout.MaxAlign {
		return usagef("--align %d: want a positive multiple of 64 up to %d", f.align, layout.MaxAlign)
	}
	if f.sampleDim == "" {
		return usagef("--sample-dim: empty name")
	}
	if f.cacheDir == "" {
		if f.cacheDir, err = defaultCacheDir(); err != nil {
			return usagef("%v", err)
		}
	}
	st, err := os.Stat(mountpoint)
	if err != nil && !errors.Is(err, syscall.ENOTCONN) {
		return fmt.Errorf("%s: %w", mountpoint, err)
	}
	if err == nil && !st.IsDir() {
		return fmt.Errorf("%s: not a directory", mountpoint)
	}

	store, err := openSource(ctx, &f.src, src)
	if err != nil {
		return err
	}
	h, err := zarr.Open(ctx, store, zarr.Options{Logger: log})
	if err != nil {
		return err
	}
	l, err := layout.Build(h, layout.Options{SampleDim: f.sampleDim, Align: f.align})
	if err != nil {
		return fmt.Errorf("%s: %w", store.ID(), err)
	}
	// zarr.Open already warned about each unsupported array; warn here
	// only about what the layout itself left out (name collisions).
	unsupported := map[string]bool{}
	for _, a := range h.Arrays {
		unsupported[a.Path] = a.Unsupported != ""
	}
	for _, s := range l.Skipped {
		if !unsupported[s.Path] {
			log.Warn("array left out of the mount", "array", s.Path, "reason", s.Reason)
		}
	}
	c, err := cache.Open(cache.Options{Dir: f.cacheDir, Size: size, Logger: log})
	if err != nil {
		return err
	}
	defer c.Close()

	m, err := zfs.Mount(ctx, zfs.Options{
		Mountpoint:         mountpoint,
		Layout:             l,
		Blobs:              zfs.CacheBlobs(c),
		Logger:             log,
		AllowOther:         f.allowOther,
		DisablePassthrough: f.noPassthru,
	})
	if err != nil {
		return err
	}
	log.Debug("mount settings", "layout", l.ID, "cache", c.BlobDir(l.ID), "passthrough", m.Passthrough())
	fmt.Fprintf(cmd.OutOrStdout(), "zarrfs: mounted %s at %s (%s arrays, %s files)\n",
		store.ID(), mountpoint, thousands(int64(l.Arrays)), thousands(l.Files))

	served := make(chan struct{})
	go func() { m.Wait(); close(served) }()
	select {
	case <-ctx.Done():
		// SIGINT/SIGTERM: unmount, lazily if readers hold files open.
		if err := m.Unmount(2 * time.Second); err != nil {
			return err
		}
		log.Info("unmounted", "mountpoint", mountpoint)
	case <-served:
		// Unmounted from outside (fusermount3 -u, umount).
		log.Info("unmounted externally", "mountpoint", mountpoint)
	}
	return nil
}

// thousands formats n with comma separators: 1234567 -> "1,234,567".
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
