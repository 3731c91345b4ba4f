package main

import (
	"cmp"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
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

// inspectFlags are the flags of `zarrfs inspect`.
type inspectFlags struct {
	src       sourceFlags
	asJSON    bool
	sampleDim string
	views     []string
}

func newInspectCmd() *cobra.Command {
	var f inspectFlags
	cmd := &cobra.Command{
		Use:   "inspect SOURCE",
		Short: "List every array of a store and how it appears in the mount; with --view, check view files",
		Long: `List every array of a store: shape, dtype, chunks, codecs, dimension names,
and how it appears in the mount. With --view FILE, also bind the views of
FILE to the store, as a mount does (the same errors), and list each view's
files, sample shape, dtype and bytes.`,
		Args: exactArgs(1, "SOURCE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runInspect(cmd, &f, args[0])
		},
	}
	f.src.register(cmd, false)
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print a JSON array, one object per array (with --view, an object of arrays and views)")
	cmd.Flags().StringArrayVar(&f.views, "view", nil, "YAML file of views to check against the store, as a mount binds them; repeatable")
	registerSampleDim(cmd, &f.sampleDim)
	return cmd
}

func runInspect(cmd *cobra.Command, f *inspectFlags, src string) error {
	ctx := cmd.Context()
	log, err := newLogger(cmd)
	if err != nil {
		return err
	}
	f.src.logger = log
	if err := f.src.validate(cmd, src); err != nil {
		return err
	}
	if err := checkSampleDim(f.sampleDim); err != nil {
		return err
	}
	limits, err := f.src.metaLimit.limits(memory.DefaultBudget())
	if err != nil {
		return err
	}
	specs, err := loadViews(f.views)
	if err != nil {
		return err
	}
	// A source that does not answer at first is waited for, as a mount
	// waits (untilAnswers).
	var st objectstore.Store
	err = untilAnswers(ctx, f.src.deadlines.timeout, log, "opening the source", func() (err error) {
		st, err = f.src.openStore(ctx, src)
		return err
	})
	if err != nil {
		return err
	}
	defer closeStore(st)
	// inspect decodes only what views bind with (coordinates), in its
	// own goroutine.
	source := &layout.Source{
		Store:  st,
		Zarr:   zarr.Options{Logger: discardLogger(), Decoder: codec.Inline{}, Limits: limits},
		Views:  specs,
		Layout: layout.Options{SampleDim: f.sampleDim},
	}
	lay, err := openLayout(ctx, source, f.src.deadlines.timeout, log)
	if err != nil {
		return err
	}
	defer lay.Close()
	h := lay.Hierarchy()
	entries := inspectEntries(h, lay)
	out := cmd.OutOrStdout()
	if f.asJSON {
		if len(f.views) == 0 {
			return writeJSON(out, entries)
		}
		return writeJSON(out, struct {
			Arrays []inspectEntry `json:"arrays"`
			Views  []viewEntry    `json:"views"`
		}{entries, viewEntries(lay)})
	}
	printInspect(out, h.Store.ID(), objectstore.DescribeVersions(h.Store), entries)
	if len(f.views) > 0 {
		printViews(out, viewEntries(lay))
	}
	return nil
}

// viewEntry is one view of `zarrfs inspect --view`.
type viewEntry struct {
	Name  string   `json:"name"`
	File  string   `json:"file"` // the view file it comes from
	Mount string   `json:"mount"`
	Files int64    `json:"files"`
	Shape []int64  `json:"shape"` // of one file: (C, *spatial)
	Dims  []string `json:"dims"`
	DType string   `json:"dtype"`
	// FileBytes is the size of one file, header included; Bytes all of
	// them.
	FileBytes int64 `json:"file_bytes"`
	Bytes     int64 `json:"bytes"`
}

func viewEntries(lay *layout.Layout) []viewEntry {
	out := []viewEntry{}
	for _, v := range lay.Views() {
		e := viewEntry{Name: v.Name, File: v.Spec.File(), Mount: v.Name + "/", Files: v.N,
			Shape: v.SampleShape, Dims: v.SampleDims, DType: v.DType.NumpyLE()}
		if d, ok := lay.Lookup(v.Name); ok && d.Kind == layout.KindDir && d.Dir.Len() > 0 {
			e.FileBytes = d.Dir.Entry(0).Size()
		}
		e.Bytes = e.FileBytes * e.Files
		out = append(out, e)
	}
	return out
}

// printViews writes the views' part of inspect's text listing.
func printViews(w io.Writer, views []viewEntry) {
	fmt.Fprintf(w, "%s\n", count(int64(len(views)), "view"))
	for _, v := range views {
		dims := make([]string, len(v.Dims))
		for i, d := range v.Dims {
			dims[i] = cmp.Or(printable(d), "-")
		}
		fmt.Fprintf(w, "%s (%s)\n", printable(v.Mount), printable(v.File))
		fmt.Fprintf(w, "  %s  shape %v  dims [%s]  dtype %s\n", count(v.Files, "file"), v.Shape, strings.Join(dims, ", "), v.DType)
		fmt.Fprintf(w, "  %s a file, %s in all\n", memory.Human(v.FileBytes), memory.Human(v.Bytes))
	}
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
