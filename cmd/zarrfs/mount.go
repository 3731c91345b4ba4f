package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/fill"
	zfs "github.com/zarrfs/zarrfs/fs"
	"github.com/zarrfs/zarrfs/layout"
)

// mountFlags holds the flags of `zarrfs mount`.
type mountFlags struct {
	layoutFlags
	allowOther bool
	noPassthru bool
	readahead  int
	metrics    string
	direct     bool
	lease      time.Duration
	rank       int
	world      int
	shard      string
	ttl        time.Duration
	delivery   string
}

func newMountCmd() *cobra.Command {
	var f mountFlags
	cmd := &cobra.Command{
		Use:   "mount SOURCE MOUNTPOINT",
		Short: "Mount a Zarr store as a read-only tree of .npy files (foreground; Ctrl-C unmounts)",
		Long: `Mount a Zarr store (local path, file://, s3://, gs://, http:// or https:// URL) at MOUNTPOINT.

Every array with a sample dimension (--sample-dim, default "time,valid_time") becomes a
directory of one .npy file per sample; every other array one .npy file; each
array also gets a .json description. Files are decoded on first open into the
--cache directory and read from there. Runs in the foreground until SIGINT or
SIGTERM, then unmounts.`,
		Args: exactArgs(2, "SOURCE and MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			// The log file the mount helper made for this daemon goes once
			// the mount ends cleanly; after a crash it stays, for whoever
			// looks.
			helperLog := os.Getenv(helperLogEnv)
			os.Unsetenv(helperLogEnv)
			// Every message, and the line that says the mount is live,
			// names the mountpoint by its absolute path.
			mnt, err := filepath.Abs(args[1])
			if err != nil {
				mnt = args[1]
			}
			err = runMount(cmd, &f, args[0], mnt)
			if err == nil && helperLog != "" {
				os.Remove(helperLog)
			}
			return err
		},
	}
	f.layoutFlags.register(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&f.allowOther, "allow-other", false, "let other users read the mount (needs user_allow_other in /etc/fuse.conf when not root)")
	fl.IntVar(&f.readahead, "readahead", 16, fmt.Sprintf("samples filled in the background ahead of a reader walking a sample directory in order, 0 (off) to %d", maxReadahead))
	fl.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on this address (host:port); off unless given")
	fl.BoolVar(&f.direct, "direct", false, "make every .npy file a symbolic link to its blob in the cache, for GPUDirect Storage readers (DALI device=\"gpu\", kvikio); resolving a link fills it")
	fl.DurationVar(&f.lease, "lease", zfs.DefaultLease, "with --direct: how long a blob whose link was resolved is kept from eviction")
	fl.IntVar(&f.rank, "rank", 0, "list only this rank's samples in every sample directory (with --world), as zarrfs warm --rank splits them")
	fl.IntVar(&f.world, "world", 1, "number of ranks sharing the samples")
	fl.StringVar(&f.shard, "shard", "contiguous", "how samples are split among ranks: contiguous or interleaved")
	fl.DurationVar(&f.ttl, "metadata-ttl", time.Minute, "re-read the metadata and list the arrays read after this long, so appended time steps and rewritten chunks show; 0: never")
	fl.BoolVar(&f.noPassthru, "no-passthrough", false, "serve reads through the daemon even where the kernel supports FUSE passthrough")
	_ = fl.MarkHidden("no-passthrough")
	registerDeliveryFlag(cmd, &f.delivery)
	return cmd
}

// validate checks the flags of mount that the layout flags do not cover,
// all before anything is opened, and returns the rank's shard.
func (f *mountFlags) validate(cmd *cobra.Command, src string) (layout.Shard, error) {
	if err := f.src.validate(cmd, src); err != nil {
		return layout.Shard{}, err
	}
	if err := checkCount("readahead", f.readahead, 0, maxReadahead); err != nil {
		return layout.Shard{}, err
	}
	if cmd.Flags().Changed("lease") && !f.direct {
		// Refused, not ignored: without --direct nothing is leased, and
		// the user who asked for leases likely forgot --direct.
		return layout.Shard{}, usagef("--lease %v: leases apply to --direct mounts only (add --direct, or leave --lease out)", f.lease)
	}
	if f.lease <= 0 {
		return layout.Shard{}, usagef("--lease %v: want a positive duration", f.lease)
	}
	if f.ttl < 0 {
		return layout.Shard{}, usagef("--metadata-ttl %v: want 0 (never) or a positive duration", f.ttl)
	}
	if f.metrics != "" {
		if err := checkMetricsAddr(f.metrics); err != nil {
			return layout.Shard{}, err
		}
	}
	if err := checkDelivery(f.delivery); err != nil {
		return layout.Shard{}, err
	}
	shard, err := checkShard(f.rank, f.world, f.shard)
	if err != nil {
		return layout.Shard{}, err
	}
	return shard, checkShardGiven(cmd, f.world)
}

func runMount(cmd *cobra.Command, f *mountFlags, src, mountpoint string) error {
	ctx := cmd.Context()
	started := time.Now()
	log, err := newLogger(cmd)
	if err != nil {
		return err
	}
	f.src.logger = log
	// The bound on the shutdown (boundShutdown) ends with the last of
	// what the shutdown gives back, deferred below.
	var bound *time.Timer
	defer func() {
		if bound != nil {
			bound.Stop()
		}
	}()
	shard, err := f.validate(cmd, src)
	if err != nil {
		return err
	}
	// The metrics address is taken before anything is mounted: a port in
	// use must not leave a mount that then goes away.
	var metricsLn net.Listener
	if f.metrics != "" {
		if metricsLn, err = listenMetrics(f.metrics); err != nil {
			return err
		}
		defer metricsLn.Close()
	}

	fills := newFillMetrics()
	o, err := openInterruptible(ctx, func() (*opened, error) {
		return f.open(ctx, src, log, openOptions{chunkTier: true, shard: shard, observe: fills.observe,
			beforeSource: func() error { return checkMountpoint(mountpoint) }})
	})
	if errors.Is(err, errInterrupted) {
		log.Info("interrupted before the mount was live; nothing mounted", "mountpoint", mountpoint)
		return nil
	}
	if err != nil {
		return err
	}
	defer o.Close()
	store, l, c := o.store, o.lay, o.cache
	mo := zfs.Options{
		Mountpoint:         mountpoint,
		Layout:             l,
		Blobs:              o.fill,
		Logger:             log,
		AllowOther:         f.allowOther,
		DisablePassthrough: f.noPassthru,
		Direct:             f.direct,
		Lease:              f.lease,
		Readahead:          f.readahead,
	}
	if f.ttl > 0 {
		mo.RefreshEvery = f.ttl
		mo.Refresh = func(ctx context.Context, cur *layout.Layout) (*layout.Layout, error) {
			return refreshLayout(ctx, o, cur, log)
		}
	}
	m, err := zfs.Mount(ctx, mo)
	if err != nil {
		return err
	}
	// The mount closes the layouts it replaces; the last one is ours.
	defer func() { o.lay = m.Layout() }()
	// Files of names the tree no longer has (a store that grew past a
	// power of ten) are evicted first.
	go fill.DemoteGarbage(c, l)
	if unregister, err := registerMount(mountpoint, c.BlobDir(l.ID), store.ID()); err != nil {
		log.Warn("zarrfs path will not find this mount", "err", err)
	} else {
		defer unregister()
	}
	parts := &statusParts{mountpoint: absMountpoint(mountpoint), args: os.Args[1:], logFile: stderrFile(), started: started, f: f, o: o, m: m}
	cctx, stopControl := context.WithCancel(context.Background())
	parts.deliverySock = deliverySocket(parts.mountpoint)
	var waitDelivery func()
	if parts.delivery, waitDelivery, err = serveDelivery(cctx, f.delivery, parts.deliverySock, o, m, mo.Blobs, log); err != nil {
		log.Warn("zarrfs.torch.Loader will read files: no delivery socket", "err", err)
	}
	// The rings' fills decode with o's decoders into o's cache: they end,
	// and the rings go, before o closes (deferred above).
	defer func() {
		stopControl()
		waitDelivery()
	}()
	if err := serveControl(cctx, controlSocket(parts.mountpoint), parts.doc, log); err != nil {
		log.Warn("zarrfs status will not reach this mount", "err", err)
	}
	if metricsLn != nil {
		serveMetrics(cctx, metricsLn, parts, fills, log)
	}
	mode, gid := c.BlobAccess()
	if f.direct && f.allowOther && mode&0o044 == 0 {
		// The links name files that only this user may open.
		log.Warn("with --direct and --allow-other, other users cannot open the blobs the links resolve to; give --cache-mode or --cache-group")
	}
	log.Debug("mount settings", "layout", l.ID, "cache", c.BlobDir(l.ID), "passthrough", m.Passthrough(),
		"direct", f.direct, "lease", f.lease, "rank", f.rank, "world", f.world, "shard", shard.Mode(),
		"cache_mode", fmt.Sprintf("%04o", uint32(mode)), "cache_group", groupLabel(gid))
	fmt.Fprintf(cmd.OutOrStdout(), "zarrfs: mounted %s at %s (%s, %s)\n",
		store.ID(), mountpoint, count(int64(l.Arrays), "array"), count(l.Files, "file"))
	logCacheHint(log, c.Dir())
	log.Info("mount live", "source", store.ID(), "mountpoint", mountpoint, "direct", f.direct, "decode", o.dec.Placement(),
		"zstd", codec.ZstdDecoder(), "cache", c.Dir(), "cache_budget", c.Budget())
	notifySystemd(fmt.Sprintf("READY=1\nSTATUS=serving %s at %s", store.ID(), mountpoint), log)
	defer notifySystemd("STOPPING=1", log)

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
		// Unmounted from outside (zarrfs unmount, umount).
		log.Info("unmounted externally", "mountpoint", mountpoint)
	}
	bound = boundShutdown(log, cmd.ErrOrStderr(), shutdownLimit, os.Exit)
	return nil
}

// shutdownLimit bounds what the daemon takes, once unmounted, to give back
// what it holds (the readers' rings, the decoders, the cache's journal):
// within what `zarrfs unmount`, the Python Mount (30 s) and systemd wait.
const shutdownLimit = 20 * time.Second

// boundShutdown arms the bound on the shutdown that follows: past limit,
// something waits on what does not answer (a GPU whose kernel does not
// end, say), so the daemon logs where every goroutine is and exits with
// status 1, a runtime error, rather than hang its caller. The cache is
// safe against an exit at any moment. The goroutines go to w (the log's
// stream).
func boundShutdown(log *slog.Logger, w io.Writer, limit time.Duration, exit func(int)) *time.Timer {
	return time.AfterFunc(limit, func() {
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		log.Error("shutdown did not end in time; exiting, the goroutines follow", "limit", limit)
		w.Write(buf)
		exit(1)
	})
}

var errInterrupted = errors.New("interrupted")

// openInterruptible runs open, returning at once when ctx ends (SIGINT or
// SIGTERM) whatever open is doing: reading the metadata of a large store,
// or waiting on a source that does not answer, takes as long as it takes,
// and a signal must not wait for it. What open leaves behind goes with the
// process; the cache is safe against that (a kill at any moment).
func openInterruptible(ctx context.Context, open func() (*opened, error)) (*opened, error) {
	type result struct {
		o   *opened
		err error
	}
	done := make(chan result, 1)
	go func() {
		o, err := open()
		done <- result{o, err}
	}()
	select {
	case r := <-done:
		if r.err == nil && ctx.Err() != nil {
			r.o.Close()
			return nil, errInterrupted
		}
		if r.err != nil && ctx.Err() != nil {
			return nil, errInterrupted
		}
		return r.o, r.err
	case <-ctx.Done():
		return nil, errInterrupted
	}
}

// groupLabel names a gid for the logs; "" for none.
func groupLabel(gid int) string {
	if gid < 0 {
		return ""
	}
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return strconv.Itoa(gid)
}

// count is "1 array", "2 arrays", "87,612 files": n with comma separators
// and the noun in the number it takes.
func count(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return thousands(n) + " " + noun + "s"
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
