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
// Read's own request found, when that request ended.

// metaCheck is the last read of one metadata document.
type metaCheck struct {
	mu    sync.Mutex
	began time.Time // when the read began; zero: never read
	doc   []byte    // nil: the document does not exist
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

// currentDoc returns a's metadata document as it is now, read at or after
// since (shared with other Reads), nil when the array is gone.
func (h *Hierarchy) currentDoc(ctx context.Context, a *Array, since time.Time) ([]byte, error) {
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
			return nil, err
		default:
			b = nonNil(b)
		}
		c.began, c.doc = began, b
	}
	if c.doc == nil || a.consolidated == "" {
		return c.doc, nil
	}
	return consolidatedMember(c.doc, a), nil
}

// consolidatedMember is a's document within consolidated metadata doc
// (nil when it holds none).
func consolidatedMember(doc []byte, a *Array) []byte {
	if a.ZarrFormat == 2 {
		var zm struct {
			Metadata map[string]json.RawMessage `json:"metadata"`
		}
		if json.Unmarshal(doc, &zm) != nil {
			return nil
		}
		return zm.Metadata[join(a.Path, ".zarray")]
	}
	var n struct {
		Consolidated *struct {
			Metadata map[string]json.RawMessage `json:"metadata"`
		} `json:"consolidated_metadata"`
	}
	if json.Unmarshal(doc, &n) != nil || n.Consolidated == nil {
		return nil
	}
	return n.Consolidated.Metadata[a.Path]
}

// stillNamed checks that a's metadata, as it is now (read at or after
// since), still names the regions reqs read of it: the same document but
// for its attributes and shape, and a shape that holds every region. It
// returns what changed, wrapping ErrMetadataChanged, or nil.
func (h *Hierarchy) stillNamed(ctx context.Context, a *Array, since time.Time, reqs []Request) error {
	doc, err := h.currentDoc(ctx, a, since)
	if err != nil {
		return fmt.Errorf("missing, and the array's metadata could not be read to tell whether it still names the chunk: %w", err)
	}
	if doc == nil {
		return fmt.Errorf("%w: %s is gone", ErrMetadataChanged, a.docKey())
	}
	if bytes.Equal(doc, a.doc) {
		return nil
	}
	was, now := decodeLessAttributes(a.doc), decodeLessAttributes(doc)
	if was == nil || now == nil {
		return fmt.Errorf("%w: %s is no longer a JSON object", ErrMetadataChanged, a.docKey())
	}
	shape, ok := parseShape(now["shape"])
	delete(was, "shape")
	delete(now, "shape")
	wb, err1 := json.Marshal(was) // sorted keys: canonical
	nb, err2 := json.Marshal(now)
	if !ok || err1 != nil || err2 != nil || !bytes.Equal(wb, nb) || len(shape) != len(a.Shape) {
		return fmt.Errorf("%w: more than its shape changed", ErrMetadataChanged)
	}
	for _, r := range reqs {
		if r.Array != a {
			continue
		}
		for d := range shape {
			if r.Start[d]+r.Count[d] > shape[d] {
				return fmt.Errorf("%w: shape %v, no longer %v", ErrMetadataChanged, shape, a.Shape)
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
		if lst := listings[l.arr]; l.listedAbsent && lst != nil && lst.stat == nil {
			at = lst.At
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
