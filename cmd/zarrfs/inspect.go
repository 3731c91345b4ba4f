package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/zarrfs/zarrfs/fs/layout"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
	"github.com/zarrfs/zarrfs/zarr/codec"
)

// inspectEntry is one array of `zarrfs inspect --json` (docs/design.md §7).
type inspectEntry struct {
	Path   string   `json:"path"`
	Shape  []int64  `json:"shape"`
	DType  string   `json:"dtype"`
	Chunks []int64  `json:"chunks"`
	Codecs []string `json:"codecs"`
	// InnerChunks and InnerCodecs: a sharded array's innermost chunks
	// (the unit decoded), null without sharding.
	InnerChunks []int64   `json:"inner_chunks"`
	InnerCodecs []string  `json:"inner_codecs"`
	Dims        []*string `json:"dims"` // null for an unnamed dimension, as in sidecars
	Mount       *string   `json:"mount"`
	Unsupported *string   `json:"unsupported"`
}

func newInspectCmd() *cobra.Command {
	var sf sourceFlags
	var asJSON bool
	var sampleDim string
	cmd := &cobra.Command{
		Use:   "inspect SOURCE",
		Short: "List every array of a store and how it appears in the mount",
		Args:  exactArgs(1, "SOURCE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			sf.logger = log
			if err := sf.validate(cmd, args[0]); err != nil {
				return err
			}
			if err := checkSampleDim(sampleDim); err != nil {
				return err
			}
			limits, err := sf.metaLimit.limits(memory.DefaultBudget())
			if err != nil {
				return err
			}
			// inspect decodes nothing: one CPU worker.
			st, err := sf.openStore(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer closeStore(st)
			dec := codec.NewCPU(codec.Options{Workers: 1})
			defer dec.Close()
			h, err := zarr.Open(cmd.Context(), st, zarr.Options{Logger: discardLogger(), Decoder: dec, Limits: limits})
			if err != nil {
				return err
			}
			defer h.Close()
			lay, err := layout.Build(h, layout.Options{SampleDim: sampleDim})
			if err != nil {
				return err
			}
			entries := inspectEntries(h, lay)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				return enc.Encode(entries)
			}
			printInspect(cmd.OutOrStdout(), h.Store.ID(), objectstore.DescribeVersions(h.Store), entries)
			return nil
		},
	}
	sf.register(cmd, false)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array, one object per array")
	registerSampleDim(cmd, &sampleDim)
	return cmd
}

func inspectEntries(h *zarr.Hierarchy, lay *layout.Layout) []inspectEntry {
	skipped := map[string]string{}
	for _, s := range lay.Skipped {
		skipped[s.Path] = s.Reason
	}
	out := make([]inspectEntry, 0, len(h.Arrays))
	for _, a := range h.Arrays {
		e := inspectEntry{Path: a.Path, Shape: a.Shape, Chunks: a.Chunks, Codecs: a.Codecs, Dims: make([]*string, len(a.Dims)),
			InnerChunks: a.InnerChunks, InnerCodecs: a.InnerCodecs}
		if e.InnerChunks != nil && e.InnerCodecs == nil {
			e.InnerCodecs = []string{}
		}
		for i, d := range a.Dims {
			if d != "" {
				e.Dims[i] = &a.Dims[i]
			}
		}
		if e.Codecs == nil {
			e.Codecs = []string{}
		}
		if a.DType.Size > 0 {
			e.DType = a.DType.NumpySource()
		}
		if reason, ok := skipped[a.Path]; ok {
			e.Unsupported = &reason
		} else if m := mountName(lay, a.Path); m != "" {
			e.Mount = &m
		}
		out = append(out, e)
	}
	return out
}

// printInspect writes the text listing. Every string from the store
// (names, dimension and codec names, reasons that quote metadata) is
// escaped where it holds anything unprintable, so that a store cannot
// forge lines or send terminal escapes through it.
func printInspect(w io.Writer, id, versions string, entries []inspectEntry) {
	fmt.Fprintf(w, "%s: %s\n", printable(id), count(int64(len(entries)), "array"))
	fmt.Fprintf(w, "chunk versions: %s\n", versions)
	for _, e := range entries {
		name := printable(e.Path)
		if e.Path == "" {
			name = "(root array)"
		}
		fmt.Fprintf(w, "%s\n", name)
		fmt.Fprintf(w, "  shape %v  dtype %s  chunks %v", e.Shape, e.DType, e.Chunks)
		if e.InnerChunks != nil {
			fmt.Fprintf(w, "  inner chunks %v", e.InnerChunks)
		}
		fmt.Fprintln(w)
		dims := make([]string, len(e.Dims))
		for i, d := range e.Dims {
			dims[i] = "-"
			if d != nil {
				dims[i] = printable(*d)
			}
		}
		codecs := make([]string, len(e.Codecs))
		for i, c := range e.Codecs {
			codecs[i] = printable(c)
		}
		fmt.Fprintf(w, "  dims [%s]  codecs [%s]", strings.Join(dims, ", "), strings.Join(codecs, ", "))
		if e.InnerChunks != nil {
			inner := make([]string, len(e.InnerCodecs))
			for i, c := range e.InnerCodecs {
				inner[i] = printable(c)
			}
			fmt.Fprintf(w, "  inner codecs [%s]", strings.Join(inner, ", "))
		}
		fmt.Fprintln(w)
		switch {
		case e.Unsupported != nil:
			fmt.Fprintf(w, "  unsupported: %s\n", printable(*e.Unsupported))
		case e.Mount != nil:
			fmt.Fprintf(w, "  mount: %s\n", printable(*e.Mount))
		}
	}
}

// printable returns s as it is when every character prints, else quoted
// with Go's escapes ("a\nb", "\x1b[31m"), as the log's text format does.
func printable(s string) string {
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// mountName is how an array appears in the mount: "t/" for a directory of
// samples, "lsm.npy" for a whole-array file.
func mountName(lay *layout.Layout, p string) string {
	if p == "" { // a root array is named after the store
		root := lay.Root()
		for i := 0; i < root.Len(); i++ {
			switch e := root.Entry(i); e.Kind {
			case layout.KindDir:
				return e.Name + "/"
			case layout.KindBlob:
				return e.Name
			}
		}
		return ""
	}
	if e, ok := lay.Lookup(p); ok && e.Kind == layout.KindDir {
		if _, isArray := lay.Lookup(p + ".json"); isArray {
			return p + "/"
		}
	}
	if e, ok := lay.Lookup(p + ".npy"); ok && e.Kind == layout.KindBlob {
		return p + ".npy"
	}
	return ""
}
