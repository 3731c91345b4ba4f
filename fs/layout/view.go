package layout

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/zarrfs/zarrfs/zarr"
)

// A view (CONTRACT section 5) stacks channels taken from several arrays into
// one (C, *spatial) sample per index along the sample dimension. A ViewSpec
// (view_spec.go) is what the file says; Bind checks it against an opened
// hierarchy and resolves every channel to an array and indices, giving a
// View; Build then adds MOUNT/NAME/K.npy and MOUNT/NAME.json.
//
// Filling one sample issues one Read for all its channels, so a source chunk
// that holds several of them (levels 0 and 2 of t) is decoded once. Samples
// filled one after another reuse the chunks they share through the zarr
// decoded-chunk cache; FillBatch reads a run of samples in one Read, which
// decodes each shared chunk once without relying on that cache.

// BindOptions configure Bind. The zero value is valid.
type BindOptions struct {
	// SampleDim is the mount's sample dimension, used by views that name
	// none. Empty means "time".
	SampleDim string
	// Reader reads coordinate arrays. Nil means the hierarchy.
	Reader Reader
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

// region returns the source region of the channel for sample index t.
func (c *Channel) region(t int64) (start, count []int64) {
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

func (b *binder) reader() Reader {
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
		v.SampleDim = b.o.SampleDim
	}
	if v.SampleDim == "" {
		v.SampleDim = DefaultSampleDim
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
		axis := dimIndex(a, v.SampleDim)
		// Resolve selections to (axis, indices) in file order first.
		type dimSel struct {
			dim     string
			axis    int
			indices []int64
			values  []any
		}
		var sels []dimSel
		for _, d := range cs.Select {
			df := field + ".select." + d.Dim
			ax, err := b.selectAxis(s, a, d.Dim, df, v.SampleDim)
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
			ax, err := b.selectAxis(s, a, d.Dim, df, v.SampleDim)
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
		selected := map[int]bool{}
		for _, sl := range sels {
			selected[sl.axis] = true
		}
		var shape []int64
		var dims []string
		for d := range a.Shape {
			if d != axis && !selected[d] {
				shape = append(shape, a.Shape[d])
				dims = append(dims, dimName(a, d))
			}
		}
		counter := make([]int, len(sels))
		var first *Channel // a copy: v.Channels may move as it grows
		for {
			ch := Channel{Var: a.Path, Array: a, Axis: axis, Spec: i}
			for k, sl := range sels {
				ch.Select = append(ch.Select, Selected{Dim: sl.dim, Axis: sl.axis, Index: sl.indices[counter[k]], Value: sl.values[counter[k]]})
			}
			v.Channels = append(v.Channels, ch)
			if first == nil {
				c := ch
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
				break
			}
		}
		if firstSpatial == nil {
			firstSpatial, spatial, spatialDims = first, shape, dims
		} else {
			if !slices.Equal(shape, spatial) {
				return nil, s.errorf(field, "channel %s has spatial shape %s, but channels[0] (%s) has %s: all channels must have the same spatial shape%s",
					a.Path, npyShape(shape), firstSpatial.Var, npyShape(spatial), selectHint(a.Path, dims, firstSpatial.Var, spatialDims))
			}
			if !slices.Equal(dims, spatialDims) {
				return nil, s.errorf(field, "channel %s has spatial dimensions (%s), but channels[0] (%s) has (%s): all channels must have the same dimension names",
					a.Path, strings.Join(dims, ", "), firstSpatial.Var, strings.Join(spatialDims, ", "))
			}
		}
		if s.DType == "" {
			if commonFrom == nil {
				commonFrom = first
			} else if !sameType(commonFrom.Array.DType, a.DType) {
				return nil, s.errorf(field, "channel %s is %s but channel %s (channels[%d]) is %s: set dtype to choose the output type",
					a.Path, a.DType.Name(), commonFrom.Var, commonFrom.Spec, commonFrom.Array.DType.Name())
			}
		}
	}
	if s.DType != "" {
		d, err := ParseOutputDType(s.DType)
		if err != nil {
			return nil, s.errorf("dtype", "%v", err)
		}
		v.DType = d
		for _, ch := range v.Channels {
			if err := canCast(ch.Array.DType, d); err != nil {
				return nil, s.errorf(fmt.Sprintf("channels[%d]", ch.Spec), "channel %s: %v", ch.Var, err)
			}
		}
	} else {
		v.DType = zarr.DType{Kind: commonFrom.Array.DType.Kind, Size: commonFrom.Array.DType.Size}
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

// staticMemo holds the bytes of a view's static channels (channel -> bytes
// in DType) as the listings of their arrays named them when filled: a
// listing of any of them that is not the one the memo was made with makes
// it stale.
type staticMemo struct {
	listings map[int]*zarr.Listing
	data     map[int][]byte
}

// current returns the memo's bytes if no static channel's array was listed
// again since it was made.
func (m *staticMemo) current(v *View) map[int][]byte {
	if m == nil {
		return nil
	}
	for c, l := range m.listings {
		if v.Channels[c].Array.Listing() != l {
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

// coordArray finds the 1-D coordinate array for dimension dim of a: an array
// named dim in a's group, else in the groups above it, whose length matches.
func (b *binder) coordArray(a *zarr.Array, ax int, dim string) (*zarr.Array, *zarr.Array) {
	var wrongLen *zarr.Array
	dir := path.Dir(a.Path)
	for {
		p := dim
		if dir != "." && dir != "/" && dir != "" {
			p = dir + "/" + dim
		}
		if c := b.h.Array(p); c != nil && c.Unsupported == "" && len(c.Shape) == 1 && c != a {
			if c.Shape[0] == a.Shape[ax] {
				return c, nil
			}
			if wrongLen == nil {
				wrongLen = c
			}
		}
		if dir == "." || dir == "/" || dir == "" {
			return nil, wrongLen
		}
		dir = path.Dir(dir)
	}
}

// coordBytes reads (once per binder) the whole of a coordinate array.
func (b *binder) coordBytes(c *zarr.Array) ([]byte, error) {
	if v, ok := b.coords[c.Path]; ok {
		return v, nil
	}
	n := satMul(c.Shape[0], int64(c.DType.Size))
	if n > maxCoordBytes {
		return nil, fmt.Errorf("coordinate array %q: %d bytes, more than the %d a view reads", c.Path, n, int64(maxCoordBytes))
	}
	buf := make([]byte, n)
	err := b.reader().Read(b.ctx, []zarr.Request{{Array: c, Start: []int64{0}, Count: []int64{c.Shape[0]}, Dst: buf}})
	if err != nil {
		return nil, fmt.Errorf("coordinate array %q: %w", c.Path, err)
	}
	b.coords[c.Path] = buf
	return buf, nil
}

// coordValuesAt returns the coordinate values at indices (nil entries when
// there is no coordinate array).
func (b *binder) coordValuesAt(a *zarr.Array, ax int, dim string, indices []int64) ([]any, error) {
	out := make([]any, len(indices))
	c, _ := b.coordArray(a, ax, dim)
	if c == nil {
		return out, nil
	}
	vals, err := b.coordBytes(c)
	if err != nil {
		return nil, err
	}
	sz := int64(c.DType.Size)
	for i, x := range indices {
		out[i] = jsonValue(vals[x*sz:(x+1)*sz], c.DType)
	}
	return out, nil
}

// lookupValues finds the index of each wanted coordinate value.
func (b *binder) lookupValues(s *ViewSpec, a *zarr.Array, ax int, d DimValues, field string) ([]int64, []any, error) {
	c, wrong := b.coordArray(a, ax, d.Dim)
	if c == nil {
		if wrong != nil {
			return nil, nil, s.errorf(field, "coordinate array %q has %d values but dimension %s of %s has %d", wrong.Path, wrong.Shape[0], d.Dim, a.Path, a.Shape[ax])
		}
		return nil, nil, s.errorf(field, "no 1-D coordinate array %q for dimension %s of %s: use select by index", d.Dim, d.Dim, a.Path)
	}
	vals, err := b.coordBytes(c)
	if err != nil {
		return nil, nil, err
	}
	sz := int64(c.DType.Size)
	n := c.Shape[0]
	var idx []int64
	var out []any
	for j, want := range d.Values {
		found := int64(-1)
		for i := int64(0); i < n; i++ {
			if coordEqual(vals[i*sz:(i+1)*sz], c.DType, want) {
				found = i
				break
			}
		}
		if found < 0 {
			var have []string
			for i := int64(0); i < n && i < 12; i++ {
				have = append(have, fmt.Sprint(jsonValue(vals[i*sz:(i+1)*sz], c.DType)))
			}
			if n > 12 {
				have = append(have, "...")
			}
			return nil, nil, s.errorf(fmt.Sprintf("%s[%d]", field, j), "value %s not found in coordinate array %q (%s)", want.Text, c.Path, strings.Join(have, ", "))
		}
		idx = append(idx, found)
		out = append(out, jsonValue(vals[found*sz:(found+1)*sz], c.DType))
	}
	return idx, out, nil
}

// coordEqual compares a stored coordinate with a value from the file after
// casting the value to the coordinate's type, so 0.1 finds float32(0.1).
func coordEqual(b []byte, dt zarr.DType, v CoordValue) bool {
	switch dt.Kind {
	case 'f':
		x := readFloat(b, dt)
		switch dt.Size {
		case 2:
			return halfToFloat64(float64BitsToHalf(math.Float64bits(v.Float))) == x
		case 4:
			if v.IsInt {
				return float64(float32(v.Int)) == x
			}
			return float64(float32(v.Float)) == x
		}
		if v.IsInt {
			return float64(v.Int) == x
		}
		return v.Float == x
	case 'b':
		return (v.Float == 1 && b[0] != 0) || (v.Float == 0 && b[0] == 0)
	case 'u':
		x := readUint(b, dt.Size)
		if v.IsInt {
			return v.Int >= 0 && uint64(v.Int) == x
		}
		return v.Float == math.Trunc(v.Float) && v.Float == float64(x)
	}
	x := readInt(b, dt.Size)
	if v.IsInt {
		return v.Int == x
	}
	return v.Float == math.Trunc(v.Float) && v.Float == float64(x)
}

func readUint(b []byte, size int) uint64 {
	var u uint64
	for i := size - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	return u
}

func readInt(b []byte, size int) int64 {
	u := readUint(b, size)
	shift := uint(64 - 8*size)
	return int64(u<<shift) >> shift
}

func readFloat(b []byte, dt zarr.DType) float64 {
	switch dt.Size {
	case 2:
		return halfToFloat64(uint16(readUint(b, 2)))
	case 4:
		return float64(math.Float32frombits(uint32(readUint(b, 4))))
	}
	return math.Float64frombits(readUint(b, 8))
}

// jsonValue renders one little-endian value for a sidecar: integers exactly,
// floats in their shortest form for their precision, NaN and infinities as
// the strings Zarr uses for them.
func jsonValue(b []byte, dt zarr.DType) any {
	switch dt.Kind {
	case 'b':
		return b[0] != 0
	case 'u':
		return readUint(b, dt.Size)
	case 'i':
		return readInt(b, dt.Size)
	}
	f := readFloat(b, dt)
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	bitSize := 64
	if dt.Size < 8 {
		bitSize = 32
	}
	return json.Number(strconv.FormatFloat(f, 'g', -1, bitSize))
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
// zarr decoded-chunk cache holds at least this much (or with FillBatch).
func (v *View) WorkingSetBytes() int64 {
	seen := map[string]bool{}
	var n int64
	for _, ch := range v.Channels {
		start, count := ch.region(v.Start)
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

// ViewSidecar is the JSON document at MOUNT/NAME.json (CONTRACT section 6).
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
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
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

// viewSet is the sample files of a view, made on demand like an array's.
type viewSet struct {
	v      *View
	opts   Options
	header []byte
	width  int
	size   int64
}

func (s *viewSet) len() int64 { return s.v.N }

func (s *viewSet) index(name string) (int64, bool) { return parseSampleName(name, s.width, s.v.N) }

func (s *viewSet) entry(k int64) Entry {
	name := sampleFileName(k, s.width)
	return Entry{Name: name, Kind: KindBlob, Blob: &viewBlob{
		v: s.v, opts: s.opts, k: k, path: s.v.Name + "/" + name, header: s.header, size: s.size,
	}}
}

// viewBlob is sample K of a view.
type viewBlob struct {
	v      *View
	opts   Options
	k      int64
	path   string
	header []byte
	size   int64
}

var _ Blob = (*viewBlob)(nil)

func (b *viewBlob) Path() string   { return b.path }
func (b *viewBlob) Size() int64    { return b.size }
func (b *viewBlob) Header() []byte { return b.header }

// Inputs is the view's definition, Align and the sample's index.
func (b *viewBlob) Inputs() string {
	return fmt.Sprintf("view\x00%s\x00align=%d\x00k=%d", b.v.def, b.opts.Align, b.k)
}

// Sources lists one region per channel, static channels included.
func (b *viewBlob) Sources() []zarr.Request {
	t := b.v.Start + b.k*b.v.Step
	out := make([]zarr.Request, len(b.v.Channels))
	for i := range b.v.Channels {
		ch := &b.v.Channels[i]
		start, count := ch.region(t)
		out[i] = zarr.Request{Array: ch.Array, Start: start, Count: count}
	}
	return out
}

// Fill reads every channel of the sample in one Read, so each source chunk
// is decoded once however many channels come from it, casts, and writes the
// header and the (C, *spatial) data. It holds the whole sample in memory.
func (b *viewBlob) Fill(ctx context.Context, w io.WriterAt) error {
	release, err := b.opts.acquire(ctx, b.v.fillCost(b.size-b.opts.Align, []int64{b.k}), "sample of view "+b.v.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", b.path, err)
	}
	defer release()
	out := b.opts.slab(b.size - b.opts.Align)
	defer b.opts.freeSlab(out)
	if err := b.v.fillSamples(ctx, b.opts.Reader, []int64{b.k}, [][]byte{out}); err != nil {
		return fmt.Errorf("%s: %w", b.path, err)
	}
	return writeBlob(w, b.path, b.header, out, b.opts.Align)
}

func writeBlob(w io.WriterAt, p string, header, data []byte, align int64) error {
	if _, err := w.WriteAt(header, 0); err != nil {
		return fmt.Errorf("%s: write header: %w", p, err)
	}
	if _, err := w.WriteAt(data, align); err != nil {
		return fmt.Errorf("%s: write: %w", p, err)
	}
	return nil
}

// fillCost bounds the memory that filling samples ks (data bytes each) in
// one fillSamples holds: the samples, the cast scratch, and what the Read
// of every channel's region holds (chunks shared by the samples counted
// once per sample at most).
func (v *View) fillCost(data int64, ks []int64) int64 {
	n := int64(len(ks))
	cost := satMul(data, n)
	spatial := prod(v.SampleShape[1:])
	lo, hi := ks[0], ks[0]
	for _, k := range ks {
		lo, hi = min(lo, k), max(hi, k)
	}
	// Channels that read the same chunks (levels of one array in one
	// chunk) cost them once, as the one Read decodes them once.
	seen := map[string]bool{}
	for i := range v.Channels {
		ch := &v.Channels[i]
		if !sameType(ch.Array.DType, v.DType) {
			cost = satAdd(cost, satMul(satMul(spatial, int64(ch.Array.DType.Size)), n))
		}
		start, count := ch.region(v.Start + lo*v.Step)
		if ch.Axis >= 0 {
			count[ch.Axis] = (hi-lo)*v.Step + 1
		}
		key := ch.Array.Path
		for d := range start {
			if c := ch.Array.Chunks[d]; c > 0 {
				key += fmt.Sprintf("/%d-%d", start[d]/c, (start[d]+count[d]-1)/c)
			}
		}
		if !seen[key] {
			seen[key] = true
			cost = satAdd(cost, ch.Array.ReadCost(start, count))
		}
	}
	return cost
}

// fillSamples fills outs[i] with sample ks[i] (each len prod(SampleShape) *
// DType.Size) through one Read. A static channel is read at most once.
func (v *View) fillSamples(ctx context.Context, r Reader, ks []int64, outs [][]byte) error {
	per := prod(v.SampleShape[1:]) * int64(v.DType.Size)
	v.mu.Lock()
	memo := v.static.current(v)
	v.mu.Unlock()
	// The listings the static channels are read under, taken before the
	// Read: a memo made from them is stale once any is replaced.
	var listings map[int]*zarr.Listing
	if v.memoStatic && memo == nil {
		listings = map[int]*zarr.Listing{}
		for c, ch := range v.Channels {
			if ch.Axis < 0 {
				listings[c] = ch.Array.Listing()
			}
		}
	}
	// Scratch for channels that need a cast.
	var scratchLen int64
	for _, ch := range v.Channels {
		if !sameType(ch.Array.DType, v.DType) {
			scratchLen += prod(v.SampleShape[1:]) * int64(ch.Array.DType.Size) * int64(len(ks))
		}
	}
	var scratch []byte
	if scratchLen > 0 {
		scratch = getSlab(scratchLen)
		defer putSlab(scratch)
	}
	type castJob struct {
		dst, src []byte
		from     zarr.DType
	}
	type copyJob struct{ dst, src []byte }
	var reqs []zarr.Request
	var casts []castJob
	var copies []copyJob
	var off int64
	for si, k := range ks {
		t := v.Start + k*v.Step
		for c := range v.Channels {
			ch := &v.Channels[c]
			dst := outs[si][int64(c)*per : int64(c+1)*per]
			if ch.Axis < 0 {
				if m, ok := memo[c]; ok {
					copies = append(copies, copyJob{dst, m})
					continue
				}
				if si > 0 {
					copies = append(copies, copyJob{dst, outs[0][int64(c)*per : int64(c+1)*per]})
					continue
				}
			}
			start, count := ch.region(t)
			q := zarr.Request{Array: ch.Array, Start: start, Count: count, Dst: dst}
			if !sameType(ch.Array.DType, v.DType) {
				n := prod(count) * int64(ch.Array.DType.Size)
				q.Dst = scratch[off : off+n]
				off += n
				casts = append(casts, castJob{dst, q.Dst, ch.Array.DType})
			}
			reqs = append(reqs, q)
		}
	}
	if len(reqs) > 0 {
		if err := r.Read(ctx, reqs); err != nil {
			return err
		}
	}
	for _, j := range casts {
		castInto(j.dst, v.DType, j.src, j.from)
	}
	for _, j := range copies {
		copy(j.dst, j.src)
	}
	if v.memoStatic && memo == nil {
		m := map[int][]byte{}
		for c, ch := range v.Channels {
			if ch.Axis < 0 {
				m[c] = append([]byte(nil), outs[0][int64(c)*per:int64(c+1)*per]...)
			}
		}
		v.mu.Lock()
		if v.static.current(v) == nil {
			v.static = &staticMemo{listings: listings, data: m}
		}
		v.mu.Unlock()
	}
	return nil
}

// DefaultBatchBytes bounds the sample data FillBatch holds at once when
// given no bound.
const DefaultBatchBytes = 1 << 30

// FillBatch fills blobs[i] into ws[i], as Fill would. Runs of consecutive
// samples of one view are read together, one Read per run of at most
// maxBytes of sample data (zero means DefaultBatchBytes), so every source
// chunk the run shares (a chunk of 10 time steps) is decoded once even when
// the decoded-chunk cache cannot hold it between fills. Other blobs are
// filled one by one. It stops at the first error.
func FillBatch(ctx context.Context, blobs []Blob, ws []io.WriterAt, maxBytes int64) error {
	if len(blobs) != len(ws) {
		return fmt.Errorf("layout: FillBatch with %d blobs and %d writers", len(blobs), len(ws))
	}
	if maxBytes <= 0 {
		maxBytes = DefaultBatchBytes
	}
	for i := 0; i < len(blobs); {
		vb, ok := blobs[i].(*viewBlob)
		if !ok {
			if err := blobs[i].Fill(ctx, ws[i]); err != nil {
				return err
			}
			i++
			continue
		}
		data := vb.size - vb.opts.Align
		ks := []int64{vb.k}
		j := i + 1
		for j < len(blobs) && int64(j-i+1)*data <= maxBytes {
			nb, ok := blobs[j].(*viewBlob)
			if !ok || nb.v != vb.v || nb.opts.Reader != vb.opts.Reader || nb.opts.Align != vb.opts.Align {
				break
			}
			if !vb.opts.MemoryBudget.Fits(2 * vb.v.fillCost(data, append(ks, nb.k))) {
				break // a run takes half the memory budget at most
			}
			ks = append(ks, nb.k)
			j++
		}
		if err := fillViewRun(ctx, blobs[i:j], ws[i:j], data); err != nil {
			return err
		}
		i = j
	}
	return nil
}

func fillViewRun(ctx context.Context, blobs []Blob, ws []io.WriterAt, data int64) error {
	first := blobs[0].(*viewBlob)
	opts := first.opts
	ks := make([]int64, len(blobs))
	for i, b := range blobs {
		ks[i] = b.(*viewBlob).k
	}
	release, err := opts.acquire(ctx, first.v.fillCost(data, ks), "samples of view "+first.v.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", first.path, err)
	}
	defer release()
	buf := opts.slab(data * int64(len(blobs)))
	defer opts.freeSlab(buf)
	outs := make([][]byte, len(blobs))
	for i := range blobs {
		outs[i] = buf[int64(i)*data : int64(i+1)*data]
	}
	if err := first.v.fillSamples(ctx, first.opts.Reader, ks, outs); err != nil {
		return fmt.Errorf("%s..%s: %w", first.path, blobs[len(blobs)-1].Path(), err)
	}
	for i, b := range blobs {
		vb := b.(*viewBlob)
		if err := writeBlob(ws[i], vb.path, vb.header, outs[i], vb.opts.Align); err != nil {
			return err
		}
	}
	return nil
}
