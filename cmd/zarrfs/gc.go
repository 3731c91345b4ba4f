package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/internal/memory"
)

func newCacheCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "Manage the cache directory",
	}
	var f layoutFlags
	gc := &cobra.Command{
		Use:   "gc SOURCE",
		Short: "Remove the cached files of SOURCE that a mount with the same flags will never serve again",
		Long: `List SOURCE's arrays and remove from the cache every file of its layout
that a mount with the same flags will never serve again: versions of samples
superseded by appends or rewritten chunks, and files whose names the tree no
longer has (such as the one-digit names of a store that grew past ten time
steps). Files of names the tree does not know at all (another mount's views)
and files open in a running mount are kept. A mount demotes the same files
so that they are evicted first; gc frees their space now.`,
		Args: exactArgs(1, "SOURCE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			if err := f.src.validate(cmd, args[0]); err != nil {
				return err
			}
			o, err := f.open(cmd.Context(), args[0], log, openOptions{})
			if err != nil {
				return err
			}
			defer o.Close()
			return prune(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f.register(gc)
	cmd.AddCommand(gc)
	subcommandsOnly(cmd)
	return cmd
}

// prune lists every array of o's layout and removes its garbage from the
// cache (fill.Garbage), printing one summary line.
func prune(ctx context.Context, o *opened, out io.Writer) error {
	if err := o.lay.ListAll(ctx, 8); err != nil {
		return err
	}
	var removed, kept int
	var bytes int64
	for _, b := range fill.Garbage(o.cache, o.lay) {
		gone, err := o.cache.RemoveBlob(o.lay.ID, b.Path)
		if err != nil {
			return err
		}
		if gone {
			removed++
			bytes += b.Size
		} else {
			kept++
		}
	}
	fmt.Fprintf(out, "zarrfs: removed %s (%s) from %s", count(int64(removed), "stale file"), memory.Human(bytes), o.cache.BlobDir(o.lay.ID))
	if kept > 0 {
		fmt.Fprintf(out, "; %d in use kept", kept)
	}
	fmt.Fprintln(out)
	printForeign(out, fill.Foreign(o.cache, o.lay))
	return nil
}

// printForeign says what prune kept because this command's layout does
// not know the names: one line, the names in order.
func printForeign(out io.Writer, foreign map[string][]cache.BlobEntry) {
	if len(foreign) == 0 {
		return
	}
	names := slices.Sorted(maps.Keys(foreign))
	var n, bytes int64
	for i, name := range names {
		for _, b := range foreign[name] {
			n++
			bytes += b.Size
		}
		names[i] = printable(name) + "/"
	}
	fmt.Fprintf(out, "zarrfs: kept %s (%s) under %s, which this command does not serve: another mount's views (give their --view to prune them too) or arrays gone from the store (remove those folders by hand)\n",
		count(n, "file"), memory.Human(bytes), strings.Join(names, ", "))
}
