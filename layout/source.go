package layout

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// Source opens a store's metadata and lays it out, as often as asked: a
// mount opens it again every --metadata-ttl to follow a store that grows,
// and serves the new Layout in place of the old.
type Source struct {
	// Store is the source; the caller closes it.
	Store objectstore.Store
	// Zarr configures every Hierarchy opened: share Options.Stats to count
	// across them, and set Options.Decoder to the process's pipeline (nil
	// decodes in the reading goroutine, one chunk at a time).
	Zarr zarr.Options
	// Views are the view specs, bound anew at every Open.
	Views []*ViewSpec
	// Layout configures the layout; its Views are filled in by Open.
	Layout Options
}

// Open reads the metadata, binds the views and builds the layout. The
// layout owns the new Hierarchy: Close it when done.
//
// A list of sample dimensions (Layout.SampleDim "time,valid_time") is
// resolved by the first Open to the name the store uses, which later opens
// keep; when no array has any of them, Open warns once, naming the
// dimensions the arrays have.
func (s *Source) Open(ctx context.Context) (*Layout, error) {
	h, err := zarr.Open(ctx, s.Store, s.Zarr)
	if err != nil {
		return nil, err
	}
	// The name is kept even when no array has it yet (a store of
	// coordinates only, or empty): the layout's ID names it, and a later
	// open that chose another would make a layout a refresh refuses.
	dim, ok := ChooseSampleDim(h, cmp.Or(s.Layout.SampleDim, DefaultSampleDims))
	if !ok && s.Zarr.Logger != nil && len(multiDims(h, 1)) > 0 {
		s.Zarr.Logger.Warn("no array has the sample dimension; every array is mounted as one file",
			"sample_dim", cmp.Or(s.Layout.SampleDim, DefaultSampleDims), "dims", strings.Join(multiDims(h, 12), ","))
	}
	s.Layout.SampleDim = dim
	views, err := BindViews(ctx, h, s.Views, BindOptions{SampleDim: s.Layout.SampleDim})
	if err != nil {
		h.Close()
		return nil, err
	}
	o := s.Layout
	o.Views = views
	l, err := Build(h, o)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("%s: %w", strings.TrimSuffix(s.Store.ID(), "/"), err)
	}
	return l, nil
}

// Reopen opens the source again and, before returning, lists in the new
// hierarchy every array that prev had listed (the arrays being read), at
// most eight at a time, so that opening their blobs costs no request. The
// other arrays are listed when first read. prev stays usable until the
// caller closes it.
//
// zarr.Open's warnings about unsupported arrays are not repeated: compare
// Layout.Skipped with prev's to report new ones.
func (s *Source) Reopen(ctx context.Context, prev *Layout) (*Layout, error) {
	quiet := *s
	quiet.Zarr.Logger = slog.New(slog.DiscardHandler)
	// A store emptied or deleted under a running mount is followed, as an
	// array deleted is: the tree empties (zarr.Hierarchy.Vanished).
	quiet.Zarr.EmptyWhenGone = true
	l, err := quiet.Open(ctx)
	if err != nil {
		return nil, err
	}
	var active []*zarr.Array
	for _, a := range prev.h.Arrays {
		if a.Listing() == nil {
			continue
		}
		if na := l.h.Array(a.Path); na != nil && na.Unsupported == "" && na.Versioned() {
			active = append(active, na)
		}
	}
	if err := l.h.ListAll(ctx, active, 8); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// ListAll lists every array of l that its blobs read, at most par at a
// time (what `zarrfs warm` and `zarrfs cache gc` need before they check
// every blob).
func (l *Layout) ListAll(ctx context.Context, par int) error {
	var arrays []*zarr.Array
	for _, a := range l.h.Arrays {
		if a.Unsupported == "" && a.Versioned() {
			arrays = append(arrays, a)
		}
	}
	return l.h.ListAll(ctx, arrays, par)
}

// Close releases the layout's hierarchy (its decoded-chunk memory). Fills
// still running finish normally.
func (l *Layout) Close() error {
	if l.h == nil {
		return nil
	}
	return l.h.Close()
}

// Hierarchy returns the hierarchy the layout was built from.
func (l *Layout) Hierarchy() *zarr.Hierarchy { return l.h }
