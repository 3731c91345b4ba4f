package main

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// keptChunks is the chunk tier as `zarrfs warm --compressed` reads through
// it: it remembers every chunk it found there or stored, so that the warm
// can check at its end that they are all still there.
type keptChunks struct {
	cache.ChunkTier
	mu    sync.Mutex
	found map[string]int64 // key: bytes, of chunks read from the tier
	put   map[string]int64 // key: bytes, of chunks handed to it to keep
}

func (k *keptChunks) wrap(t cache.ChunkTier) zarr.SourceCacheInto {
	k.ChunkTier = t
	k.found, k.put = map[string]int64{}, map[string]int64{}
	return k
}

func (k *keptChunks) Get(key string) ([]byte, bool) { return k.GetInto(key, nil) }

func (k *keptChunks) GetInto(key string, alloc func(n int) []byte) ([]byte, bool) {
	b, ok := k.ChunkTier.GetInto(key, alloc)
	if ok {
		k.mu.Lock()
		if _, stored := k.put[key]; !stored {
			k.found[key] = int64(len(b))
		}
		k.mu.Unlock()
	}
	return b, ok
}

func (k *keptChunks) Put(key string, b []byte) {
	k.ChunkTier.Put(key, b)
	k.mu.Lock()
	if _, ok := k.found[key]; !ok {
		k.put[key] = int64(len(b))
	}
	k.mu.Unlock()
}

// tally counts the chunks found and stored, their bytes, and those of
// either the tier no longer holds.
func (k *keptChunks) tally() (found, stored int, foundB, storedB int64, gone int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, n := range k.found {
		found++
		foundB += n
		if !k.Holds(key) {
			gone++
		}
	}
	for key, n := range k.put {
		stored++
		storedB += n
		if !k.Holds(key) {
			gone++
		}
	}
	return
}

// warmCompressed is `zarrfs warm --compressed`: every chunk the planned
// files read is read (from the cache's chunk tier when it holds it, else
// from the source), decoded and checked, and kept compressed; no decoded
// file is written. The budget check of a decoded warm does not apply (what
// the chunks take is known only once read): the warm fails at its end if
// chunks it kept were evicted meanwhile.
func warmCompressed(cmd *cobra.Command, f *warmFlags, o *opened, plan *fill.Selection, kept *keptChunks, log *slog.Logger) error {
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	logCacheHint(log, o.cache.Dir())
	start := time.Now()
	var firstErr error
	var errOnce sync.Once
	var done atomic.Int64
	failed, _ := fill.Warm(ctx, o.fill, o.lay, plan.Blobs, fill.WarmOptions{Jobs: f.jobs, Compressed: true, Done: func(b layout.Blob, err error) {
		if err != nil {
			log.Error("warm failed", "file", b.Path(), "err", err)
			errOnce.Do(func() { firstErr = fmt.Errorf("%s: %w", b.Path(), err) })
			return
		}
		done.Add(1)
	}})
	el := time.Since(start)
	if ctx.Err() != nil {
		return fmt.Errorf("warm interrupted after %d of %s; run it again to resume (chunks kept are read from the cache)", done.Load(), files(len(plan.Blobs)))
	}
	found, stored, foundB, storedB, gone := kept.tally()
	fmt.Fprintf(out, "zarrfs: kept the compressed chunks of %s (%s decoded) in %s: %d chunks (%s) stored, %d (%s) already in the cache; %s fetched; cache %s\n",
		files(int(done.Load())), memory.Human(plan.Bytes), el.Round(time.Millisecond), stored, memory.Human(storedB), found, memory.Human(foundB),
		memory.Human(o.stats.BytesFetched.Load()), o.cache.Dir())
	logWork(log, "warm", o)
	if failed > 0 {
		return fmt.Errorf("%s failed, first: %w", files(failed), firstErr)
	}
	if gone > 0 {
		return fmt.Errorf("%d of %d compressed chunks warmed are not in the cache: not kept or evicted since, by this warm or another user of the cache (a mount with a smaller --cache-size); raise --cache-size or warm fewer (--only, --samples, --rank/--world)", gone, found+stored)
	}
	if f.prune {
		return prune(ctx, o, out)
	}
	return nil
}
