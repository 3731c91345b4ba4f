package layout

import "path"

// IsSampleDir reports whether d holds one file per sample (an array with a
// sample dimension, or a view), as opposed to a group directory.
func (d *Dir) IsSampleDir() bool { return d.samples != nil }

// Index returns the position of a sample file's name in a sample
// directory's listing (the sample index within it, or within the rank's
// share when the layout is sharded).
func (d *Dir) Index(name string) (int, bool) {
	g, ok := d.sampleIndex(name)
	if !ok {
		return 0, false
	}
	if d.pick == nil {
		return int(g), true
	}
	i, ok := d.pick.Pos(g)
	return int(i), ok
}

// Sample returns the global index (the number in its name) of the i-th
// entry of a sample directory.
func (d *Dir) Sample(i int) int64 {
	if d.pick != nil {
		return d.pick.At(int64(i))
	}
	return int64(i)
}

// Samples returns how many samples the directory's array or view has in
// all, whatever share of them the directory lists.
func (d *Dir) Samples() int64 { return d.allLen() }

// SampleEntry returns the entry of a sample directory's sample g (the
// number in its name), 0 <= g < Samples(), whether or not the directory
// lists it.
func (d *Dir) SampleEntry(g int64) Entry { return d.allEntry(g) }

// CoordinateOf returns the file of sample coordinates that readers of the
// array sample directory d read beside its samples (zarrfs.torch.Loader,
// SampleDir.coords): the 1-D array named like d's sample dimension, of
// d's length, in d's group, else at the top of the mount. A view's
// coordinates are in its sidecar: false.
func (l *Layout) CoordinateOf(d *Dir) (Blob, bool) {
	s, ok := d.samples.(*sampleSet)
	if !ok || s.axis >= len(s.arr.Dims) || s.arr.Dims[s.axis] == "" {
		return nil, false
	}
	name := s.arr.Dims[s.axis] + ".npy"
	for _, p := range []string{path.Join(path.Dir(d.Path()), name), name} {
		e, ok := l.Lookup(p)
		if !ok || e.Kind != KindBlob {
			continue
		}
		if src := e.Blob.Sources(); len(src) == 1 && src[0].Array != nil && len(src[0].Array.Shape) == 1 && src[0].Array.Shape[0] == s.n {
			return e.Blob, true
		}
	}
	return nil, false
}
