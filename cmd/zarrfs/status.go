package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
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
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if cacheDir != "" {
				if len(args) > 0 {
					return usagef("status: give MOUNTPOINT or --cache, not both")
				}
				s, err := cache.Summarize(cacheDir)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(out, s)
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

func init() { rootCmd.AddCommand(newStatusCmd()) }

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
			return nil, fmt.Errorf("%s: not the mountpoint of a running zarrfs mount of this user", args[0])
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
	fmt.Fprintf(tw, "mode\t%s; rank %d of %d; %d arrays, %d files\n", mode, d.Mount.Rank, d.Mount.World, d.Mount.Arrays, d.Mount.Files)
	fmt.Fprintf(tw, "cache\t%s of %s used, %d files, blobs mode %s (%s)\n", memory.Human(d.Cache.UsedB), budget, d.Cache.Files, d.Cache.BlobMode, d.Cache.Dir)
	fmt.Fprintf(tw, "opens\t%d (hits %s: %d, fills %d, %d in flight); %d files open now\n", d.Mount.Opens, hit, d.Cache.Hits, d.Cache.Misses, d.Cache.Filling, d.Mount.OpenFiles)
	fmt.Fprintf(tw, "evictions\t%d (%s)\n", d.Cache.Evictions, memory.Human(d.Cache.EvictedB))
	fmt.Fprintf(tw, "source\t%s fetched; %d chunks decoded, %d missing (fill value)\n", memory.Human(d.Reads.BytesFetched), d.Reads.ChunksDecoded, d.Reads.ChunksMissing)
	fmt.Fprintf(tw, "decoding\t%s; GPUs hold %s device, %s pinned\n", d.Decode.Placement, memory.Human(d.Decode.GPUDeviceB), memory.Human(d.Decode.GPUPinnedB))
	for _, r := range d.Decode.Decoded {
		fmt.Fprintf(tw, "\t%s on %s: %d chunks, %s\n", r.Codec, r.Device, r.Chunks, memory.Human(r.Bytes))
	}
	for _, g := range d.Decode.GPUs {
		fmt.Fprintf(tw, "\tGPU %d: %d chunks, %s; %d refused, %d corrupt\n", g.Device, g.Chunks, memory.Human(g.Bytes), g.Refused, g.Corrupt)
	}
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
