package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/zarr"
)

// metadataLimitFlag is --metadata-limit: the bounds on a store's metadata
// (zarr.MetadataLimits), as KEY=VALUE pairs, any subset of them.
type metadataLimitFlag struct {
	kv map[string]string
}

func (f *metadataLimitFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringToStringVar(&f.kv, "metadata-limit", nil, fmt.Sprintf(
		"bounds on the store's metadata, any of document=SIZE (one zarr.json, .zarray, .zmetadata...; default %s), "+
			"total=SIZE (all of them; default --memory/64, at most %s), nodes=N (arrays and groups; default %d), depth=N (group nesting; default %d), attributes=SIZE (kept per array, the rest named in its sidecar; default %s); "+
			"parsing takes up to about 30 times the total in memory",
		memory.Human(zarr.DefaultMetadataDocument), memory.Human(zarr.DefaultMetadataTotal), zarr.DefaultMetadataNodes, zarr.DefaultMetadataDepth, memory.Human(zarr.DefaultAttributes)))
}

// limits parses the flag. What it leaves out is zarr's default, but for
// the byte limits: parsing JSON takes up to about 30 times its size in
// memory, so that the metadata of the tree in all may take mem/64 (half
// of the budget's room for it, at the worst, while a refresh holds two
// trees), and no document more than that.
func (f *metadataLimitFlag) limits(mem int64) (zarr.MetadataLimits, error) {
	l, err := f.parse()
	if err != nil {
		return l, err
	}
	if l.Total == 0 {
		l.Total = min(max(mem/64, 1<<20), zarr.DefaultMetadataTotal)
	}
	if l.Document == 0 {
		l.Document = min(zarr.DefaultMetadataDocument, l.Total)
	}
	return l, nil
}

func (f *metadataLimitFlag) parse() (zarr.MetadataLimits, error) {
	var l zarr.MetadataLimits
	keys := make([]string, 0, len(f.kv))
	for k := range f.kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := strings.TrimSpace(f.kv[k])
		bad := func(want string) error {
			return usagef("--metadata-limit %s=%s: want %s", k, v, want)
		}
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "document", "total", "attributes":
			n, err := cache.ParseSize(v)
			if err != nil || n <= 0 {
				return l, bad("a positive size such as 16MiB")
			}
			switch k {
			case "document":
				l.Document = n
			case "total":
				l.Total = n
			default:
				l.Attributes = n
			}
		case "nodes", "depth":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return l, bad("a positive number")
			}
			if k == "nodes" {
				l.Nodes = n
			} else {
				l.Depth = n
			}
		default:
			return l, usagef("--metadata-limit %s: unknown; want document, total, nodes, depth or attributes", k)
		}
	}
	return l, nil
}
