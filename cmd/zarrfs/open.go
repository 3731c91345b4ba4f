package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/decode"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/internal/ratelog"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// layoutFlags are the flags that decide which files a mount serves and
// where their cache lives. mount and warm share them, so that a warm with
// the same flags fills exactly the files the mount serves.
type layoutFlags struct {
	src        sourceFlags
	cacheDir   string
	cacheSize  string
	cacheMode  string
	cacheGroup string
	memory     string
	sampleDim  string
	align      int64
	views      []string
	// wholeChunks reads every chunk whole (hidden --whole-chunks): the
	// peer partial reads are measured against (BENCHMARKS.md).
	wholeChunks bool
}

func (f *layoutFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.cacheDir, "cache", "", "cache directory (default $XDG_CACHE_HOME/zarrfs or ~/.cache/zarrfs)")
	fl.StringVar(&f.cacheSize, "cache-size", "0", "cache budget, such as 500GiB; 0 means what the cache's filesystem can hold")
	fl.StringVar(&f.cacheMode, "cache-mode", "", "who may read the decoded blobs in the cache: owner (0400, the default), group (0440: --cache-group, else the cache directory's group) or all (0444), or an octal mode (read bits; blobs are read-only); needed when other users open them (--direct with --allow-other); compressed chunks, journal and lock stay owner-only")
	fl.StringVar(&f.cacheGroup, "cache-group", "", "group (name or gid) given the decoded blobs and the directories leading to them; implies --cache-mode group")
	fl.StringVar(&f.memory, "memory", "", "the daemon's memory budget, such as 8GiB: fills wait for memory or fail (EIO) rather than exceed it (default: "+memoryDefault+")")
	registerSampleDim(cmd, &f.sampleDim)
	fl.Int64Var(&f.align, "align", layout.DefaultAlign, "offset of the data in every .npy file (a multiple of 64, at least 128)")
	fl.StringArrayVar(&f.views, "view", nil, "YAML file of stacked training views; repeatable")
	fl.BoolVar(&f.wholeChunks, "whole-chunks", false, "read every chunk whole, never the part a file needs (a benchmark's peer)")
	fl.MarkHidden("whole-chunks")
	f.src.register(cmd, true)
}

// registerSampleDim adds --sample-dim, which mount, warm and inspect read
// alike (checkSampleDim), so that inspect shows what a mount serves.
func registerSampleDim(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "sample-dim", layout.DefaultSampleDims, "dimension whose indices become one file each; a comma-separated list is tried in order, the first that an array has is taken")
}

// checkSampleDim refuses a --sample-dim list with an empty name, which
// the layout would otherwise take for its default.
func checkSampleDim(list string) error {
	if _, err := layout.ParseSampleDims(list); err != nil {
		return usagef("--sample-dim %q: empty name", list)
	}
	return nil
}

// opened is a source with its metadata, layout, cache and decoding
// pipeline: everything a mount or a warm holds, closed in one place.
type opened struct {
	store objectstore.Store
	dec   *decode.Pipeline
	src   *layout.Source
	lay   *layout.Layout // the current one; a mount replaces it
	cache *cache.Cache
	fill  *fill.Filler // fills blobs of lay into cache
	stats *zarr.Stats  // the work of every hierarchy opened from src
	// exiting: the process exits after Close, which then leaves the GPUs'
	// teardown to the exit (CloseForExit).
	exiting bool
}

// Close releases everything open opened, the users of the decoder first.
// Fills must be done.
func (o *opened) Close() error {
	var errs []error
	if o.lay != nil {
		errs = append(errs, o.lay.Close())
	}
	if o.dec != nil && o.exiting {
		errs = append(errs, o.dec.CloseForExit())
	} else if o.dec != nil {
		errs = append(errs, o.dec.Close())
	}
	if o.cache != nil {
		errs = append(errs, o.cache.Close())
	}
	if o.store != nil {
		closeStore(o.store)
	}
	return errors.Join(errs...)
}

// CloseForExit is Close for a command about to exit: it does not wait for
// the GPUs to finish starting nor to free their contexts and pinned
// memory (the exit does), which would add up to a second to a short
// command.
func (o *opened) CloseForExit() error {
	o.exiting = true
	return o.Close()
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

// firstMissing is the outermost directory of dir's path that does not
// exist, dir itself when only it is missing, "" when it exists.
func firstMissing(dir string) string {
	missing := ""
	for p := dir; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			return missing
		}
		missing = p
		if filepath.Dir(p) == p {
			return missing
		}
	}
}

// removeEmptyUpTo removes dir and its parents up to top (included) while
// they are empty.
func removeEmptyUpTo(dir, top string) {
	for ; len(dir) >= len(top); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil || dir == top {
			return
		}
	}
}

// openOptions are what mount and warm open differently.
type openOptions struct {
	// chunkCacheBytes sizes the in-memory decoded-chunk cache (zarr.Options).
	chunkCacheBytes int64
	// chunkTier keeps a remote source's compressed chunks in the disk
	// cache too. A mount wants it (a blob evicted later refills from disk);
	// warm does not: the blobs it writes already hold every byte, and a
	// second, compressed copy only halves its speed.
	chunkTier bool
	// compressed keeps every compressed chunk read, of any source, local
	// too, and reads chunks whole: `zarrfs warm --compressed`.
	compressed bool
	// wrapTier, when set, wraps the chunk tier the source is read through
	// (warm --compressed records what it stored).
	wrapTier func(cache.ChunkTier) zarr.SourceCacheInto
	// shard lists only one rank's samples in every sample directory.
	shard layout.Shard
	// observe, when set, is told of every fill (fill.Options.Observe).
	observe func(group string, took time.Duration, err error)
	// beforeSource, when set, runs once every flag is checked and before
	// the cache or the source is opened: the command's own checks of its
	// arguments (mount's mountpoint), so that a usage error is reported
	// as one (exit 2) whatever else is wrong, and a runtime one before any
	// I/O on the source.
	beforeSource func() error
}

// open validates the flags, then opens the cache, the source (through the
// cache's chunk tier when it is remote and o.chunkTier is set), its
// metadata, the views and the layout. Usage mistakes come back as usage
// errors.
func (f *layoutFlags) open(ctx context.Context, src string, log *slog.Logger, oo openOptions) (*opened, error) {
	f.src.logger = log
	size, err := cache.ParseSize(f.cacheSize)
	if err != nil {
		return nil, usagef("--cache-size %q: %v", f.cacheSize, err)
	}
	mem, err := f.memoryBudget()
	if err != nil {
		return nil, err
	}
	limits, err := f.src.metaLimit.limits(mem)
	if err != nil {
		return nil, err
	}
	if f.align%64 != 0 || f.align < layout.MinAlign || f.align > layout.MaxAlign {
		return nil, usagef("--align %d: want a multiple of 64 from %d (the smallest that holds an npy header) to %d", f.align, layout.MinAlign, layout.MaxAlign)
	}
	if err := checkSampleDim(f.sampleDim); err != nil {
		return nil, err
	}
	specs, err := loadViews(f.views)
	if err != nil {
		return nil, err
	}
	mode, group, err := f.blobAccess()
	if err != nil {
		return nil, err
	}
	if f.cacheDir == "" {
		if f.cacheDir, err = defaultCacheDir(); err != nil {
			return nil, usagef("%v", err)
		}
	}
	if f.cacheDir, err = filepath.Abs(f.cacheDir); err != nil {
		return nil, usagef("--cache %s: %v", f.cacheDir, err)
	}
	made := firstMissing(f.cacheDir)
	o := &opened{}
	ok := false
	defer func() {
		if !ok {
			o.Close()
			// A command that fails (a view that does not fit the store)
			// leaves no cache directory it made and filled nothing in.
			if made != "" && cache.RemoveEmpty(f.cacheDir) {
				removeEmptyUpTo(filepath.Dir(f.cacheDir), made)
			}
		}
	}()
	if o.dec, err = f.src.newPipeline(log); err != nil {
		return nil, err
	}
	f.src.host = o.dec.Host()
	if oo.beforeSource != nil {
		if err := oo.beforeSource(); err != nil {
			return nil, err
		}
	}
	// A virtual store reads its references here, before the metadata.
	err = untilAnswers(ctx, f.src.deadlines.timeout, log, "opening the source", func() (err error) {
		o.store, err = f.src.openStore(ctx, src)
		return err
	})
	if err != nil {
		return nil, err
	}
	copts := cache.Options{Dir: f.cacheDir, Size: size, Logger: log, BlobMode: mode, BlobGroup: group, Memory: o.dec.Host()}
	if o.cache, err = cache.Open(copts); err != nil {
		if errors.Is(err, cache.ErrAccessInUse) {
			err = fmt.Errorf("%w; give the same --cache-mode and --cache-group", err)
		}
		return nil, err
	}
	zopts, cached := f.zarrOptions(o, oo, log, mem, limits)
	o.src = &layout.Source{
		Store:  o.store,
		Zarr:   zopts,
		Views:  specs,
		Layout: layout.Options{SampleDim: f.sampleDim, Align: f.align, Shard: oo.shard},
	}
	o.fill, err = fill.New(fill.Options{Cache: o.cache, MemoryBudget: memory.New(fillMemory(mem, cached)), Memory: o.dec.Host(), Observe: oo.observe})
	if err != nil {
		return nil, err
	}
	if o.lay, err = openLayout(ctx, o.src, f.src.deadlines.timeout, log); err != nil {
		return nil, err
	}
	warnSkipped(ctx, log, o.lay)
	ok = true
	return o, nil
}

// zarrOptions are the options every hierarchy of o's source opens with,
// and the decoded-chunk cache's size in them: with a GPU, compressed
// chunks are read into, and fills decode into, the pipeline's pinned
// memory; every source is read through the chunk tier.
func (f *layoutFlags) zarrOptions(o *opened, oo openOptions, log *slog.Logger, mem int64, limits zarr.MetadataLimits) (zarr.Options, int64) {
	o.stats = &zarr.Stats{}
	cached := chunkCacheBytes(oo.chunkCacheBytes, mem)
	zopts := zarr.Options{Logger: log, Decoder: o.dec, Memory: o.dec.Memory(), Host: o.dec.Host(), ChunkCacheBytes: cached, Stats: o.stats, Limits: limits}
	// Every source is read through the chunk tier: what it holds (a
	// remote source's chunks a mount kept, or those warm --compressed
	// kept of any source) is read from there, the store asked at most
	// the chunk's version. A mount keeps a remote source's chunks; a local
	// store's only warm --compressed keeps (copying every chunk a mount
	// reads from one disk to another would cost a write per read, for a
	// store that a local read serves as well).
	// The tier records what it keeps as this source's, so that a lazy
	// listing of a remote store (HTTP, large GCS arrays), whose versions
	// the reads would teach it by fetching the chunks, asks them first
	// while the tier holds any of the source's chunks
	// (zarr.StoreHolder): one HEAD or metadata request each, then the
	// chunk from the cache.
	tier := o.cache.ChunkTier().Of(objectstore.Identity(o.store))
	switch {
	case oo.compressed:
		zopts.Partial = zarr.PartialNever // whole chunks: what any later read can use
	case !(isRemote(o.store) && oo.chunkTier):
		tier = tier.ReadOnly()
	}
	zopts.SourceCache = tier
	if oo.wrapTier != nil {
		zopts.SourceCache = oo.wrapTier(tier)
	}
	if f.wholeChunks {
		zopts.Partial = zarr.PartialNever
	}
	return zopts, cached
}

// warnSkipped warns about the arrays lay left out itself (name
// collisions): zarr.Open already warned about each unsupported one.
func warnSkipped(ctx context.Context, log *slog.Logger, lay *layout.Layout) {
	h := lay.Hierarchy()
	unsupported := map[string]bool{}
	for _, a := range h.Arrays {
		unsupported[a.Path] = a.Unsupported != ""
	}
	for _, s := range lay.Skipped {
		if !unsupported[s.Path] {
			log.WarnContext(ratelog.Unlimited(ctx), "array left out of the mount", "array", s.Path, "reason", s.Reason)
		}
	}
}

// loadViews reads the --view files, each named by its absolute path in
// errors. A file the command line names that is missing, unreadable or not
// a view file (its YAML, keys or values) is a usage error (exit status 2),
// as a flag's bad value is; a view that does not fit the store (an array
// it lacks) is found when the views are bound, a runtime error (1): the
// same file fits another store.
func loadViews(paths []string) ([]*layout.ViewSpec, error) {
	var specs []*layout.ViewSpec
	for _, v := range paths {
		abs, err := filepath.Abs(v)
		if err != nil {
			return nil, usagef("--view %s: %v", v, err)
		}
		s, err := layout.LoadViews(abs)
		var pe *fs.PathError
		switch {
		case errors.As(err, &pe) && errors.Is(err, fs.ErrNotExist):
			return nil, usagef("--view %s: no such file", abs)
		case errors.As(err, &pe) && errors.Is(err, syscall.EISDIR):
			return nil, usagef("--view %s: a directory, not a view file", abs)
		case errors.As(err, &pe):
			return nil, usagef("--view %s: %v", abs, pe.Err)
		case err != nil:
			return nil, usageError{err: err}
		}
		specs = append(specs, s...)
	}
	return specs, nil
}

// blobAccess parses --cache-mode and --cache-group into the cache's
// BlobMode and BlobGroup.
func (f *layoutFlags) blobAccess() (fs.FileMode, *uint32, error) {
	var mode fs.FileMode
	if f.cacheMode != "" {
		m, err := cache.ParseMode(f.cacheMode)
		if err != nil {
			return 0, nil, usagef("--cache-mode %q: %v", f.cacheMode, err)
		}
		mode = m
	}
	if f.cacheGroup == "" {
		return mode, nil, nil
	}
	gid, err := lookupGroup(f.cacheGroup)
	if err != nil {
		return 0, nil, usagef("--cache-group %q: %v", f.cacheGroup, err)
	}
	if mode == 0 {
		mode = 0o440
	}
	if mode&0o040 == 0 {
		return 0, nil, usagef("--cache-group %s with --cache-mode %s: the mode gives the group nothing (try group or 0440)", f.cacheGroup, f.cacheMode)
	}
	return mode, &gid, nil
}

// lookupGroup resolves a group name or number to a gid the caller may
// give its files: root any, others only their own groups.
func lookupGroup(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		if _, perr := strconv.ParseUint(name, 10, 32); perr != nil {
			return 0, errors.New("no such group")
		}
		if g, err = user.LookupGroupId(name); err != nil {
			g = &user.Group{Gid: name, Name: name} // a gid without a name
		}
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("group id %q: %v", g.Gid, err)
	}
	gid := uint32(n)
	if os.Geteuid() == 0 || uint32(os.Getegid()) == gid {
		return gid, nil
	}
	groups, _ := os.Getgroups()
	for _, x := range groups {
		if uint32(x) == gid {
			return gid, nil
		}
	}
	return 0, fmt.Errorf("you are not a member of group %s (gid %d)", g.Name, gid)
}

// memoryDefault words memory.DefaultBudget for --help; README.md and
// docs/cli.md use the same words (a test checks).
const memoryDefault = "a quarter of the machine's memory, or of its cgroup's limit when lower, at least 512MiB"

// memoryBudget parses --memory (default memory.DefaultBudget) and makes it
// the Go runtime's soft memory limit too, unless GOMEMLIMIT sets one: the
// collector then works harder before the process outgrows its budget.
// fillMemory splits it.
func (f *layoutFlags) memoryBudget() (int64, error) {
	mem := memory.DefaultBudget()
	if f.memory != "" {
		n, err := cache.ParseSize(f.memory)
		if err != nil {
			return 0, usagef("--memory %q: %v", f.memory, err)
		}
		if n < 64<<20 {
			return 0, usagef("--memory %q: want at least 64MiB", f.memory)
		}
		mem = n
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(mem)
	}
	return mem, nil
}

// fillMemory is what all fills may hold at once (fill.Options.
// MemoryBudget) within the memory budget mem, beside a decoded-chunk cache
// of cached bytes: all of mem but the cache and a reserve of an eighth (16
// MiB at least) for what no fill is charged: the Go runtime's own memory
// and its collector's headroom, FUSE's request buffers, the parsed
// metadata, the caches' indexes and the listings. A fill is charged what
// it holds (zarr.Array.ReadCostInto), so the reserve need not cover fills.
func fillMemory(mem, cached int64) int64 {
	return mem - cached - max(mem/8, 16<<20)
}

// chunkCacheBytes is the decoded-chunk cache's size within the memory
// budget: asked (0: zarr's default, 256 MiB), at most a quarter of mem.
func chunkCacheBytes(asked, mem int64) int64 {
	if asked == 0 {
		asked = 256 << 20
	}
	return min(asked, mem/4)
}

func isRemote(s objectstore.Store) bool {
	if v, ok := s.(objectstore.Localer); ok {
		return !v.Local() // a virtual store over local files
	}
	return !objectstore.IsLocal(s)
}

// refreshLayout opens o's source again for a mount that follows a growing
// store: the metadata as it is now, and listings of the arrays being read.
// It warns about arrays newly left out.
func refreshLayout(ctx context.Context, o *opened, cur *layout.Layout, log *slog.Logger) (*layout.Layout, error) {
	// A virtual store reads its references (a branch's head) again first.
	if r, ok := o.store.(objectstore.Refresher); ok {
		if _, err := r.Refresh(ctx); err != nil {
			return nil, err
		}
	}
	next, err := o.src.Reopen(ctx, cur)
	if err != nil {
		return nil, err
	}
	switch gone, was := next.Hierarchy().Vanished, cur.Hierarchy().Vanished; {
	case gone && !was:
		log.Warn("the store has no Zarr metadata any more (deleted or emptied); the mount serves an empty tree until it has", "source", o.store.ID())
	case was && !gone:
		log.Info("the store has Zarr metadata again; the mount serves it", "source", o.store.ID())
	}
	was := map[string]bool{}
	for _, s := range cur.Skipped {
		was[s.Path] = true
	}
	for _, s := range next.Skipped {
		if !was[s.Path] {
			log.WarnContext(ratelog.Unlimited(ctx), "array left out of the mount", "array", s.Path, "reason", s.Reason)
		}
	}
	// Files of names the new tree lacks go first when room is needed;
	// zarrfs cache gc removes them, and superseded versions too.
	if !layout.SameNames(cur, next) {
		if n := fill.DemoteGarbage(o.cache, next); n > 0 {
			log.Debug("cached files of names no longer served demoted", "files", n)
		}
	}
	return next, nil
}

// startRetryEvery is how often an open whose source is not answering asks
// again: the breaker's probe interval, which the sources leave at its
// default.
const startRetryEvery = objectstore.DefaultProbe

// untilAnswers runs try, a step of a command that is starting (opening
// the source, its virtual store's references, the metadata and the layout
// over it; finding what a warm has left to do). A remote source that does
// not answer the first requests of a command opens its breaker
// (objectstore.Breaker), which fails every later request at once; a
// running mount wants that for its readers, but a command that is
// starting has no reader to spare the wait, and the user gave its source
// up to --source-timeout (a read's budget) to answer. So while try fails
// as the source not answering, it is run again, once the breaker's probe
// has had time to find the source answering, until budget has passed
// since the first try (a try under way then runs to its end: its reads
// keep their own budgets, and an open of many arrays' metadata may take
// longer than one read); then, or on any other error, the error is
// returned. Without this, a source silent for two stall timeouts at the
// wrong moment (a restart during a network blip) fails the command
// although it answers a second later. doing names the step in the one
// line logged when the wait begins.
func untilAnswers(ctx context.Context, budget time.Duration, log *slog.Logger, doing string, try func() error) error {
	start := time.Now()
	for tries := 1; ; tries++ {
		err := try()
		if err == nil || !errors.Is(err, objectstore.ErrSourceDown) || time.Since(start)+startRetryEvery > budget {
			switch {
			case errors.Is(err, objectstore.ErrSourceDown):
				// What was waited for, not what a running mount would do
				// next: this command is exiting.
				n := fmt.Sprintf("%d tries", tries)
				if tries == 1 {
					n = "1 try"
				}
				err = fmt.Errorf("%w; gave up after %v (--source-timeout %v, %s)", err, time.Since(start).Round(100*time.Millisecond), budget, n)
			case err != nil && tries > 1:
				err = fmt.Errorf("%w (tried %d times in %v)", err, tries, time.Since(start).Round(100*time.Millisecond))
			}
			return err
		}
		if tries == 1 {
			log.Warn("source not answering while "+doing+"; trying again until it answers or --source-timeout has passed",
				"budget", budget, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(startRetryEvery):
		}
	}
}

// openLayout opens the source's metadata and the layout over it, waiting
// for a source that does not answer at first (untilAnswers).
func openLayout(ctx context.Context, src *layout.Source, budget time.Duration, log *slog.Logger) (*layout.Layout, error) {
	var lay *layout.Layout
	err := untilAnswers(ctx, budget, log, "opening the store", func() (err error) {
		lay, err = src.Open(ctx)
		return err
	})
	return lay, err
}
