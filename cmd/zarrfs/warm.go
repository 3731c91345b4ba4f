package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
)

type warmFlags struct {
	layoutFlags
	only    []string
	samples string
	rank    int
	world   int
	shard   string
	jobs    int
	prune   bool
	// compressed keeps the compressed chunks instead of decoded files.
	compressed bool
	// span and split are --samples and --rank/--world/--shard, parsed by
	// validate.
	span  *fill.SampleSpan
	split layout.Shard
}

func newWarmCmd() *cobra.Command {
	var f warmFlags
	cmd := &cobra.Command{
		Use:   "warm SOURCE",
		Short: "Fill the cache with the files a mount with the same flags would serve",
		Long: `Decode the files a mount of SOURCE with the same flags would serve into the
cache directory, so that a later mount serves them without touching the
source. Idempotent and resumable: files already in the cache are skipped.

--rank/--world warm the share of samples one rank reads: with --shard
contiguous (the default, as DALI's shard_id/num_shards) rank i of W gets
samples [floor(i*N/W), floor((i+1)*N/W)) of every sample directory; with
--shard interleaved (as PyTorch's DistributedSampler without shuffling)
samples i, i+W, i+2W, ...

--compressed keeps the compressed chunks those files read instead (the
cache's chunk tier), of any source, local included: each chunk is read,
decoded and checked, and kept only once it passed. A later mount reads
them from the cache and decodes them as it serves, asking the source no
more than each chunk's version.`,
		Args: exactArgs(1, "SOURCE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWarm(cmd, &f, args[0])
		},
	}
	f.layoutFlags.register(cmd)
	fl := cmd.Flags()
	fl.StringArrayVar(&f.only, "only", nil, "warm only this mount path (array, view, directory or file); repeatable")
	fl.StringVar(&f.samples, "samples", "", "warm only samples START:STOP (half-open) of every sample directory")
	fl.IntVar(&f.rank, "rank", 0, "this node's rank (with --world)")
	fl.IntVar(&f.world, "world", 1, "number of ranks sharing the samples")
	fl.StringVar(&f.shard, "shard", "contiguous", "how samples are split among ranks: contiguous or interleaved")
	fl.IntVar(&f.jobs, "jobs", 0, fmt.Sprintf("files filled concurrently, 1 to %d (default: number of CPUs, at least 16 for a remote source)", maxJobs))
	fl.BoolVar(&f.prune, "prune", false, "then remove the source's cached files a mount will never serve again, as zarrfs cache gc does")
	fl.BoolVar(&f.compressed, "compressed", false, "keep the compressed chunks the files read, not the decoded files (fits a dataset larger than the cache would hold decoded)")
	return cmd
}

// planWarm turns the flags into the selection of what to fill.
func planWarm(lay *layout.Layout, f *warmFlags) (*fill.Selection, error) {
	plan, err := fill.Select(lay, fill.SelectOptions{Only: f.only, Samples: f.span, Shard: f.split})
	if err != nil {
		return nil, fmt.Errorf("--only %w", err)
	}
	return plan, nil
}

// validate checks warm's own flags and the source flags before anything is
// opened. --jobs left out is 0, chosen from the CPUs and the source;
// given, it must be 1 or more.
func (f *warmFlags) validate(cmd *cobra.Command, src string) error {
	if err := f.src.validate(cmd, src); err != nil {
		return err
	}
	if cmd.Flags().Changed("jobs") {
		if err := checkCount("jobs", f.jobs, 1, maxJobs); err != nil {
			return err
		}
	}
	span, err := fill.ParseSampleSpan(f.samples)
	if err != nil {
		return usagef("--%s", strings.TrimPrefix(err.Error(), fill.ErrInvalidSpan.Error()+": "))
	}
	f.span = span
	if f.split, err = checkShard(f.rank, f.world, f.shard); err != nil {
		return err
	}
	return checkShardGiven(cmd, f.world)
}

func runWarm(cmd *cobra.Command, f *warmFlags, src string) error {
	ctx := cmd.Context()
	log, err := newLogger(cmd)
	if err != nil {
		return err
	}
	if err := f.validate(cmd, src); err != nil {
		return err
	}
	// Warm fills runs of samples that share chunks, one run per worker:
	// the decoded-chunk cache must hold every worker's current chunks (a
	// 20-channel view over chunks of 10 ERA5 time steps needs 830 MB a
	// worker). Memory is taken only as chunks are cached.
	var kept *keptChunks
	oo := openOptions{chunkCacheBytes: 4 << 30, compressed: f.compressed}
	if f.compressed {
		kept = &keptChunks{}
		oo.wrapTier = kept.wrap
	}
	o, err := f.open(ctx, src, log, oo)
	if err != nil {
		return err
	}
	if f.jobs == 0 {
		// Fills in flight: for a remote source they mostly wait on the
		// network.
		f.jobs = runtime.NumCPU()
		if isRemote(o.store) {
			f.jobs = max(f.jobs, 16)
		}
	}
	defer o.CloseForExit()
	c, lay := o.cache, o.lay
	plan, err := planWarm(lay, f)
	if err != nil {
		return err
	}
	if err := checkSelection(log, f, c, plan); err != nil {
		return err
	}
	if f.compressed {
		return warmCompressed(cmd, f, o, plan, kept, log)
	}
	// What is warm already is known from the chunks' versions: requests
	// that may meet a source silent at first, as the open's did.
	var todo []layout.Blob
	var todoBytes int64
	err = untilAnswers(ctx, f.src.deadlines.timeout, log, "finding what is already warm", func() (err error) {
		todo, todoBytes, err = fill.Todo(ctx, c, lay, plan.Blobs)
		return err
	})
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	dir := c.BlobDir(lay.ID)
	if len(todo) == 0 {
		logWork(log, "warm", o)
		for _, d := range plan.Dirs {
			fmt.Fprintf(out, "%s\t%s\n", d, path.Join(dir, d))
		}
		fmt.Fprintf(out, "zarrfs: nothing to do: %s (%s) already warm in %s\n", files(len(plan.Blobs)), memory.Human(plan.Bytes), dir)
		if f.prune {
			return prune(ctx, o, out)
		}
		return nil
	}
	logCacheHint(log, c.Dir())
	bar := warmBar(todoBytes, len(todo))
	start := time.Now()
	var done, doneBytes atomic.Int64
	var firstErr error
	var errOnce sync.Once
	failed, _ := fill.Warm(ctx, o.fill, lay, todo, fill.WarmOptions{Jobs: f.jobs, Done: func(b layout.Blob, err error) {
		if err != nil {
			log.Error("warm failed", "file", b.Path(), "err", err)
			errOnce.Do(func() { firstErr = fmt.Errorf("%s: %w", b.Path(), err) })
			return
		}
		n := done.Add(1)
		doneBytes.Add(b.Size())
		if bar != nil {
			bar.Describe(fmt.Sprintf("warming %d/%s", n, files(len(todo))))
			_ = bar.Add64(b.Size())
		}
	}})
	if bar != nil {
		_ = bar.Finish()
		fmt.Fprintln(os.Stderr)
	}
	el := time.Since(start)
	if ctx.Err() != nil {
		return fmt.Errorf("warm interrupted after %d of %s; run it again to resume", done.Load(), files(len(todo)))
	}
	for _, d := range plan.Dirs {
		fmt.Fprintf(out, "%s\t%s\n", d, path.Join(dir, d))
	}
	reportWarm(out, log, o, int(done.Load()), doneBytes.Load(), el, len(plan.Blobs)-len(todo), dir)
	if failed > 0 {
		return fmt.Errorf("%s failed, first: %w", files(failed), firstErr)
	}
	// Another user of the cache (a mount) may have evicted some meanwhile.
	left, _, err := fill.Todo(ctx, c, lay, plan.Blobs)
	if err != nil {
		return err
	}
	if gone := len(left); gone > 0 {
		return fmt.Errorf("%s of %d warmed no longer in the cache: evicted since, by this warm or another user of the cache (a mount with a smaller --cache-size); raise --cache-size or warm fewer", files(gone), len(plan.Blobs))
	}
	if f.prune {
		return prune(ctx, o, out)
	}
	return nil
}

// checkSelection refuses, before any work, a selection warm cannot do:
// --samples past the end of every sample directory (a runtime error: the
// range fits a longer store; past some only, a warning), or more bytes than
// the cache holds, which would report success for files a mount then
// fetches again.
func checkSelection(log *slog.Logger, f *warmFlags, c *cache.Cache, plan *fill.Selection) error {
	if f.samples != "" && len(plan.Short) > 0 {
		if plan.InRange == 0 {
			return fmt.Errorf("--samples %s: no sample directory has samples in that range (%s)", f.samples, strings.Join(plan.Short, ", "))
		}
		log.Warn("--samples runs past the end of some sample directories; warming the samples they have",
			"samples", f.samples, "short", strings.Join(plan.Short, ", "))
	}
	// What chunks take is known only once read: warm --compressed checks
	// at its end that they stayed (warmCompressed).
	if budget := c.Budget(); budget > 0 && plan.Bytes > budget && !f.compressed {
		room, raise := "the cache budget", "raise --cache-size"
		if c.BudgetFromFilesystem() {
			room, raise = "what the cache's filesystem holds", "free space on it"
		}
		return fmt.Errorf("the %s to warm (%s) do not fit %s (%s); %s or warm fewer (--only, --samples, --rank/--world)",
			files(len(plan.Blobs)), memory.Human(plan.Bytes), room, memory.Human(budget), raise)
	}
	return nil
}

// warmBar is the progress bar of a warm of n files of bytes in all, on a
// terminal's stderr; nil elsewhere.
func warmBar(bytes int64, n int) *progressbar.ProgressBar {
	fi, err := os.Stderr.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 || !term.IsTerminal(int(os.Stderr.Fd())) {
		return nil
	}
	return progressbar.NewOptions64(bytes,
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetDescription(fmt.Sprintf("warming 0/%s", files(n))),
		// The summary line counts MiB (memory.Human): so does the bar.
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionSetPredictTime(true),
	)
}

// reportWarm prints the summary of a warm that filled done files (bytes
// of them) in el, beside skipped already warm, into the blob directory
// dir, and what the GPU decoded if one did.
func reportWarm(out io.Writer, log *slog.Logger, o *opened, done int, bytes int64, el time.Duration, skipped int, dir string) {
	rate := float64(bytes) / el.Seconds()
	fmt.Fprintf(out, "zarrfs: warmed %s (%s) in %s, %s/s; %d already warm; cache %s\n",
		files(done), memory.Human(bytes), el.Round(time.Millisecond), memory.Human(int64(rate)), skipped, dir)
	logWork(log, "warm", o)
	if s := o.dec.GPUStats(); o.dec.OnGPU() || s.Chunks+s.Refused+s.Corrupt > 0 {
		// What the GPU really decoded: with --decode gpu every chunk,
		// unless it refused some (they decode on the CPU instead).
		fmt.Fprintf(out, "zarrfs: the GPU decoded %d of %d chunks (%s); it refused %d (decoded on the CPU) and found %d corrupt\n",
			s.Chunks, o.stats.ChunksDecoded.Load(), memory.Human(s.Bytes), s.Refused, s.Corrupt)
	}
}

// logWork logs, at debug level, what reading the source took: chunks
// decoded, requests sent (reads and listings) and bytes fetched.
func logWork(log *slog.Logger, what string, o *opened) {
	st := o.stats
	log.Debug(what+" work", "chunks_decoded", st.ChunksDecoded.Load(), "requests", st.Requests.Load(),
		"listings", st.Listings.Load(), "bytes_fetched", st.BytesFetched.Load())
}

// files is "1 file" or "N files".
func files(n int) string {
	if n == 1 {
		return "1 file"
	}
	return strconv.Itoa(n) + " files"
}
