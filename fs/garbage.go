package fs

import (
	"strings"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/fs/layout"
)

// Garbage returns the blobs c holds in lay's cache directory that lay will
// never serve again:
//   - a path below a top-level name of lay's tree that the tree lacks: a
//     sample of an old name width (the store grew past a power of ten),
//     past the end of a shrunk array, a file of an array that changed kind;
//   - a blob of the tree recorded with another identity than the one its
//     arrays' current listings give (a version superseded by an append or
//     a rewrite), for the arrays lay has listed.
//
// Paths under a top-level name the tree lacks are left alone: another
// mount of the same source with other views may serve them.
func Garbage(c *cache.Cache, lay *layout.Layout) []cache.BlobEntry {
	var out []cache.BlobEntry
	for _, b := range c.Blobs(lay.ID) {
		top, _, _ := strings.Cut(b.Path, "/")
		if _, ok := lay.Root().Lookup(top); !ok {
			continue
		}
		e, ok := lay.Find(b.Path)
		if !ok || e.Kind != layout.KindBlob {
			out = append(out, b)
			continue
		}
		if id, known := lay.KnownIdentity(e.Blob); known && id != b.Identity {
			out = append(out, b)
		}
	}
	return out
}

// DemoteGarbage makes the first kind of Garbage (paths below lay's names
// that lay lacks) the first blobs c evicts, and returns how many there
// were. It does no I/O: superseded versions at paths lay still has are
// left to `zarrfs cache gc`, since checking them costs a look at every
// chunk's version, and the next open of such a path replaces them anyway.
func DemoteGarbage(c *cache.Cache, lay *layout.Layout) int {
	var paths []string
	for _, b := range c.Blobs(lay.ID) {
		top, _, _ := strings.Cut(b.Path, "/")
		if _, ok := lay.Root().Lookup(top); !ok {
			continue
		}
		if e, ok := lay.Find(b.Path); !ok || e.Kind != layout.KindBlob {
			paths = append(paths, b.Path)
		}
	}
	return c.Demote(lay.ID, paths)
}

// SameNames reports whether two layouts have the same tree of names: then
// a refresh from one to the other made no path garbage (DemoteGarbage has
// nothing to find), as is the case when only chunks were rewritten.
func SameNames(a, b *layout.Layout) bool { return sameTree(a.Root(), b.Root()) }

func sameTree(a, b *layout.Dir) bool {
	if !sameNames(a, b) {
		return false
	}
	if a.IsSampleDir() {
		return true
	}
	for i := range a.Len() {
		ea, eb := a.Entry(i), b.Entry(i)
		if ea.Kind == layout.KindDir && !sameTree(ea.Dir, eb.Dir) {
			return false
		}
	}
	return true
}
