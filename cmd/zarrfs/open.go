package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/decode"
	zfs "github.com/zarrfs/zarrfs/fs"
	"github.com/zarrfs/zarrfs/fs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// layoutFlags are the flags that decide which files a mount serves and
// where their cache lives. mount and warm share them, so that a warm with
// the same flags fills exactly the files the mount serves.
type layoutFlags struct {
	src       sourceFlags
	cacheDir  string
	cacheSize string
	sampleDim string
	align     int64
	views     []string
}

func (f *layoutFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.cacheDir, "cache", "", "cache directory (default $XDG_CACHE_HOME/zarrfs or ~/.cache/zarrfs)")
	fl.StringVar(&f.cacheSize, "cache-size", "0", "cache budget, such as 500GiB; 0 means unlimited")
	fl.StringVar(&f.sampleDim, "sample-dim", layout.DefaultSampleDim, "dimension whose indices become one file each")
	fl.Int64Var(&f.align, "align", layout.DefaultAlign, "offset of the data in every .npy file (multiple of 64)")
	fl.StringArrayVar(&f.views, "view", nil, "YAML file of stacked training views; repeatable")
	f.src.register(cmd, true)
}

// opened is a source with its metadata, layout, cache and decoding
// pipeline: everything a mount or a warm holds, closed in one place.
type opened struct {
	store objectstore.Store
	dec   *decode.Pipeline
	src   *layout.Source
	lay   *layout.Layout // the current one; a mount replaces it
	cache *cache.Cache
	stats *zarr.Stats // the work of every hierarchy opened from src
}

// Close releases everything open opened, the users of the decoder first.
// Fills must be done.
func (o *opened) Close() error {
	var errs []error
	if o.lay != nil {
		errs = append(errs, o.lay.Close())
	}
	if o.dec != nil {
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
	if f.align%64 != 0 || f.align <= 0 || f.align > layout.MaxAlign {
		return nil, usagef("--align %d: want a positive multiple of 64 up to %d", f.align, layout.MaxAlign)
	}
	if f.sampleDim == "" {
		return nil, usagef("--sample-dim: empty name")
	}
	var specs []*layout.ViewSpec
	for _, v := range f.views {
		s, err := layout.LoadViews(v)
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
	o := &opened{}
	ok := false
	defer func() {
		if !ok {
			o.Close()
		}
	}()
	if o.dec, err = f.src.newPipeline(log); err != nil {
		return nil, err
	}
	if o.store, err = f.src.openStore(ctx, src); err != nil {
		return nil, err
	}
	if o.cache, err = cache.Open(cache.Options{Dir: f.cacheDir, Size: size, Logger: log}); err != nil {
		return nil, err
	}
	// With a GPU, compressed chunks are read into, and fills decode into,
	// the pipeline's pinned memory.
	o.stats = &zarr.Stats{}
	zopts := zarr.Options{Logger: log, Decoder: o.dec, Memory: o.dec.Memory(), ChunkCacheBytes: oo.chunkCacheBytes, Stats: o.stats}
	if isRemote(o.store) && oo.chunkTier {
		zopts.SourceCache = o.cache.ChunkTier()
	}
	o.src = &layout.Source{
		Store:  o.store,
		Zarr:   zopts,
		Views:  specs,
		Layout: layout.Options{SampleDim: f.sampleDim, Align: f.align, Shard: oo.shard},
	}
	if o.lay, err = o.src.Open(ctx); err != nil {
		return nil, err
	}
	h, lay := o.lay.Hierarchy(), o.lay
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
	ok = true
	return o, nil
}

func isRemote(s objectstore.Store) bool {
	_, local := s.(*objectstore.Posix)
	return !local
}

// refreshLayout opens o's source again for a mount that follows a growing
// store: the metadata as it is now, and listings of the arrays being read.
// It warns about arrays newly left out.
func refreshLayout(ctx context.Context, o *opened, cur *layout.Layout, log *slog.Logger) (*layout.Layout, error) {
	next, err := o.src.Reopen(ctx, cur)
	if err != nil {
		return nil, err
	}
	was := map[string]bool{}
	for _, s := range cur.Skipped {
		was[s.Path] = true
	}
	for _, s := range next.Skipped {
		if !was[s.Path] {
			log.Warn("array left out of the mount", "array", s.Path, "reason", s.Reason)
		}
	}
	// What the new tree will not serve again goes first when room is
	// needed; zarrfs cache gc removes it.
	if n := zfs.DemoteGarbage(o.cache, next); n > 0 {
		log.Debug("stale cached files demoted", "files", n)
	}
	return next, nil
}
