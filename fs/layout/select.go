package layout

// IsSampleDir reports whether d holds one file per sample (an array with a
// sample dimension, or a view), as opposed to a group directory.
func (d *Dir) IsSampleDir() bool { return d.samples != nil }
