package layout

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/zarrfs/zarrfs/zarr"
)

// A view (docs/design.md §5) stacks channels taken from several arrays into
// one (C, *spatial) sample per index along the sample dimension. A ViewSpec
// (view_spec.go) is what the file says; Bind checks it against an opened
// hierarchy and resolves every channel to an array and indices, giving a
// View; Build then adds MOUNT/NAME/K.npy and MOUNT/NAME.json.
//
// Package fill fills one sample with one Read for all its channels, so a
// source chunk that holds several of them (levels 0 and 2 of t) is decoded
// once. Samples filled one after another reuse the chunks they share
// through the zarr decoded-chunk cache; fill.Filler.FillInto reads a run
// of samples in one Read, which decodes each shared chunk once without
// relying on that cache.

// BindOptions configure Bind. The zero value is valid.
type BindOptions struct {
	// SampleDim is the mount's sample dimension, used by views that name
	// none, or a list resolved as Build resolves it (ChooseSampleDim).
	// Empty means DefaultSampleDims.
	SampleDim string
	// Reader reads coordinate arrays. Nil means the hierarchy.
	Reader zarr.Reader
}

// maxStaticMemo bounds the bytes of static channels a View keeps after the
// first fill, so later samples copy them instead of decoding them again.
const maxStaticMemo = 256 << 20

// maxCoordBytes bounds a coordinate array a view reads whole when it binds
// (to look up select_values and the sample coordinates).
const maxCoordBytes = 1 << 30

// View is a ViewSpec bound to a hierarchy. It is immutable apart from an
// internal memo of static channels, and safe for concurrent use.
type View struct {
	Spec *ViewSpec
	Name string
	// SampleDim is the dimension whose indices are the samples.
	SampleDim string
	// Start, Stop and Step give the source indices of the samples:
	// sample K is index Start + K*Step, all below Stop.
	Start, Stop, Step int64
	// N is the number of samples.
	N int64
	// DType is the output type.
	DType zarr.DType
	// Channels are the stacked channels, selections expanded.
	Channels []Channel
	// SampleShape is (C, *spatial); SampleDims names its dimensions
	// ("channel" first, "" for an unnamed dimension).
	SampleShape []int64
	SampleDims  []string
	// SampleCoords holds the sample dimension's coordinate values for the
	// view's samples (JSON-ready), nil when the store has no such array.
	SampleCoords []any
	// SampleCoordsAttributes are that coordinate array's attributes (units).
	SampleCoordsAttributes map[string]any

	h          *zarr.Hierarchy
	def        string
	memoStatic bool
	mu         sync.Mutex
	static     *staticMemo
}

// Channel is one channel of a view.
type Channel struct {
	// Var is the array's store path.
	Var   string
	Array *zarr.Array
	// Axis is the array's sample axis; -1 for a static channel, repeated in
	// every sample.
	Axis int
	// Select holds the selected index of each selected dimension, in the
	// array's dimension order.
	Select []Selected
	// Spec is the index of the channel entry in ViewSpec.Channels it comes from.
	Spec int
}

// Selected is one dimension's selected index.
type Selected struct {
	Dim   string
	Axis  int
	Index int64
	// Value is the coordinate value at Index (JSON-ready), nil when the
	// store has no 1-D coordinate array for Dim.
	Value any
}

// Region returns the source region of the channel for sample index t.
func (c *Channel) Region(t int64) (start, count []int64) {
	rank := len(c.Array.Shape)
	start = make([]int64, rank)
	count = append(make([]int64, 0, rank), c.Array.Shape...)
	if c.Axis >= 0 {
		start[c.Axis], count[c.Axis] = t, 1
	}
	for _, s := range c.Select {
		start[s.Axis], count[s.Axis] = s.Index, 1
	}
	return start, count
}

// BindViews binds every spec, checking that names are unique.
func BindViews(ctx context.Context, h *zarr.Hierarchy, specs []*ViewSpec, o BindOptions) ([]*View, error) {
	b := &binder{ctx: ctx, h: h, o: o, coords: map[string][]byte{}}
	var out []*View
	seen := map[string]*ViewSpec{}
	for _, s := range specs {
		if prev, dup := seen[s.Name]; dup {
			return nil, s.errorf("name", "a view named %q is already defined at %s:%d", s.Name, prev.file, prev.lines["name"])
		}
		seen[s.Name] = s
		v, err := b.bind(s)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Bind checks the spec against h and resolves its channels. Errors name the
// file, line, view and field (*SpecError, wrapping ErrInvalidView), except
// failures to read a coordinate array, which wrap the read error.
func (s *ViewSpec) Bind(ctx context.Context, h *zarr.Hierarchy, o BindOptions) (*View, error) {
	return (&binder{ctx: ctx, h: h, o: o, coords: map[string][]byte{}}).bind(s)
}

type binder struct {
	ctx    context.Context
	h      *zarr.Hierarchy
	o      BindOptions
	coords map[string][]byte // coordinate array path -> values
}

func (b *binder) reader() zarr.Reader {
	if b.o.Reader != nil {
		return b.o.Reader
	}
	return b.h
}

func (b *binder) bind(s *ViewSpec) (*View, error) {
	h := b.h
	if h == nil {
		return nil, s.errorf("", "no store to bind to")
	}
	v := &View{Spec: s, Name: s.Name, SampleDim: s.SampleDim, h: h}
	if v.SampleDim == "" {
		v.SampleDim, _ = ChooseSampleDim(h, cmp.Or(b.o.SampleDim, DefaultSampleDims))
	}
	if err := checkCollision(h, s); err != nil {
		return nil, err
	}
	var firstSpatial, commonFrom *Channel // the channels others are compared with
	var spatial []int64
	var spatialDims []string
	for i, cs := range s.Channels {
		field := fmt.Sprintf("channels[%d]", i)
		a := h.Array(cs.Var)
		if a == nil {
			return nil, s.errorf(field+".var", "array %q not found in the store", cs.Var)
		}
		if a.Unsupported != "" {
			return nil, s.errorf(field+".var", "array %q cannot be read: %s", cs.Var, a.Unsupported)
		}
		sels, err := b.selections(s, a, cs, field, v.SampleDim)
		if err != nil {
			return nil, err
		}
		first, shape, dims := v.addChannels(a, dimIndex(a, v.SampleDim), i, sels)
		if firstSpatial == nil {
			firstSpatial, spatial, spatialDims = first, shape, dims
		} else if err := sameSpatial(s, field, a, shape, dims, firstSpatial, spatial, spatialDims); err != nil {
			return nil, err
		}
		if s.DType == "" {
			if commonFrom == nil {
				commonFrom = first
			} else if !zarr.SameValues(commonFrom.Array.DType, a.DType) {
				return nil, s.errorf(field, "channel %s is %s but channel %s (channels[%d]) is %s: set dtype to choose the output type",
					a.Path, a.DType.Name(), commonFrom.Var, commonFrom.Spec, commonFrom.Array.DType.Name())
			}
		}
	}
	if err := v.outputDType(s, commonFrom); err != nil {
		return nil, err
	}
	if err := b.sampleRange(s, v); err != nil {
		return nil, err
	}
	v.SampleShape = append([]int64{int64(len(v.Channels))}, spatial...)
	v.SampleDims = append([]string{"channel"}, spatialDims...)
	if err := b.sampleCoords(v); err != nil {
		return nil, err
	}
	staticBytes := int64(0)
	for _, ch := range v.Channels {
		if ch.Axis < 0 {
			staticBytes += prod(spatial) * int64(v.DType.Size)
		}
	}
	v.memoStatic = staticBytes > 0 && staticBytes <= maxStaticMemo
	v.def = v.definition()
	return v, nil
}

// dimSel is one selected dimension of a channel entry: its axis in the
// array and the indices (and coordinate values) selected along it.
type dimSel struct {
	dim     string
	axis    int
	indices []int64
	values  []any
}

// selections resolves a channel entry's select and select_values to the
// axes and indices they name, in the array's dimension order.
func (b *binder) selections(s *ViewSpec, a *zarr.Array, cs ChannelSpec, field, sampleDim string) ([]dimSel, error) {
	var sels []dimSel
	for _, d := range cs.Select {
		df := field + ".select." + d.Dim
		ax, err := b.selectAxis(s, a, d.Dim, df, sampleDim)
		if err != nil {
			return nil, err
		}
		if d.All {
			d.Indices = make([]int64, a.Shape[ax])
			for j := range d.Indices {
				d.Indices[j] = int64(j)
			}
		}
		for j, x := range d.Indices {
			if x >= a.Shape[ax] {
				return nil, s.errorf(fmt.Sprintf("%s[%d]", df, j), "index %d out of range: dimension %s of %s has %d entries (0..%d)", x, d.Dim, a.Path, a.Shape[ax], a.Shape[ax]-1)
			}
		}
		vals, err := b.coordValuesAt(a, ax, d.Dim, d.Indices)
		if err != nil {
			return nil, err
		}
		sels = append(sels, dimSel{d.Dim, ax, d.Indices, vals})
	}
	for _, d := range cs.SelectValues {
		df := field + ".select_values." + d.Dim
		ax, err := b.selectAxis(s, a, d.Dim, df, sampleDim)
		if err != nil {
			return nil, err
		}
		idx, vals, err := b.lookupValues(s, a, ax, d, df)
		if err != nil {
			return nil, err
		}
		sels = append(sels, dimSel{d.Dim, ax, idx, vals})
	}
	// The cartesian product runs in the array's dimension order, last
	// selected dimension fastest, as numpy's reshape of a[..., [i], [j]] would.
	sort.SliceStable(sels, func(x, y int) bool { return sels[x].axis < sels[y].axis })
	return sels, nil
}

// addChannels appends to v the channels of entry spec of array a (sample
// axis axis, -1 for a static one): one per combination of the selected
// indices. It returns a copy of the first, and the spatial shape and
// dimension names the channels have.
func (v *View) addChannels(a *zarr.Array, axis, spec int, sels []dimSel) (first *Channel, shape []int64, dims []string) {
	selected := map[int]bool{}
	for _, sl := range sels {
		selected[sl.axis] = true
	}
	for d := range a.Shape {
		if d != axis && !selected[d] {
			shape = append(shape, a.Shape[d])
			dims = append(dims, dimName(a, d))
		}
	}
	counter := make([]int, len(sels))
	for {
		ch := Channel{Var: a.Path, Array: a, Axis: axis, Spec: spec}
		for k, sl := range sels {
			ch.Select = append(ch.Select, Selected{Dim: sl.dim, Axis: sl.axis, Index: sl.indices[counter[k]], Value: sl.values[counter[k]]})
		}
		v.Channels = append(v.Channels, ch)
		if first == nil {
			c := ch // a copy: v.Channels may move as it grows
			first = &c
		}
		k := len(sels) - 1
		for ; k >= 0; k-- {
			counter[k]++
			if counter[k] < len(sels[k].indices) {
				break
			}
			counter[k] = 0
		}
		if k < 0 {
			return first, shape, dims
		}
	}
}

// sameSpatial refuses a channel entry (field, of array a) whose spatial
// shape or dimension names differ from the first channel's.
func sameSpatial(s *ViewSpec, field string, a *zarr.Array, shape []int64, dims []string, first *Channel, spatial []int64, spatialDims []string) error {
	if !slices.Equal(shape, spatial) {
		return s.errorf(field, "channel %s has spatial shape %s, but channels[0] (%s) has %s: all channels must have the same spatial shape%s",
			a.Path, npyShape(shape), first.Var, npyShape(spatial), selectHint(a.Path, dims, first.Var, spatialDims))
	}
	if !slices.Equal(dims, spatialDims) {
		return s.errorf(field, "channel %s has spatial dimensions (%s), but channels[0] (%s) has (%s): all channels must have the same dimension names",
			a.Path, strings.Join(dims, ", "), first.Var, strings.Join(spatialDims, ", "))
	}
	return nil
}

// outputDType sets v's DType: the spec's, which every channel must cast
// to, else the type every channel has (commonFrom's).
func (v *View) outputDType(s *ViewSpec, commonFrom *Channel) error {
	if s.DType == "" {
		v.DType = zarr.DType{Kind: commonFrom.Array.DType.Kind, Size: commonFrom.Array.DType.Size}
		return nil
	}
	d, err := ParseOutputDType(s.DType)
	if err != nil {
		return s.errorf("dtype", "%v", err)
	}
	v.DType = d
	for _, ch := range v.Channels {
		if err := zarr.CanCast(ch.Array.DType, d); err != nil {
			return s.errorf(fmt.Sprintf("channels[%d]", ch.Spec), "channel %s: %v", ch.Var, err)
		}
	}
	return nil
}

// staticMemo holds the bytes of a view's static channels (channel -> bytes
// in DType) as the listings of their arrays named them when filled, and
// the versions the fill's pin named (zarr.Pin.Sum, for a listing made
// lazily): a fill reading a static channel under another listing, or
// another version of its chunks, finds it stale.
type staticMemo struct {
	listings map[int]*zarr.Listing
	sums     map[int]uint64
	data     map[int][]byte
}

// Static returns the bytes of the view's static channels (channel index
// -> bytes in DType) that an earlier fill kept, if they were read under
// what a fill under pin reads them under (their arrays' listings and
// pinned versions); else nil, and keep, which keeps the bytes a fill
// under pin then reads, once per view, so later samples copy them instead
// of decoding them again. keep is nil where the view keeps nothing (no
// static channel, or more than it may hold). Safe for concurrent use.
func (v *View) Static(pin *zarr.Pin) (memo map[int][]byte, keep func(map[int][]byte)) {
	v.mu.Lock()
	memo = v.static.current(pin, v)
	v.mu.Unlock()
	if memo != nil || !v.memoStatic {
		return memo, nil
	}
	// The listings and versions the static channels are read under, taken
	// before the fill's Read: a memo made from them is stale once any is
	// replaced.
	listings, sums := v.staticKey(pin)
	return nil, func(data map[int][]byte) {
		v.mu.Lock()
		if v.static.current(pin, v) == nil {
			v.static = &staticMemo{listings: listings, sums: sums, data: data}
		}
		v.mu.Unlock()
	}
}

// staticKey is what a fill under pin reads the view's static channels
// under: each one's listing and pinned versions.
func (v *View) staticKey(pin *zarr.Pin) (map[int]*zarr.Listing, map[int]uint64) {
	listings, sums := map[int]*zarr.Listing{}, map[int]uint64{}
	for c := range v.Channels {
		ch := &v.Channels[c]
		if ch.Axis < 0 {
			start, count := ch.Region(0)
			listings[c] = pin.Listing(ch.Array)
			sums[c] = pin.Sum(ch.Array, start, count)
		}
	}
	return listings, sums
}

// current returns the memo's bytes if they were read under what a fill
// under pin reads the static channels under (staticKey).
func (m *staticMemo) current(pin *zarr.Pin, v *View) map[int][]byte {
	if m == nil {
		return nil
	}
	listings, sums := v.staticKey(pin)
	for c, l := range m.listings {
		if listings[c] != l || sums[c] != m.sums[c] {
			return nil
		}
	}
	return m.data
}

// checkCollision refuses a view name that an array or group of the store
// already uses at the top of the mount.
func checkCollision(h *zarr.Hierarchy, s *ViewSpec) error {
	for _, a := range h.Arrays {
		p := a.Path
		if p == "" {
			p = rootArrayName(storeID(h))
		}
		top, _, _ := strings.Cut(p, "/")
		if top == s.Name || p+".npy" == s.Name || p+".json" == s.Name {
			return s.errorf("name", "name collides with array %q in the mount", a.Path)
		}
	}
	for g := range h.Groups {
		top, _, _ := strings.Cut(g, "/")
		if g != "" && top == s.Name {
			return s.errorf("name", "name collides with group %q in the mount", g)
		}
	}
	return nil
}

// selectHint suggests a selection when one channel keeps a dimension the
// other lacks (a level dimension left unselected, most often).
func selectHint(v string, dims []string, v0 string, dims0 []string) string {
	for _, c := range []struct {
		v          string
		have, lack []string
	}{{v, dims, dims0}, {v0, dims0, dims}} {
		for _, d := range c.have {
			if d != "" && !slices.Contains(c.lack, d) {
				return fmt.Sprintf("; select along %s of %s, such as select: {%s: all} for one channel per index", d, c.v, d)
			}
		}
	}
	return ""
}

func storeID(h *zarr.Hierarchy) string {
	if h.Store == nil {
		return ""
	}
	return h.Store.ID()
}

func dimIndex(a *zarr.Array, name string) int {
	for i, d := range a.Dims {
		if d == name && name != "" {
			return i
		}
	}
	return -1
}

func dimName(a *zarr.Array, d int) string {
	if d < len(a.Dims) {
		return a.Dims[d]
	}
	return ""
}

func dimList(a *zarr.Array) string {
	names := make([]string, len(a.Shape))
	for d := range names {
		names[d] = dimName(a, d)
		if names[d] == "" {
			names[d] = "?"
		}
	}
	return strings.Join(names, ", ")
}

func (b *binder) selectAxis(s *ViewSpec, a *zarr.Array, dim, field, sampleDim string) (int, error) {
	if dim == sampleDim {
		return 0, s.errorf(field, "cannot select along the sample dimension %s; use samples", dim)
	}
	ax := dimIndex(a, dim)
	if ax < 0 {
		return 0, s.errorf(field, "array %s has no dimension %q (dimensions: %s)", a.Path, dim, dimList(a))
	}
	return ax, nil
}

// sampleRange checks the samples range against every channel that has the
// sample dimension.
func (b *binder) sampleRange(s *ViewSpec, v *View) error {
	var ref *Channel
	for i := range v.Channels {
		ch := &v.Channels[i]
		if ch.Axis < 0 {
			continue
		}
		if ref == nil {
			ref = ch
			continue
		}
		if s.Samples.Stop == nil && ch.Array.Shape[ch.Axis] != ref.Array.Shape[ref.Axis] {
			return s.errorf(fmt.Sprintf("channels[%d]", ch.Spec), "channel %s has %d entries along %s but channel %s has %d: set samples.stop",
				ch.Var, ch.Array.Shape[ch.Axis], v.SampleDim, ref.Var, ref.Array.Shape[ref.Axis])
		}
	}
	if ref == nil {
		return s.errorf("channels", "no channel has the sample dimension %q, so the view has no samples", v.SampleDim)
	}
	n := ref.Array.Shape[ref.Axis]
	v.Start, v.Step, v.Stop = s.Samples.Start, s.Samples.Step, n
	if s.Samples.Stop != nil {
		v.Stop = *s.Samples.Stop
		for _, ch := range v.Channels {
			if ch.Axis >= 0 && v.Stop > ch.Array.Shape[ch.Axis] {
				return s.errorf("samples.stop", "stop %d is past the end of %s: channel %s has %d entries", v.Stop, v.SampleDim, ch.Var, ch.Array.Shape[ch.Axis])
			}
		}
	}
	if v.Start >= v.Stop {
		return s.errorf("samples.start", "start %d is not below the end %d of %s: the range selects no samples", v.Start, v.Stop, v.SampleDim)
	}
	v.N = (v.Stop - v.Start + v.Step - 1) / v.Step
	return nil
}

// sampleCoords records the sample dimension's coordinate values.
func (b *binder) sampleCoords(v *View) error {
	for _, ch := range v.Channels {
		if ch.Axis < 0 {
			continue
		}
		c, _ := b.coordArray(ch.Array, ch.Axis, v.SampleDim)
		if c == nil {
			return nil
		}
		vals, err := b.coordBytes(c)
		if err != nil {
			return err
		}
		sz := int64(c.DType.Size)
		v.SampleCoords = make([]any, 0, v.N)
		for k := int64(0); k < v.N; k++ {
			t := v.Start + k*v.Step
			v.SampleCoords = append(v.SampleCoords, jsonValue(vals[t*sz:(t+1)*sz], c.DType))
		}
		v.SampleCoordsAttributes = c.Attributes
		return nil
	}
	return nil
}

// definition is the canonical text of what determines the bytes of the
// view's samples; it goes into every sample's Inputs. An open-ended view
// (no samples.stop) leaves out its stop and its arrays' length along the
// sample dimension, so that the samples it had keep their identity when
// the store grows.
func (v *View) definition() string {
	var b strings.Builder
	stop := "open"
	if v.Spec != nil && v.Spec.Samples.Stop != nil {
		stop = strconv.FormatInt(v.Stop, 10)
	}
	fmt.Fprintf(&b, "view-2\x00%s\x00%s\x00%d:%s:%d\x00%s\x00", v.Name, v.SampleDim, v.Start, stop, v.Step, v.DType.NumpyLE())
	for _, ch := range v.Channels {
		fmt.Fprintf(&b, "ch\x00%s\x00%s\x00%d", ch.Var, ch.Array.DataHash(ch.Axis), ch.Axis)
		for _, s := range ch.Select {
			fmt.Fprintf(&b, "\x00%d=%d", s.Axis, s.Index)
		}
		b.WriteByte(0)
	}
	return b.String()
}

// Definition returns the canonical text of everything that determines the
// bytes of the view's samples, besides the contents of the chunks read.
func (v *View) Definition() string { return v.def }

// WorkingSetBytes is the decoded size of the distinct source chunks one
// sample touches. Consecutive samples decode each chunk once only when the
// zarr decoded-chunk cache holds at least this much (or with
// fill.Filler.FillInto).
func (v *View) WorkingSetBytes() int64 {
	seen := map[string]bool{}
	var n int64
	for _, ch := range v.Channels {
		start, count := ch.Region(v.Start)
		key := ch.Var
		size := int64(ch.Array.DType.Size)
		for d := range start {
			c := ch.Array.Chunks[d]
			if c <= 0 {
				continue
			}
			key += fmt.Sprintf("/%d", start[d]/c)
			if count[d] > 1 { // a spatial dimension: all of its chunks
				size *= ch.Array.Shape[d]
			} else {
				size *= c
			}
		}
		if !seen[key] {
			seen[key] = true
			n += size
		}
	}
	return n
}

// ViewSidecar is the JSON document at MOUNT/NAME.json (docs/design.md §4).
type ViewSidecar struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Shape is (samples, C, *spatial).
	Shape []int64 `json:"shape"`
	DType string  `json:"dtype"`
	// Dims names the dimensions of Shape: the sample dimension, "channel",
	// then the spatial ones (as an array sidecar's dims match its shape).
	Dims        []*string      `json:"dims"`
	SampleDim   string         `json:"sample_dim"`
	SampleShape []int64        `json:"sample_shape"`
	Files       int64          `json:"files"`
	DataOffset  int64          `json:"data_offset"`
	FillValue   any            `json:"fill_value"`
	Attributes  map[string]any `json:"attributes"`
	// Samples is the range of source indices along SampleDim.
	Samples  ViewSamples   `json:"samples"`
	Channels []ViewChannel `json:"channels"`
	// SampleCoords holds the sample coordinate of every file, when the
	// store has a 1-D coordinate array for SampleDim.
	SampleCoords           []any          `json:"sample_coords,omitempty"`
	SampleCoordsAttributes map[string]any `json:"sample_coords_attributes,omitempty"`
	// Shard is set when the mount lists only one rank's samples.
	Shard *SidecarShard `json:"shard,omitempty"`
}

// ViewSamples is the samples range in a sidecar.
type ViewSamples struct {
	Start int64 `json:"start"`
	Stop  int64 `json:"stop"`
	Step  int64 `json:"step"`
}

// ViewChannel describes one channel in a sidecar.
type ViewChannel struct {
	Var string `json:"var"`
	// Static is true for a channel without the sample dimension, repeated
	// in every sample.
	Static bool `json:"static"`
	// DType is the source array's type.
	DType  string                   `json:"source_dtype"`
	Select map[string]SelectedIndex `json:"select"`
}

// SelectedIndex is a selected dimension's index and coordinate value (nil
// when there is no coordinate array).
type SelectedIndex struct {
	Index int64 `json:"index"`
	Value any   `json:"value"`
}

func (v *View) sidecar(o Options, files int64, pick *Progression) ([]byte, error) {
	s := ViewSidecar{
		Kind:        "view",
		Name:        v.Name,
		Shape:       append([]int64{v.N}, v.SampleShape...),
		DType:       v.DType.NumpyLE(),
		SampleDim:   v.SampleDim,
		SampleShape: v.SampleShape,
		Files:       files,
		Shard:       o.sidecarShard(pick),
		DataOffset:  o.Align,
		Attributes:  map[string]any{},
		Samples:     ViewSamples{v.Start, v.Stop, v.Step},
		// A view mixes arrays with different fill values and casts them, so
		// no single fill value describes it.
		FillValue:              nil,
		SampleCoords:           v.SampleCoords,
		SampleCoordsAttributes: v.SampleCoordsAttributes,
	}
	s.Dims = []*string{&s.SampleDim}
	for _, d := range v.SampleDims {
		if d == "" {
			s.Dims = append(s.Dims, nil)
		} else {
			s.Dims = append(s.Dims, &d)
		}
	}
	for _, ch := range v.Channels {
		vc := ViewChannel{Var: ch.Var, Static: ch.Axis < 0, DType: ch.Array.DType.NumpySource(), Select: map[string]SelectedIndex{}}
		for _, sel := range ch.Select {
			vc.Select[sel.Dim] = SelectedIndex{Index: sel.Index, Value: sel.Value}
		}
		s.Channels = append(s.Channels, vc)
	}
	return sidecarJSON(s)
}

// addView adds a bound view's sample directory and sidecar to the tree.
func (l *Layout) addView(b *treeBuilder, h *zarr.Hierarchy, v *View) (int64, error) {
	if v.h != h {
		return 0, v.Spec.errorf("", "bound to another store than the one being laid out")
	}
	hdr, err := NPYHeader(v.DType.NumpyLE(), v.SampleShape, l.opts.Align)
	if err != nil {
		return 0, fmt.Errorf("view %q: %w", v.Name, err)
	}
	vs := &viewSet{v: v, opts: l.opts, header: hdr, width: sampleWidth(v.N),
		size: l.opts.Align + prod(v.SampleShape)*int64(v.DType.Size)}
	d := &Dir{path: v.Name, samples: vs, pick: l.opts.pick(v.N)}
	side, err := v.sidecar(l.opts, int64(d.Len()), d.pick)
	if err != nil {
		return 0, fmt.Errorf("view %q: %w", v.Name, err)
	}
	if err := b.add(v.Name, Entry{Kind: KindDir, Dir: d}); err != nil {
		return 0, v.Spec.errorf("name", "name collides with another entry at the top of the mount")
	}
	if err := b.add(v.Name+".json", Entry{Kind: KindSidecar, Data: side}); err != nil {
		return 0, v.Spec.errorf("name", "%s.json collides with another entry at the top of the mount", v.Name)
	}
	return int64(d.Len()) + 1, nil
}
