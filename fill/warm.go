package fill

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// Todo returns the blobs of lay that c does not hold complete in their
// current identity, and their bytes: what a warm has left to do.
func Todo(ctx context.Context, c *cache.Cache, lay *layout.Layout, blobs []layout.Blob) ([]layout.Blob, int64, error) {
	var todo []layout.Blob
	var bytes int64
	for _, b := range blobs {
		ok, err := Has(ctx, c, lay, b)
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			todo = append(todo, b)
			bytes += b.Size()
		}
	}
	return todo, bytes, nil
}

// WarmOptions configure Warm. The zero value fills runtime.NumCPU() blobs
// at a time and reports nothing.
type WarmOptions struct {
	// Jobs is the number of blobs filled at once; zero means
	// runtime.NumCPU(). Decoding is bounded by the decoder's own workers:
	// jobs are fills in flight, which for a remote source mostly wait on
	// the network.
	Jobs int
	// Done, when set, is called once per blob, from the worker that filled
	// it, with the fill's outcome (nil when it was already warm).
	Done func(b layout.Blob, err error)
	// Compressed reads every blob's chunks and decodes them, but keeps no
	// blob: what stays is what the layout's source cache keeps, the
	// compressed chunks, each only once it decoded and passed its checks
	// (`zarrfs warm --compressed`).
	Compressed bool
}

// Warm fills every blob of blobs (those already there are opened and
// closed again), runs of consecutive blobs that read the same source
// chunks by one worker in order, so that each chunk is decoded once (the
// decoded-chunk cache carries it from one sample to the next). It stops
// feeding work when ctx ends, and returns the number of blobs that failed
// (each reported to Done) and ctx's error if it ended.
func Warm(ctx context.Context, bl Blobs, lay *layout.Layout, blobs []layout.Blob, o WarmOptions) (failed int, err error) {
	if o.Jobs < 0 {
		return 0, fmt.Errorf("fill: %d jobs: want 0 (one per CPU) or more", o.Jobs)
	}
	jobs := o.Jobs
	if jobs == 0 {
		jobs = runtime.NumCPU()
	}
	work := make(chan []layout.Blob)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range work {
				for _, b := range batch {
					warm := warmOne
					if o.Compressed {
						warm = warmChunks
					}
					err := warm(ctx, bl, lay, b)
					if err != nil && ctx.Err() != nil {
						return
					}
					if err != nil {
						mu.Lock()
						failed++
						mu.Unlock()
					}
					if o.Done != nil {
						o.Done(b, err)
					}
				}
			}
		}()
	}
feed:
	for _, b := range Batches(blobs) {
		select {
		case work <- b:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return failed, ctx.Err()
}

// warmOne fills one blob into the cache (if still absent or stale) and
// releases it.
func warmOne(ctx context.Context, bl Blobs, lay *layout.Layout, b layout.Blob) error {
	h, _, err := bl.Open(ctx, lay, b)
	if err != nil {
		return err
	}
	return h.Close()
}

// warmChunks reads and decodes the chunks of blob b, writing the decoded
// bytes nowhere: the source cache keeps the compressed bytes of every
// chunk that decoded (zarr.Options.SourceCache). A chunk the cache holds
// already is read from it and checked again, not fetched. It is planned as
// a blob the cache never held, and read once more after its arrays are
// listed again when a chunk changed meanwhile, as Filler.Open does.
func warmChunks(ctx context.Context, bl Blobs, lay *layout.Layout, b layout.Blob) error {
	f, ok := bl.(*Filler)
	if !ok {
		return fmt.Errorf("fill: a warm of compressed chunks needs a Filler, not a %T", bl)
	}
	for attempt := 0; ; attempt++ {
		began := time.Now()
		p, err := plan(ctx, lay, b, true)
		if err == nil {
			err = f.Fill(ctx, lay, b, p.Pin, discard{})
		}
		if err == nil || attempt > 0 || !errors.Is(err, zarr.ErrChanged) {
			return err
		}
		if rerr := lay.Relist(ctx, b, began); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
}

// discard is a blob's destination that keeps nothing.
type discard struct{}

func (discard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// Batches groups consecutive blobs that read the same source chunks, so
// that one worker fills them in order.
func Batches(blobs []layout.Blob) [][]layout.Blob {
	var out [][]layout.Blob
	prev := ""
	for _, b := range blobs {
		k := chunkSetKey(b)
		if len(out) == 0 || k != prev || k == "" {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], b)
		prev = k
	}
	return out
}

// chunkSetKey names the chunks a blob reads, by array and chunk range.
func chunkSetKey(b layout.Blob) string {
	var sb strings.Builder
	for _, r := range b.Sources() {
		sb.WriteString(r.Array.Path)
		for d := range r.Start {
			lo := r.Start[d] / r.Array.Chunks[d]
			hi := (r.Start[d] + r.Count[d] - 1) / r.Array.Chunks[d]
			fmt.Fprintf(&sb, ",%d-%d", lo, hi)
		}
		sb.WriteByte(';')
	}
	return sb.String()
}
