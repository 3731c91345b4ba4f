package fill

import (
	"strings"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/layout"
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
		e, ours, gone := placed(lay, b.Path)
		if !ours {
			continue
		}
		if gone {
			out = append(out, b)
		} else if id, known := lay.KnownIdentity(e.Blob); known && id != b.Identity {
			out = append(out, b)
		}
	}
	return out
}

// Foreign returns the blobs c holds in lay's cache directory below a
// top-level name lay's tree lacks, by that name: the views of another
// mount of the same source (given --view files this layout was not), or
// arrays the store no longer has. Garbage leaves them alone, since
// nothing here tells the two apart.
func Foreign(c *cache.Cache, lay *layout.Layout) map[string][]cache.BlobEntry {
	out := map[string][]cache.BlobEntry{}
	for _, b := range c.Blobs(lay.ID) {
		if _, ours, _ := placed(lay, b.Path); !ours {
			top, _, _ := strings.Cut(b.Path, "/")
			out[top] = append(out[top], b)
		}
	}
	return out
}

// placed looks a cached path up in lay: ours is false below a top-level
// name lay lacks (another mount's view, say); gone is true for a path
// below lay's names that lay has no file for.
func placed(lay *layout.Layout, p string) (e layout.Entry, ours, gone bool) {
	top, _, _ := strings.Cut(p, "/")
	if _, ok := lay.Root().Lookup(top); !ok {
		return e, false, false
	}
	e, ok := lay.Find(p)
	return e, true, !ok || e.Kind != layout.KindBlob
}

// DemoteGarbage makes the first kind of Garbage (paths below lay's names
// that lay lacks) the first blobs c evicts, and returns how many there
// were. It does no I/O: superseded versions at paths lay still has are
// left to `zarrfs cache gc`, since checking them costs a look at every
// chunk's version, and the next open of such a path replaces them anyway.
func DemoteGarbage(c *cache.Cache, lay *layout.Layout) int {
	var paths []string
	for _, b := range c.Blobs(lay.ID) {
		if _, _, gone := placed(lay, b.Path); gone {
			paths = append(paths, b.Path)
		}
	}
	return c.Demote(lay.ID, paths)
}
