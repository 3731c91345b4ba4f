package layout

// IsSampleDir reports whether d holds one file per sample (an array with a
// sample dimension, or a view), as opposed to a group directory.
func (d *Dir) IsSampleDir() bool { return d.samples != nil || d.viewSamples }

// Index returns the position of a sample file's name in a sample
// directory (the sample index within it).
func (d *Dir) Index(name string) (int, bool) {
	switch {
	case d.samples != nil:
		i, ok := d.samples.index(name)
		return int(i), ok
	case d.viewSamples:
		i, ok := d.byName[name]
		return i, ok
	}
	return 0, false
}
