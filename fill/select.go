package fill

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/zarrfs/zarrfs/layout"
)

// ErrInvalidSpan is returned (wrapped) by ParseSampleSpan for a range it
// cannot read.
var ErrInvalidSpan = errors.New("invalid sample range")

// SampleSpan is a half-open range [Start, Stop) of sample indices; a
// negative Stop means "to the end".
type SampleSpan struct {
	Start, Stop int64
}

// ParseSampleSpan parses "START:STOP" (either may be empty: from the
// first, to the end). The empty string means every sample (nil).
func ParseSampleSpan(s string) (*SampleSpan, error) {
	if s == "" {
		return nil, nil
	}
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return nil, fmt.Errorf("%w: samples %q: want START:STOP", ErrInvalidSpan, s)
	}
	r := &SampleSpan{0, -1}
	var err error
	if a != "" {
		if r.Start, err = strconv.ParseInt(a, 10, 64); err != nil {
			return nil, fmt.Errorf("%w: samples %q: START %q is not a whole number", ErrInvalidSpan, s, a)
		}
		if r.Start < 0 {
			return nil, fmt.Errorf("%w: samples %q: START %d is negative (samples count from 0)", ErrInvalidSpan, s, r.Start)
		}
	}
	if b != "" {
		if r.Stop, err = strconv.ParseInt(b, 10, 64); err != nil {
			return nil, fmt.Errorf("%w: samples %q: STOP %q is not a whole number", ErrInvalidSpan, s, b)
		}
		if r.Stop < r.Start {
			return nil, fmt.Errorf("%w: samples %q: STOP %d is before START %d (START:STOP takes samples START to STOP-1)", ErrInvalidSpan, s, r.Stop, r.Start)
		}
	}
	return r, nil
}

// notInMount is a path of SelectOptions.Only the layout lacks.
type notInMount string

func (p notInMount) Error() string        { return string(p) + ": no such file or directory in the mount" }
func (p notInMount) Is(target error) bool { return target == fs.ErrNotExist }

// within clips the range to a directory of n samples.
func (r *SampleSpan) within(n int64) (lo, hi int64) {
	if r == nil {
		return 0, n
	}
	lo, hi = r.Start, r.Stop
	if hi < 0 || hi > n {
		hi = n
	}
	return min(lo, hi), hi
}

// selectedUnder reports whether a path of only lies inside dir (a single
// sample file of it).
func selectedUnder(only []string, dir string) bool {
	for _, o := range only {
		if strings.HasPrefix(o, dir+"/") {
			return true
		}
	}
	return false
}

// SelectOptions choose the blobs of a Selection. The zero value selects
// every blob.
type SelectOptions struct {
	// Only keeps the blobs under these mount paths (arrays, views,
	// directories or files; ".npy" may be left off a file's name). Empty
	// keeps every path.
	Only []string
	// Samples keeps these samples of every sample directory, by index
	// among all its samples. Nil keeps every sample.
	Samples *SampleSpan
	// Shard keeps the share of the selected samples one rank reads: it
	// splits Samples, not the whole directory, so that ranks given the
	// same range divide it among themselves. A Selection addresses samples
	// by their index among all of a directory's samples, whether or not
	// the layout itself was built with a Shard.
	Shard layout.Shard
}

// Selection is the list of blobs to fill (what `zarrfs warm` does), in
// mount order, with the mount paths they fall under.
type Selection struct {
	Blobs []layout.Blob
	// Dirs are the sample directories holding planned blobs (with a
	// trailing "/") and the whole-array files planned, in mount order.
	Dirs  []string
	Bytes int64 // the planned blobs' sizes, summed
	// Short lists the selected sample directories with fewer samples than
	// Samples asks for ("t/ has 30"); InRange counts those with any
	// sample in the range.
	Short   []string
	InRange int
}

// Select selects blobs of l by path, sample range and rank. Whole-array
// files (coordinates, static fields) are in every rank's selection: they
// are small and every rank needs them. A sample directory of an array
// selected (as a directory, not file by file) brings the coordinate file
// its readers read beside the samples (layout.Layout.CoordinateOf), so
// that a run whose source is down finds it warm too. A path of Only that
// is not in the layout is an error wrapping fs.ErrNotExist.
func Select(l *layout.Layout, o SelectOptions) (*Selection, error) {
	only := make([]string, 0, len(o.Only))
	for _, p := range o.Only {
		p = strings.Trim(path.Clean("/"+p), "/")
		if _, ok := l.Lookup(p); !ok {
			if _, ok := l.Lookup(p + ".npy"); !ok {
				return nil, notInMount(p)
			}
			p += ".npy"
		}
		only = append(only, p)
	}
	selected := func(p string) bool {
		if len(only) == 0 {
			return true
		}
		for _, o := range only {
			if o == "" || p == o || strings.HasPrefix(p, o+"/") {
				return true
			}
		}
		return false
	}
	plan := &Selection{}
	add := func(b layout.Blob) {
		plan.Blobs = append(plan.Blobs, b)
		plan.Bytes += b.Size()
	}
	var whole []*layout.Dir // sample directories selected as such, not file by file
	var walk func(d *layout.Dir)
	walk = func(d *layout.Dir) {
		if d.IsSampleDir() {
			if !selected(d.Path()) && !selectedUnder(only, d.Path()) {
				return
			}
			if selected(d.Path()) {
				whole = append(whole, d)
			}
			n := d.Samples()
			if o.Samples != nil && (o.Samples.Stop > n || o.Samples.Start >= n) {
				plan.Short = append(plan.Short, fmt.Sprintf("%s/ has %d", d.Path(), n))
			}
			lo, hi := o.Samples.within(n)
			if lo < hi {
				plan.InRange++
			}
			mine := o.Shard.Of(lo, hi)
			listed := false
			for j := range mine.Count {
				b := d.SampleEntry(mine.At(j)).Blob
				if !selected(b.Path()) {
					continue
				}
				add(b)
				if !listed {
					listed = true
					plan.Dirs = append(plan.Dirs, d.Path()+"/")
				}
			}
			return
		}
		for i := range d.Len() {
			switch e := d.Entry(i); e.Kind {
			case layout.KindDir:
				walk(e.Dir)
			case layout.KindBlob:
				if selected(e.Blob.Path()) {
					add(e.Blob)
					plan.Dirs = append(plan.Dirs, e.Blob.Path())
				}
			}
		}
	}
	walk(l.Root())
	selectCoordinates(l, plan, whole)
	return plan, nil
}

// selectCoordinates adds to plan the coordinate file of every array's
// sample directory of dirs, unless selected already.
func selectCoordinates(l *layout.Layout, plan *Selection, dirs []*layout.Dir) {
	planned := map[string]bool{}
	for _, b := range plan.Blobs {
		planned[b.Path()] = true
	}
	for _, d := range dirs {
		if c, ok := l.CoordinateOf(d); ok && !planned[c.Path()] {
			planned[c.Path()] = true
			plan.Blobs = append(plan.Blobs, c)
			plan.Bytes += c.Size()
			plan.Dirs = append(plan.Dirs, c.Path())
		}
	}
}
