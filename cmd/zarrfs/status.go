package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/internal/memory"
)

func newStatusCmd() *cobra.Command {
	var asJSON bool
	var watch time.Duration
	var cacheDir string
	cmd := &cobra.Command{
		Use:   "status [MOUNTPOINT]",
		Short: "Show what a running mount is doing (cache use and hits, fills, errors, decoding), or what a cache holds",
		Long: `Show a running mount's status: source, flags, cache bytes used and budget,
hits and fills, fills in flight, errors by array, where chunks decode and
what the GPUs hold, uptime. Without MOUNTPOINT, every mount of this user.
With --cache DIR, what the cache directory holds, read from its journal
without a running daemon.`,
		Args: maxArgs(1, "one MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if watch < 0 {
				return usagef("--watch %v: want a positive duration (or none: print once)", watch)
			}
			if cacheDir != "" {
				if len(args) > 0 {
					return usagef("status: give MOUNTPOINT or --cache, not both")
				}
				abs, err := filepath.Abs(cacheDir)
				if err != nil {
					return err
				}
				if _, err := os.Stat(abs); err != nil {
					return fmt.Errorf("%s: %w", abs, dirErr(err))
				}
				s, err := cache.Summarize(abs)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(out, cacheSummaryDoc(s))
				}
				printCacheSummary(out, s)
				return nil
			}
			for {
				docs, err := statusDocs(cmd, args)
				if err != nil {
					return err
				}
				if watch > 0 {
					fmt.Fprint(out, "\033[H\033[2J") // home, clear: a terminal view refreshed in place
				}
				if asJSON {
					var v any = docs
					if len(args) == 1 {
						v = docs[0]
					}
					if err := writeJSON(out, v); err != nil {
						return err
					}
				} else {
					for i, d := range docs {
						if i > 0 {
							fmt.Fprintln(out)
						}
						printStatus(out, d)
					}
				}
				if watch <= 0 {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(watch):
				}
			}
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (one object, or an array without MOUNTPOINT)")
	cmd.Flags().DurationVar(&watch, "watch", 0, "refresh every this long (e.g. 2s) until interrupted")
	cmd.Flags().StringVar(&cacheDir, "cache", "", "summarize this cache directory instead of a mount")
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// statusDocs asks the mount at args[0], or every registered mount of this
// user, for its status.
func statusDocs(cmd *cobra.Command, args []string) ([]statusDoc, error) {
	var recs []*mountRecord
	if len(args) == 1 {
		abs, err := filepath.Abs(args[0])
		if err != nil {
			return nil, err
		}
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		rec, ok := findMount(abs)
		if !ok || rec.Mountpoint != abs {
			return nil, noStatus(args[0], abs, rec)
		}
		recs = append(recs, rec)
	} else {
		recs = allMounts()
		if len(recs) == 0 {
			return nil, fmt.Errorf("no running zarrfs mount of this user (registry %s)", registryDir())
		}
	}
	var docs []statusDoc
	var firstErr error
	for _, r := range recs {
		d, err := fetchStatus(cmd.Context(), controlSocket(r.Mountpoint))
		if err != nil {
			err = fmt.Errorf("%s: daemon %d does not answer: %w", r.Mountpoint, r.PID, err)
			if len(args) == 1 {
				return nil, err
			}
			// Listing every mount: say which did not answer, show the rest.
			fmt.Fprintf(cmd.ErrOrStderr(), "zarrfs: %v\n", err)
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		docs = append(docs, d)
	}
	if len(docs) == 0 {
		return nil, firstErr
	}
	return docs, nil
}

// noStatus says what is at arg instead of a running mount of this user:
// a stale mount, another user's or an unregistered zarrfs mount, another
// filesystem, a folder inside a mount, or a plain folder.
func noStatus(arg, abs string, inside *mountRecord) error {
	if staleMount(abs) {
		return fmt.Errorf("%s: a stale mount: its daemon died (transport endpoint is not connected); zarrfs unmount %s clears it, or zarrfs mount again on it", arg, arg)
	}
	if e, ok := mountAt(abs); ok {
		if mnt, uid, ours := zarrfsMount(e); ours && uid != os.Geteuid() {
			return fmt.Errorf("%s: the zarrfs mount at %s belongs to %s; zarrfs status answers only for your own mounts", arg, mnt, describeUser(uid))
		}
		if e.FSType == "fuse.zarrfs" {
			return fmt.Errorf("%s: a zarrfs mount of %s whose daemon is not in %s (started with another XDG_RUNTIME_DIR?)", arg, e.Source, registryDir())
		}
		return fmt.Errorf("%s: mounted as %s (%s), not zarrfs", arg, e.FSType, e.Source)
	}
	if inside != nil {
		return fmt.Errorf("%s: inside the zarrfs mount at %s; give its mountpoint", arg, inside.Mountpoint)
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("%s: %w", arg, unwrapPath(err))
	}
	return fmt.Errorf("%s: not a mount point (no running zarrfs mount of this user there)", arg)
}

func printStatus(w io.Writer, d statusDoc) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	budget := "unlimited"
	if d.Cache.BudgetB > 0 {
		budget = memory.Human(d.Cache.BudgetB)
	}
	hit := "-"
	if n := d.Cache.Hits + d.Cache.Misses; n > 0 {
		hit = fmt.Sprintf("%.1f%%", 100*float64(d.Cache.Hits)/float64(n))
	}
	mode := "plain (reads through the daemon)"
	if d.Mount.Passthrough {
		mode = "plain (FUSE passthrough)"
	}
	if d.Mount.Direct {
		mode = "direct (links into the cache), lease " + d.Mount.Lease
	}
	fmt.Fprintf(tw, "mount\t%s\n", d.Mountpoint)
	fmt.Fprintf(tw, "source\t%s\n", d.Source)
	fmt.Fprintf(tw, "daemon\tpid %d, up %s\n", d.PID, (time.Duration(d.UptimeSeconds) * time.Second).String())
	fmt.Fprintf(tw, "flags\t%s\n", strings.Join(d.Args, " "))
	if d.LogFile != "" {
		fmt.Fprintf(tw, "log\t%s\n", d.LogFile)
	}
	ranks := "every sample"
	if d.Mount.World > 1 {
		ranks = fmt.Sprintf("rank %d of %d (%s)", d.Mount.Rank, d.Mount.World, d.Mount.Shard)
	}
	fmt.Fprintf(tw, "mode\t%s; %s; %s, %s\n", mode, ranks, count(int64(d.Mount.Arrays), "array"), count(d.Mount.Files, "file"))
	fmt.Fprintf(tw, "cache\t%s of %s used, %s, blobs mode %s (%s)\n", memory.Human(d.Cache.UsedB), budget, count(int64(d.Cache.Files), "file"), d.Cache.BlobMode, d.Cache.Dir)
	fmt.Fprintf(tw, "\tdecoded: %s in %s; %d hits, %d fills\n", memory.Human(d.Cache.BlobB), count(int64(d.Cache.Blobs), "file"), d.Cache.Hits, d.Cache.Misses)
	fmt.Fprintf(tw, "\tcompressed: %s in %s; %d hits, %d misses; %d kept, %d damaged, %d evicted\n", memory.Human(d.Cache.ChunkB), count(int64(d.Cache.Chunks), "chunk"),
		d.Cache.ChunkHits, d.Cache.ChunkMisses, d.Cache.ChunkStores, d.Cache.ChunkDamaged, d.Cache.ChunkEvictions)
	fmt.Fprintf(tw, "opens\t%d; %s open now\n", d.Mount.Opens, count(d.Mount.OpenFiles, "file"))
	// Requests are opens, link resolutions and readahead (docs/operations.md).
	fmt.Fprintf(tw, "requests\t%d hits, %d fills (hit rate %s); %d fills in flight\n", d.Cache.Hits, d.Cache.Misses, hit, d.Cache.Filling)
	fmt.Fprintf(tw, "evictions\t%d (%s)\n", d.Cache.Evictions, memory.Human(d.Cache.EvictedB))
	fmt.Fprintf(tw, "source\t%s fetched; %d chunks decoded, %d missing (fill value)\n", memory.Human(d.Reads.BytesFetched), d.Reads.ChunksDecoded, d.Reads.ChunksMissing)
	fmt.Fprintf(tw, "decoding\t%s; GPUs hold %s device, %s pinned\n", d.Decode.Placement, memory.Human(d.Decode.GPUDeviceB), memory.Human(d.Decode.GPUPinnedB))
	if p := d.Decode.GPUPinned; p.StagingB+p.PoolB > 0 {
		fmt.Fprintf(tw, "\tpinned: %s staging, %s pool (%s lent, at most %s); %s lent unpinned (the pool had no room)\n", memory.Human(p.StagingB), memory.Human(p.PoolB),
			memory.Human(p.LentB), memory.Human(p.LentPeakB), memory.Human(p.MissedB))
	}
	for _, r := range d.Decode.Decoded {
		fmt.Fprintf(tw, "\t%s on %s: %d chunks, %s\n", r.Codec, r.Device, r.Chunks, memory.Human(r.Bytes))
	}
	for _, g := range d.Decode.GPUs {
		fmt.Fprintf(tw, "\tGPU %d: %d chunks, %s; %d refused, %d corrupt\n", g.Device, g.Chunks, memory.Human(g.Bytes), g.Refused, g.Corrupt)
	}
	printDelivery(tw, d.Delivery)
	if len(d.Errors) == 0 {
		fmt.Fprintf(tw, "errors\tnone\n")
	}
	var arrays []string
	for a := range d.Errors {
		arrays = append(arrays, a)
	}
	sort.Strings(arrays)
	for i, a := range arrays {
		label := ""
		if i == 0 {
			label = "errors"
		}
		fmt.Fprintf(tw, "%s\t%s: %d failed opens\n", label, a, d.Errors[a])
	}
	tw.Flush()
}

// cacheSummaryJSON is what `zarrfs status --cache DIR --json` prints.
type cacheSummaryJSON struct {
	Dir        string            `json:"dir"`
	Blobs      int               `json:"blobs"`
	BlobBytes  int64             `json:"blob_bytes"`
	Chunks     int               `json:"chunks"`
	ChunkBytes int64             `json:"chunk_bytes"`
	Layouts    []cacheLayoutJSON `json:"layouts"`
	Running    int               `json:"running"`
}

type cacheLayoutJSON struct {
	ID    string `json:"id"`
	Blobs int    `json:"blobs"`
	Bytes int64  `json:"bytes"`
}

func cacheSummaryDoc(s cache.Summary) cacheSummaryJSON {
	d := cacheSummaryJSON{Dir: s.Dir, Blobs: s.Blobs, BlobBytes: s.BlobBytes, Chunks: s.Chunks, ChunkBytes: s.ChunkBytes,
		Layouts: []cacheLayoutJSON{}, Running: s.Running}
	for _, l := range s.Layouts {
		d.Layouts = append(d.Layouts, cacheLayoutJSON{ID: l.ID, Blobs: l.Blobs, Bytes: l.Bytes})
	}
	return d
}

func printCacheSummary(w io.Writer, s cache.Summary) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "cache\t%s\n", s.Dir)
	fmt.Fprintf(tw, "used\t%s in %d files: %s in %d blobs, %s in %d compressed chunks\n",
		memory.Human(s.BlobBytes+s.ChunkBytes), s.Blobs+s.Chunks, memory.Human(s.BlobBytes), s.Blobs, memory.Human(s.ChunkBytes), s.Chunks)
	for _, l := range s.Layouts {
		fmt.Fprintf(tw, "layout\t%s: %d blobs, %s\n", l.ID, l.Blobs, memory.Human(l.Bytes))
	}
	fmt.Fprintf(tw, "instances\t%d running\n", s.Running)
	tw.Flush()
}
