package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/fs/layout"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
	"github.com/zarrfs/zarrfs/zarr/codec"
)

// layoutFlags are the flags that decide which files a mount serves and
// where their cache lives. mount and warm share them, so that a warm with
// the same flags fills exactly the files the mount serves.
type layoutFlags struct {
	src       sourceFlags
	cacheDir  string
	cacheSize string
	memory    string
	sampleDim string
	align     int64
	views     []string
}

func (f *layoutFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.cacheDir, "cache", "", "cache directory (default $XDG_CACHE_HOME/zarrfs or ~/.cache/zarrfs)")
	fl.StringVar(&f.cacheSize, "cache-size", "0", "cache budget, such as 500GiB; 0 means what the cache's filesystem can hold")
	fl.StringVar(&f.memory, "memory", "", "memory budget, such as 8GiB: fills wait for memory or fail (EIO) rather than exceed it (default a quarter of RAM, at least 512MiB)")
	fl.StringVar(&f.sampleDim, "sample-dim", layout.DefaultSampleDim, "dimension whose indices become one file each")
	fl.Int64Var(&f.align, "align", layout.DefaultAlign, "offset of the data in every .npy file (a multiple of 64, at least 128)")
	fl.StringArrayVar(&f.views, "view", nil, "YAML file of stacked training views; repeatable")
	f.src.register(cmd, true)
}

// opened is a source with its metadata, layout and cache.
type opened struct {
	store objectstore.Store
	h     *zarr.Hierarchy
	lay   *layout.Layout
	cache *cache.Cache
}

func (o *opened) Close() error { return o.cache.Close() }

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

// openOptions are what mount and warm open differently.
type openOptions struct {
	// chunkCacheBytes sizes the in-memory decoded-chunk cache (zarr.Options).
	chunkCacheBytes int64
	// chunkTier keeps a remote source's compressed chunks in the disk
	// cache too. A mount wants it (a blob evicted later refills from disk);
	// warm does not: the blobs it writes already hold every byte, and a
	// second, compressed copy only halves its speed.
	chunkTier bool
	// shard lists only one rank's samples in every sample directory.
	shard layout.Shard
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
	if f.align%64 != 0 || f.align < layout.MinAlign || f.align > layout.MaxAlign {
		return nil, usagef("--align %d: want a multiple of 64 from %d (the smallest that holds an npy header) to %d", f.align, layout.MinAlign, layout.MaxAlign)
	}
	if f.sampleDim == "" {
		return nil, usagef("--sample-dim: empty name")
	}
	var specs []*layout.ViewSpec
	for _, v := range f.views {
		s, err := layout.LoadViews(v)
		var pe *fs.PathError
		if errors.As(err, &pe) && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EISDIR)) {
			return nil, usagef("--view %s: %v", v, pe.Err)
		}
		if err != nil {
			return nil, err
		}
		specs = append(specs, s...)
	}
	if f.cacheDir == "" {
		if f.cacheDir, err = defaultCacheDir(); err != nil {
			return nil, usagef("%v", err)
		}
	}
	dec, err := newDecoder(f.src.decode, log)
	if err != nil {
		return nil, err
	}
	store, err := f.src.openStore(ctx, src)
	if err != nil {
		return nil, err
	}
	c, err := cache.Open(cache.Options{Dir: f.cacheDir, Size: size, Logger: log})
	if err != nil {
		return nil, err
	}
	zopts := zarr.Options{Logger: log, Decoder: dec, ChunkCacheBytes: chunkCacheBytes(oo.chunkCacheBytes, mem)}
	if isRemote(store) && oo.chunkTier {
		zopts.SourceCache = chunkTier{c}
	}
	h, err := zarr.Open(ctx, store, zopts)
	if err != nil {
		c.Close()
		return nil, err
	}
	views, err := layout.BindViews(ctx, h, specs, layout.BindOptions{SampleDim: f.sampleDim})
	if err != nil {
		c.Close()
		return nil, err
	}
	lopts := layout.Options{SampleDim: f.sampleDim, Align: f.align, Views: views, Shard: oo.shard,
		MemoryBudget: memory.New(mem / 2)}
	// With a decoder that lends memory (the GPU's pinned memory), fills
	// decode into it, which spares a host copy of every decoded chunk.
	lopts.Memory, _ = dec.(codec.HostMemory)
	lay, err := layout.Build(h, lopts)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", strings.TrimSuffix(store.ID(), "/"), err)
	}
	// zarr.Open already warned about each unsupported array; warn here
	// only about what the layout itself left out (name collisions).
	unsupported := map[string]bool{}
	for _, a := range h.Arrays {
		unsupported[a.Path] = a.Unsupported != ""
	}
	for _, s := range lay.Skipped {
		if !unsupported[s.Path] {
			log.Warn("array left out of the mount", "array", s.Path, "reason", s.Reason)
		}
	}
	return &opened{store: store, h: h, lay: lay, cache: c}, nil
}

// memoryBudget parses --memory (default memory.DefaultBudget) and makes it
// the Go runtime's soft memory limit too, unless GOMEMLIMIT sets one: the
// collector then works harder before the process outgrows its budget. Half
// of it bounds what fills hold at once (layout.Options.MemoryBudget), a
// quarter at most the decoded-chunk cache; the rest is for the runtime,
// FUSE and the caches' indexes.
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

// chunkCacheBytes is the decoded-chunk cache's size within the memory
// budget: asked (0: zarr's default, 256 MiB), at most a quarter of mem.
func chunkCacheBytes(asked, mem int64) int64 {
	if asked == 0 {
		asked = 256 << 20
	}
	return min(asked, mem/4)
}

func isRemote(s objectstore.Store) bool {
	_, local := s.(*objectstore.Posix)
	return !local
}

// chunkTier is the disk cache's chunk tier seen as a zarr.SourceCache.
type chunkTier struct{ c *cache.Cache }

var errAbsent = errors.New("absent")

func (t chunkTier) Get(key string) ([]byte, bool) {
	b, err := t.c.GetChunk(context.Background(), key, func(context.Context) ([]byte, error) { return nil, errAbsent })
	return b, err == nil
}

func (t chunkTier) Put(key string, b []byte) {
	// A concurrent Get that joined this store may copy the bytes after Put
	// returns, and the reader reuses b: hand the cache its own copy.
	b = bytes.Clone(b)
	_, _ = t.c.GetChunk(context.Background(), key, func(context.Context) ([]byte, error) { return b, nil })
}
