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

// DemoteGarbage makes Garbage the first blobs c evicts, and returns how
// many there were.
func DemoteGarbage(c *cache.Cache, lay *layout.Layout) int {
	g := Garbage(c, lay)
	paths := make([]string, len(g))
	for i, b := range g {
		paths[i] = b.Path
	}
	return c.Demote(lay.ID, paths)
}
