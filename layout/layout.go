// Package layout computes the virtual tree a zarrfs mount presents: which
// directories and files exist, their exact sizes, the NPY header of every
// blob, the sidecar JSON of every array, and for each blob the source regions
// it is made from and its identity. It is data: it knows nothing of FUSE or
// of the cache, and making a blob's bytes is package fill's, so the mount,
// `zarrfs warm`, `zarrfs inspect` and tests share it.
//
// A Layout is built once from an opened zarr.Hierarchy and is immutable
// afterwards: every method is safe for concurrent use. Nothing here decodes
// data (but the coordinates a view binds by value); names, sizes and
// headers come from metadata alone, so listing a directory of 100,000
// samples costs no I/O.
//
// # Identity
//
// The layout's ID (the cache directory of its blobs) depends only on the
// source, --align and --sample-dim, and a blob's path only on its place in
// the tree, so both stay put while a store grows. What a blob's bytes are
// built from is its Identity (Layout.Identity), which the cache records
// with the blob and compares on every open: Blob.Inputs (the array's
// metadata less the sample dimension's length and its attributes, or the
// view's definition; the region; --align) and the version of every chunk
// the blob reads, from a listing of its array (zarr.Hierarchy.List: S3
// ETags, POSIX size, mtime, inode and ctime). Appending along the sample
// dimension therefore keeps the identity of every sample whose chunks the
// append did not rewrite, while a chunk rewritten in place changes the
// identity of the samples it holds once the array is listed again. Checking
// a warm blob costs no request within a listing: the listing is made once
// per array and Hierarchy (a mount makes a new one every --metadata-ttl),
// lazily where the store asks one version cheaper than it lists, and fills
// verify the versions they read against it (the zarr.Pin Layout.Pinned
// gives), or teach it the versions of a blob filled before its identity is
// asked (package fill).
package layout

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// Defaults for Options.
const (
	DefaultAlign = 4096
)

// layoutVersion changes whenever the bytes a blob holds for the same inputs
// change (header format, assembly), so old cache entries are never served.
const layoutVersion = "zarrfs-layout-2"

// ErrInvalidOption is returned (wrapped) for an Options value Build refuses.
var ErrInvalidOption = errors.New("invalid layout option")

// Options configure Build. The zero value means the defaults.
type Options struct {
	// SampleDim names the dimension whose indices become one file each, or
	// lists names (comma-separated) of which the first that an array has
	// is taken (ChooseSampleDim). Empty means DefaultSampleDims, as the
	// command line's --sample-dim.
	SampleDim string
	// Align is the offset where data starts in every blob: a multiple of
	// 64 from MinAlign to MaxAlign. Zero means 4096.
	Align int64

	// Views are the stacked views (docs/design.md §5) to add, bound to the
	// same hierarchy with Bind or BindViews. Each adds MOUNT/NAME/ and
	// MOUNT/NAME.json, and its definition goes into the layout ID. Nil
	// means none.
	Views []*View

	// Shard makes every sample directory (arrays and views) list only the
	// samples one rank reads, under their global names, and the sidecars
	// say which (docs/design.md §6). Blob paths and the layout ID do not
	// change, so every rank shares one cache and what `zarrfs warm --rank`
	// filled. The zero value lists every sample.
	Shard Shard
}

// pick is the share of n samples a sample directory lists, nil for all.
func (o Options) pick(n int64) *Progression {
	if !o.Shard.active() {
		return nil
	}
	p := o.Shard.Of(0, n)
	return &p
}

func (o Options) withDefaults() (Options, error) {
	if o.SampleDim == "" {
		o.SampleDim = DefaultSampleDims
	}
	if o.Align == 0 {
		o.Align = DefaultAlign
	}
	if o.Align < MinAlign || o.Align%64 != 0 {
		return o, fmt.Errorf("%w: align %d is not a multiple of 64 of at least %d (no npy header fits in less)", ErrInvalidOption, o.Align, MinAlign)
	}
	if o.Align > MaxAlign {
		return o, fmt.Errorf("%w: align %d exceeds %d, the largest whose npy header numpy.load accepts", ErrInvalidOption, o.Align, MaxAlign)
	}
	if o.Shard.World < 0 || o.Shard.Rank < 0 || (o.Shard.World > 0 && o.Shard.Rank >= o.Shard.World) || (o.Shard.World == 0 && o.Shard.Rank != 0) {
		return o, fmt.Errorf("%w: rank %d of world %d: want 0 <= rank < world", ErrInvalidOption, o.Shard.Rank, o.Shard.World)
	}
	return o, nil
}

// Skipped is an array left out of the layout and why.
type Skipped struct {
	Path   string
	Reason string
}

// Layout is the immutable tree of one mount.
type Layout struct {
	// ID names the cache directory of the layout's blobs: a hex hash of the
	// source's identity, Align and SampleDim. It depends on nothing the
	// source's data or metadata may change, so a blob keeps its path (the
	// target of its link in direct mode) while the store grows; what a
	// blob's bytes depend on is its Identity.
	ID string
	// SourceID is the store's ID ("file:///data/era5.zarr").
	SourceID string
	// Arrays counts the arrays present in the tree.
	Arrays int
	// Files counts the regular files (blobs and sidecars).
	Files int64
	// Skipped lists the arrays left out (unsupported, or a name collision).
	// The caller logs one warning each.
	Skipped []Skipped

	opts Options
	root *Dir
	h    *zarr.Hierarchy
}

// Root returns the top directory.
func (l *Layout) Root() *Dir { return l.root }

// Align returns the data offset of every blob.
func (l *Layout) Align() int64 { return l.opts.Align }

// Views returns the views the layout serves (Options.Views).
func (l *Layout) Views() []*View { return l.opts.Views }

// SampleDim returns the sample dimension name in use.
func (l *Layout) SampleDim() string { return l.opts.SampleDim }

// Kind tells what an Entry is.
type Kind uint8

const (
	KindDir     Kind = iota + 1 // a directory: Entry.Dir
	KindBlob                    // an .npy file: Entry.Blob
	KindSidecar                 // a JSON description held in memory: Entry.Data
)

// Entry is one name in a directory.
type Entry struct {
	Name string
	Kind Kind
	Dir  *Dir
	Blob Blob
	Data []byte
}

// Size returns the file size (0 for a directory).
func (e Entry) Size() int64 {
	switch e.Kind {
	case KindBlob:
		return e.Blob.Size()
	case KindSidecar:
		return int64(len(e.Data))
	}
	return 0
}

// Blob is one .npy file whose bytes are computed from the source: a
// *RegionBlob (a sample of an array, or a whole array) or a *ViewBlob (a
// sample of a view, docs/design.md §5: channels stacked from several arrays
// with selections and a dtype cast). It says what the file is made from;
// package fill makes its bytes. The FUSE layer and the cache see only this
// interface.
type Blob interface {
	// Path is the file's path in the mount ("t/07.npy"); it is also the
	// cache key within the layout.
	Path() string
	// Size is the exact file size: Align + prod(shape) * itemsize.
	Size() int64
	// Header returns the NPY header, Align bytes long. The caller must not
	// modify it.
	Header() []byte
	// Sources lists the source regions the blob needs (Request templates:
	// Dst is nil), for readahead, warm planning and messages.
	Sources() []zarr.Request
	// Inputs is the canonical text of what the bytes depend on besides the
	// contents of the source chunks they are read from: the array's
	// metadata less the sample dimension's length (zarr.Array.DataHash) or
	// the view's definition, the region, Align. Layout.Identity adds the
	// chunks' identities.
	Inputs() string
}

// Dir is a directory of the tree. A sample directory computes its entries
// from the index, so 100,000 samples cost no memory per file.
type Dir struct {
	path    string
	entries []Entry // sorted by Name; nil for a sample directory
	byName  map[string]int
	// samples computes the entries of a sample directory (an array's or a
	// view's) on demand; nil for a group directory.
	samples samples
	// pick, in a sample directory of a sharded layout, is the samples this
	// rank lists (Options.Shard); nil lists them all.
	pick *Progression
	// hidden are entries found by name but not listed: a group's
	// attributes (GroupAttrsName).
	hidden map[string]Entry
}

// Path returns the directory's path in the mount ("" for the root).
func (d *Dir) Path() string { return d.path }

// Len returns the number of entries.
func (d *Dir) Len() int {
	if d.pick != nil {
		return int(d.pick.Count)
	}
	return int(d.allLen())
}

// Entry returns the i-th entry in name order, 0 <= i < Len().
func (d *Dir) Entry(i int) Entry {
	g := int64(i)
	if d.pick != nil {
		g = d.pick.At(g)
	}
	return d.allEntry(g)
}

// Lookup finds an entry by name.
func (d *Dir) Lookup(name string) (Entry, bool) {
	if d.samples == nil {
		i, ok := d.byName[name]
		if !ok {
			e, ok := d.hidden[name]
			return e, ok
		}
		return d.entries[i], true
	}
	g, ok := d.sampleIndex(name)
	if !ok || (d.pick != nil && !d.pick.Contains(g)) {
		return Entry{}, false
	}
	return d.allEntry(g), true
}

// allLen, allEntry and sampleIndex address every sample of a sample
// directory by its global index, whatever the rank lists.
func (d *Dir) allLen() int64 {
	if d.samples != nil {
		return d.samples.len()
	}
	return int64(len(d.entries))
}

func (d *Dir) allEntry(g int64) Entry {
	if d.samples != nil {
		return d.samples.entry(g)
	}
	return d.entries[g]
}

func (d *Dir) sampleIndex(name string) (int64, bool) {
	if d.samples == nil {
		return 0, false
	}
	return d.samples.index(name)
}

// samples is the sample files of one array or view, addressed by global
// index; names are the index zero-padded to a fixed width.
type samples interface {
	len() int64
	entry(g int64) Entry
	index(name string) (int64, bool)
}

// Lookup finds the entry at a "/"-separated path in the mount.
func (l *Layout) Lookup(p string) (Entry, bool) { return l.lookup(p, false) }

// Find is Lookup over every sample, also those a sharded layout's
// directories do not list (other ranks' share of one cache).
func (l *Layout) Find(p string) (Entry, bool) { return l.lookup(p, true) }

func (l *Layout) lookup(p string, all bool) (Entry, bool) {
	p = strings.Trim(path.Clean("/"+p), "/")
	e := Entry{Kind: KindDir, Dir: l.root}
	if p == "" {
		return e, true
	}
	for _, seg := range strings.Split(p, "/") {
		if e.Kind != KindDir {
			return Entry{}, false
		}
		if all && e.Dir.samples != nil {
			g, ok := e.Dir.sampleIndex(seg)
			if !ok {
				return Entry{}, false
			}
			e = e.Dir.allEntry(g)
			continue
		}
		var ok bool
		if e, ok = e.Dir.Lookup(seg); !ok {
			return Entry{}, false
		}
	}
	return e, true
}

// Walk calls fn for every blob, in path order, until fn returns an error.
func (l *Layout) Walk(fn func(Blob) error) error {
	var walk func(d *Dir) error
	walk = func(d *Dir) error {
		for i := 0; i < d.Len(); i++ {
			e := d.Entry(i)
			switch e.Kind {
			case KindDir:
				if err := walk(e.Dir); err != nil {
					return err
				}
			case KindBlob:
				if err := fn(e.Blob); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(l.root)
}

// Build computes the layout of an opened hierarchy.
func Build(h *zarr.Hierarchy, opts Options) (*Layout, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if strings.Contains(o.SampleDim, ",") {
		o.SampleDim, _ = ChooseSampleDim(h, o.SampleDim)
	}
	sourceID, identity := "", ""
	if h.Store != nil {
		sourceID = h.Store.ID()
		identity = objectstore.Identity(h.Store)
	}
	l := &Layout{SourceID: sourceID, opts: o, h: h}
	l.ID = layoutID(identity, o)

	b := newTreeBuilder()
	groups := make([]string, 0, len(h.Groups))
	for g := range h.Groups {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, g := range groups {
		if g != "" {
			if err := b.mkdirAll(g); err != nil {
				l.Skipped = append(l.Skipped, Skipped{Path: g, Reason: err.Error()})
				continue
			}
		}
		if err := b.addGroupAttrs(g, h.Groups[g]); err != nil {
			return nil, fmt.Errorf("group %q: %w", g, err)
		}
	}
	for _, a := range h.Arrays {
		if a.Unsupported != "" {
			l.Skipped = append(l.Skipped, Skipped{Path: a.Path, Reason: a.Unsupported})
			continue
		}
		files, err := l.addArray(b, a, rootArrayName(sourceID))
		if err != nil {
			// A header that does not fit is the alignment's fault, not the
			// array's: refuse the whole layout so the user picks a larger
			// --align instead of silently losing arrays.
			if errors.Is(err, errCollision) {
				l.Skipped = append(l.Skipped, Skipped{Path: a.Path, Reason: err.Error()})
				continue
			}
			return nil, err
		}
		l.Arrays++
		l.Files += files
	}
	for _, v := range o.Views {
		files, err := l.addView(b, h, v)
		if err != nil {
			return nil, err
		}
		l.Files += files
	}
	l.root = b.finish()
	return l, nil
}

// layoutID names the cache directory: the source and the options that
// shape every path and header, nothing the source's contents may change.
func layoutID(sourceID string, o Options) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00align=%d\x00sample_dim=%s\x00", layoutVersion, sourceID, o.Align, o.SampleDim)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// rootArrayName names the files of a store whose root is itself an array
// (Path ""): the store's last path segment less ".zarr", else "array".
func rootArrayName(sourceID string) string {
	base := path.Base(strings.TrimSuffix(sourceID, "/"))
	base = strings.TrimSuffix(base, ".zarr")
	if base == "" || base == "." || base == "/" || strings.ContainsAny(base, ":") {
		return "array"
	}
	return base
}

// addArray adds an array's blob(s) and sidecar; it returns the file count.
func (l *Layout) addArray(b *treeBuilder, a *zarr.Array, rootName string) (int64, error) {
	p := a.Path
	if p == "" {
		p = rootName
	}
	for _, s := range a.Shape {
		if s < 0 {
			return 0, fmt.Errorf("array %q: negative shape %v", a.Path, a.Shape)
		}
	}
	axis := -1
	if len(a.Shape) >= 2 {
		for i, d := range a.Dims {
			if d == l.opts.SampleDim {
				axis = i
				break
			}
		}
	}
	if axis >= 0 {
		ss, err := newSampleSet(l.opts, a, p, axis)
		if err != nil {
			return 0, fmt.Errorf("array %q: %w", a.Path, err)
		}
		d := &Dir{path: p, samples: ss, pick: l.opts.pick(ss.n)}
		side, err := sidecar(l.opts, a, axis, ss.sampleShape, int64(d.Len()), d.pick)
		if err != nil {
			return 0, fmt.Errorf("array %q: %w", a.Path, err)
		}
		if err := b.add(p, Entry{Kind: KindDir, Dir: d}); err != nil {
			return 0, err
		}
		if err := b.add(p+".json", Entry{Kind: KindSidecar, Data: side}); err != nil {
			return 0, err
		}
		return int64(d.Len()) + 1, nil
	}
	blob, err := newWholeBlob(l.opts, a, p+".npy")
	if err != nil {
		return 0, fmt.Errorf("array %q: %w", a.Path, err)
	}
	side, err := sidecar(l.opts, a, -1, a.Shape, 1, nil)
	if err != nil {
		return 0, fmt.Errorf("array %q: %w", a.Path, err)
	}
	if err := b.add(p+".npy", Entry{Kind: KindBlob, Blob: blob}); err != nil {
		return 0, err
	}
	if err := b.add(p+".json", Entry{Kind: KindSidecar, Data: side}); err != nil {
		return 0, err
	}
	return 2, nil
}

var errCollision = errors.New("name already taken")

// treeBuilder collects entries by path before freezing them into Dirs.
type treeBuilder struct {
	dirs map[string]*buildDir
}

type buildDir struct {
	entries map[string]Entry
	sub     map[string]bool // names that are builder directories
	hidden  map[string]Entry
}

func newTreeBuilder() *treeBuilder {
	return &treeBuilder{dirs: map[string]*buildDir{"": {entries: map[string]Entry{}, sub: map[string]bool{}}}}
}

// mkdirAll makes the group directory p and its parents.
func (b *treeBuilder) mkdirAll(p string) error {
	if _, ok := b.dirs[p]; ok {
		return nil
	}
	parent, name := path.Split(p)
	parent = strings.TrimSuffix(parent, "/")
	if err := b.mkdirAll(parent); err != nil {
		return err
	}
	pd := b.dirs[parent]
	if _, ok := pd.entries[name]; ok && !pd.sub[name] {
		return fmt.Errorf("group %q: %w", p, errCollision)
	}
	pd.entries[name] = Entry{Name: name, Kind: KindDir}
	pd.sub[name] = true
	b.dirs[p] = &buildDir{entries: map[string]Entry{}, sub: map[string]bool{}}
	return nil
}

// add places e at path p, creating parent group directories.
func (b *treeBuilder) add(p string, e Entry) error {
	parent, name := path.Split(p)
	parent = strings.TrimSuffix(parent, "/")
	if err := b.mkdirAll(parent); err != nil {
		return err
	}
	pd := b.dirs[parent]
	if _, ok := pd.entries[name]; ok {
		return fmt.Errorf("%q: %w", p, errCollision)
	}
	e.Name = name
	pd.entries[name] = e
	return nil
}

func (b *treeBuilder) finish() *Dir {
	var build func(p string) *Dir
	build = func(p string) *Dir {
		bd := b.dirs[p]
		d := &Dir{path: p, byName: make(map[string]int, len(bd.entries)), hidden: bd.hidden}
		for _, e := range bd.entries {
			if bd.sub[e.Name] {
				e.Dir = build(path.Join(p, e.Name))
			}
			d.entries = append(d.entries, e)
		}
		sort.Slice(d.entries, func(i, j int) bool { return d.entries[i].Name < d.entries[j].Name })
		for i, e := range d.entries {
			d.byName[e.Name] = i
		}
		return d
	}
	return build("")
}

// sampleSet computes the entries of one sample directory.
type sampleSet struct {
	opts        Options
	arr         *zarr.Array
	dir         string
	axis        int
	n           int64
	width       int
	sampleShape []int64
	header      []byte
	size        int64
	dataHash    string // arr.DataHash(axis)
}

func newSampleSet(o Options, a *zarr.Array, dir string, axis int) (*sampleSet, error) {
	n := a.Shape[axis]
	shape := make([]int64, 0, len(a.Shape)-1)
	shape = append(shape, a.Shape[:axis]...)
	shape = append(shape, a.Shape[axis+1:]...)
	hdr, err := NPYHeader(a.DType.NumpyLE(), shape, o.Align)
	if err != nil {
		return nil, err
	}
	width := sampleWidth(n)
	return &sampleSet{
		opts: o, arr: a, dir: dir, axis: axis, n: n, width: width,
		sampleShape: shape, header: hdr,
		size:     o.Align + prod(shape)*int64(a.DType.Size),
		dataHash: a.DataHash(axis),
	}, nil
}

func (s *sampleSet) len() int64 { return s.n }

func (s *sampleSet) index(name string) (int64, bool) { return parseSampleName(name, s.width, s.n) }

// sampleWidth is the number of digits of the largest of n sample indices.
func sampleWidth(n int64) int {
	if n > 1 {
		return len(strconv.FormatInt(n-1, 10))
	}
	return 1
}

// sampleFileName is K zero-padded to width digits, plus ".npy".
func sampleFileName(k int64, width int) string {
	d := strconv.FormatInt(k, 10)
	if len(d) < width {
		d = strings.Repeat("0", width-len(d)) + d
	}
	return d + ".npy"
}

// NarrowerPaths returns the paths that the sample file at p had under
// narrower names, before its directory grew past a power of ten
// ("t/0042.npy": "t/042.npy" and "t/42.npy"), and nil for a path whose
// name is not a sample's padded with zeros. A cache looks there for a
// blob it may link rather than fill (cache.Cache adopts equal identities).
func NarrowerPaths(p string) []string {
	dir, name := path.Split(p)
	digits, ok := strings.CutSuffix(name, ".npy")
	if !ok || len(digits) < 2 || digits[0] != '0' {
		return nil
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return nil
		}
	}
	var out []string
	for i := 1; i < len(digits) && digits[i-1] == '0'; i++ {
		out = append(out, dir+digits[i:]+".npy")
	}
	return out
}

// parseSampleName parses a sample file name of one of n samples; only the
// canonical padded form matches.
func parseSampleName(name string, width int, n int64) (int64, bool) {
	digits, ok := strings.CutSuffix(name, ".npy")
	if !ok || len(digits) != width {
		return 0, false
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	i, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || i >= n {
		return 0, false
	}
	return i, true
}

func (s *sampleSet) entry(i int64) Entry {
	name := sampleFileName(i, s.width)
	start := make([]int64, len(s.arr.Shape))
	count := append([]int64(nil), s.arr.Shape...)
	start[s.axis] = i
	count[s.axis] = 1
	return Entry{Name: name, Kind: KindBlob, Blob: &RegionBlob{
		align: s.opts.Align, arr: s.arr, path: s.dir + "/" + name, dataHash: s.dataHash,
		header: s.header, size: s.size, start: start, count: count,
	}}
}

func newWholeBlob(o Options, a *zarr.Array, p string) (*RegionBlob, error) {
	hdr, err := NPYHeader(a.DType.NumpyLE(), a.Shape, o.Align)
	if err != nil {
		return nil, err
	}
	return &RegionBlob{
		align: o.Align, arr: a, path: p, header: hdr, dataHash: a.DataHash(-1),
		size:  o.Align + prod(a.Shape)*int64(a.DType.Size),
		start: make([]int64, len(a.Shape)), count: append([]int64(nil), a.Shape...),
	}, nil
}

func prod(s []int64) int64 {
	p := int64(1)
	for _, v := range s {
		p *= v
	}
	return p
}

// SameNames reports whether two directories list the same names.
func (a *Dir) SameNames(b *Dir) bool {
	if a.Len() != b.Len() || a.IsSampleDir() != b.IsSampleDir() {
		return false
	}
	n := a.Len()
	if n == 0 {
		return true
	}
	if a.IsSampleDir() {
		// Names are indices padded to one width: the same count and the
		// same first and last names are the same names.
		return a.Entry(0).Name == b.Entry(0).Name && a.Entry(n-1).Name == b.Entry(n-1).Name
	}
	for i := range n {
		if ea, eb := a.Entry(i), b.Entry(i); ea.Name != eb.Name || ea.Kind != eb.Kind {
			return false
		}
	}
	return true
}

// SameNames reports whether two layouts have the same tree of names: then
// a refresh from one to the other left no cached path without its file, as
// is the case when only chunks were rewritten.
func SameNames(a, b *Layout) bool { return sameTree(a.Root(), b.Root()) }

func sameTree(a, b *Dir) bool {
	if !a.SameNames(b) {
		return false
	}
	if a.IsSampleDir() {
		return true
	}
	for i := range a.Len() {
		ea, eb := a.Entry(i), b.Entry(i)
		if ea.Kind == KindDir && !sameTree(ea.Dir, eb.Dir) {
			return false
		}
	}
	return true
}
