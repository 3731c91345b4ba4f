package zarr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
)

// ErrMetadataChanged is returned (wrapped in a ChunkError) by a Read that
// found a chunk missing whose array's metadata no longer names it: the
// array shrank, changed, or is gone since the metadata was read. The
// chunk was deleted, not left unwritten, and its fill value would be
// served as data: read the metadata again (the region may no longer
// exist).
var ErrMetadataChanged = errors.New("missing, and the array's metadata changed since it was read")

// A missing chunk is read as the fill value, as zarr-python reads it, only
// while the array's metadata still names it: a chunk that an array's
// shrinking (or its store's replacement) deleted would otherwise serve
// zeros as data until the next metadata refresh. So a Read that finds a
// chunk missing reads the array's metadata document again and compares
// it with the one the array was opened from, less attributes and shape,
// and its shape with the regions read.
//
// One read of the document is shared: it vouches for every absence
// observed before it began. An absence a listing made by listing (S3)
// records was observed when the listing began, so one read of the
// document per listing serves every Read of its missing chunks; one a
// lazy listing learnt (HTTP, large GCS arrays, a local store), when it
// learnt it, so one read after that serves every Read that finds the
// chunk again; one a Read's own request found, when that request ended.
// A read of the document is parsed once, and each array compared with it
// once, however many Reads check against it.

// metaCheck is the last read of one metadata document, and what the
// checks made of it: the document is parsed once per read (a consolidated
// one holds every array's metadata, which may be megabytes), and each
// array compared with it once.
type metaCheck struct {
	mu    sync.Mutex
	began time.Time // when the read began; zero: never read
	doc   []byte    // nil: the document does not exist
	// members are the consolidated document's members
	// (consolidatedMembers), parsed when a check first needs them.
	members map[string]json.RawMessage
	parsed  bool
	// named is each array's comparison with this read of the document.
	named map[*Array]namedAs
	// opened is each array's own document as it was opened, in the
	// canonical form compare uses: read once per array.
	opened map[*Array]canonical
}

// canonical is a metadata document less its attributes and shape, with
// sorted keys (nil when it is not a JSON object), and the shape it names.
type canonical struct {
	rest  []byte
	shape []int64
	ok    bool
}

func canonicalOf(doc []byte) canonical {
	m := decodeLessAttributes(doc)
	if m == nil {
		return canonical{}
	}
	shape, ok := parseShape(m["shape"])
	delete(m, "shape")
	rest, err := json.Marshal(m) // sorted keys: canonical
	if err != nil {
		return canonical{}
	}
	return canonical{rest: rest, shape: shape, ok: ok}
}

// namedAs is how a read of the metadata compares with what an array was
// opened from: changed (wrapping ErrMetadataChanged) when more than the
// shape changed or the array is gone, else the shape it names now (nil:
// the document is the one the array was opened from, byte for byte).
type namedAs struct {
	changed error
	shape   []int64
}

// docKey is where a's metadata document lives now: its own document, or
// the consolidated metadata it was opened from.
func (a *Array) docKey() string {
	if a.consolidated != "" {
		return a.consolidated
	}
	name := "zarr.json"
	if a.ZarrFormat == 2 {
		name = ".zarray"
	}
	return join(a.Path, name)
}

// memberKey is a's key among the members of its consolidated metadata.
func (a *Array) memberKey() string {
	if a.ZarrFormat == 2 {
		return join(a.Path, ".zarray")
	}
	return a.Path
}

// namedNow compares a's metadata as it is now, read at or after since
// (one read shared with other Reads), with the document a was opened from.
func (h *Hierarchy) namedNow(ctx context.Context, a *Array, since time.Time) (namedAs, error) {
	key := a.docKey()
	v, _ := h.metaChecks.LoadOrStore(key, &metaCheck{})
	c := v.(*metaCheck)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.began.IsZero() || c.began.Before(since) {
		began := time.Now()
		b, err := objectstore.GetLimit(ctx, h.Store, key, h.opts.Limits.Document)
		switch {
		case objectstore.IsNotFound(err):
			b = nil
		case err != nil:
			return namedAs{}, err
		default:
			b = nonNil(b)
		}
		c.began, c.doc = began, b
		c.members, c.parsed, c.named = nil, false, nil
	}
	if n, ok := c.named[a]; ok {
		return n, nil
	}
	n := c.compare(a)
	if c.named == nil {
		c.named = map[*Array]namedAs{}
	}
	c.named[a] = n
	return n, nil
}

// compare is namedNow's comparison of c's read with a.
func (c *metaCheck) compare(a *Array) namedAs {
	doc := c.doc
	if doc != nil && a.consolidated != "" {
		if !c.parsed {
			c.members, _ = consolidatedMembers(doc, a.ZarrFormat) // unparsable: no members
			c.parsed = true
		}
		doc = c.members[a.memberKey()]
	}
	switch {
	case doc == nil:
		return namedAs{changed: fmt.Errorf("%w: %s is gone", ErrMetadataChanged, a.docKey())}
	case bytes.Equal(doc, a.doc):
		return namedAs{}
	}
	was, ok := c.opened[a]
	if !ok {
		was = canonicalOf(a.doc)
		if c.opened == nil {
			c.opened = map[*Array]canonical{}
		}
		c.opened[a] = was
	}
	now := canonicalOf(doc)
	switch {
	case was.rest == nil || now.rest == nil:
		return namedAs{changed: fmt.Errorf("%w: %s is no longer a JSON object", ErrMetadataChanged, a.docKey())}
	case !now.ok || !bytes.Equal(was.rest, now.rest) || len(now.shape) != len(a.Shape):
		return namedAs{changed: fmt.Errorf("%w: more than its shape changed", ErrMetadataChanged)}
	}
	return namedAs{shape: now.shape}
}

// stillNamed checks that a's metadata, as it is now (read at or after
// since), still names the regions reqs read of it: the same document but
// for its attributes and shape, and a shape that holds every region. It
// returns what changed, wrapping ErrMetadataChanged, or nil.
func (h *Hierarchy) stillNamed(ctx context.Context, a *Array, since time.Time, reqs []Request) error {
	n, err := h.namedNow(ctx, a, since)
	if err != nil {
		return fmt.Errorf("missing, and the array's metadata could not be read to tell whether it still names the chunk: %w", err)
	}
	if n.changed != nil || n.shape == nil {
		return n.changed
	}
	for _, r := range reqs {
		if r.Array != a {
			continue
		}
		for d := range n.shape {
			if r.Start[d]+r.Count[d] > n.shape[d] {
				return fmt.Errorf("%w: shape %v, no longer %v", ErrMetadataChanged, n.shape, a.Shape)
			}
		}
	}
	return nil
}

// parseShape reads a shape member decoded with numbers kept as written.
func parseShape(v any) ([]int64, bool) {
	items, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]int64, 0, len(items))
	for _, it := range items {
		n, ok := it.(json.Number)
		if !ok {
			return nil, false
		}
		x, err := n.Int64()
		if err != nil || x < 0 {
			return nil, false
		}
		out = append(out, x)
	}
	return out, true
}

// checkAbsent runs stillNamed for every array of which the Read found a
// whole chunk (or shard) missing, fetched ending when its requests ended,
// and fails the Read with the first chunk of an array no longer named.
func (st *readState) checkAbsent(ctx context.Context, fetched time.Time, listings map[*Array]*Listing) error {
	since := map[*Array]time.Time{}
	first := map[*Array]string{}
	var order []*Array
	for _, l := range st.leaves {
		if !l.absent {
			continue
		}
		// An absence is observed when its listing began (listed) or
		// when its request ended.
		at := fetched
		if lst := listings[l.arr]; l.listedAbsent && lst != nil {
			if t := lst.absentSince(l.key); !t.IsZero() {
				at = t
			}
		}
		if _, ok := since[l.arr]; !ok {
			order = append(order, l.arr)
			first[l.arr] = l.key
		}
		if at.After(since[l.arr]) {
			since[l.arr] = at
		}
	}
	slices.SortFunc(order, func(x, y *Array) int { return strings.Compare(x.Path, y.Path) })
	for _, a := range order {
		if err := st.h.stillNamed(ctx, a, since[a], st.reqs); err != nil {
			return &ChunkError{Array: a.Path, Key: first[a], Err: err}
		}
	}
	return nil
}
