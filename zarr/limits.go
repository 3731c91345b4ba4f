package zarr

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/dustin/go-humanize"
)

// ErrMetadataLimit is returned (wrapped) when a store's metadata passes one
// of the Options.Limits: the error names the document and the limit.
var ErrMetadataLimit = errors.New("metadata limit")

// Defaults of MetadataLimits.
const (
	DefaultMetadataDocument = 16 << 20
	DefaultMetadataTotal    = 64 << 20
	DefaultMetadataNodes    = 100_000
	DefaultMetadataDepth    = 64
	DefaultAttributes       = 1 << 20
)

// MetadataLimits bound what Open reads and parses, so that no store's
// metadata can make a reader allocate without bound: parsing a JSON
// document into values costs up to about 30 times its size in memory (a
// list of small integers: a value of 16 bytes and a boxed number for every
// two bytes of text), and every array and group costs a node in the
// tree. Every zero value means the documented default; a negative one is
// refused by Open.
type MetadataLimits struct {
	// Document bounds one metadata document (zarr.json, .zarray, .zattrs,
	// .zgroup, .zmetadata): a larger one is refused before it is read. An
	// array's or group's own document leaves that node out, with the
	// reason; the root's (which holds consolidated metadata, when there
	// is any) fails Open. 0: DefaultMetadataDocument (16 MiB).
	Document int64
	// Total bounds the bytes of all the documents Open reads: the document
	// that passes it fails Open. 0: DefaultMetadataTotal (64 MiB).
	Total int64
	// Nodes bounds the arrays and groups of the tree: one more fails Open.
	// 0: DefaultMetadataNodes (100,000).
	Nodes int
	// Depth bounds how deep below the root Open walks groups: a group
	// deeper is left out, with the reason, and nothing below it is read.
	// Consolidated metadata, read in one document, has no depth to walk.
	// 0: DefaultMetadataDepth (64).
	Depth int
	// Attributes bounds the attributes of one array or group that are
	// parsed and kept (Array.Attributes), in bytes of their JSON: in the
	// order of their names, attributes are kept while they fit, and the
	// others are named in Array.AttributesLeftOut, never parsed. 0:
	// DefaultAttributes (1 MiB).
	Attributes int64
}

// withDefaults validates l and fills in the defaults.
func (l MetadataLimits) withDefaults() (MetadataLimits, error) {
	if l.Document < 0 || l.Total < 0 || l.Nodes < 0 || l.Depth < 0 || l.Attributes < 0 {
		return l, fmt.Errorf("zarr: negative metadata limit %+v", l)
	}
	if l.Document == 0 {
		l.Document = DefaultMetadataDocument
	}
	if l.Total == 0 {
		l.Total = DefaultMetadataTotal
	}
	if l.Nodes == 0 {
		l.Nodes = DefaultMetadataNodes
	}
	if l.Depth == 0 {
		l.Depth = DefaultMetadataDepth
	}
	if l.Attributes == 0 {
		l.Attributes = DefaultAttributes
	}
	return l, nil
}

func human(n int64) string { return humanize.IBytes(uint64(n)) }

// parseAttributes parses an attributes object (nil or null: none) within
// limit bytes of JSON: whole when it fits, else member by member in the
// order of their names, each parsed only when it fits what is left, so
// that attributes larger than the limit cost their bytes and never their
// values; the members named in first go before the others. The names of
// the members left out come back sorted. An attributes value that is not
// an object is an error.
func parseAttributes(raw json.RawMessage, limit int64, first ...string) (map[string]any, []string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return map[string]any{}, nil, nil
	}
	if raw[0] != '{' {
		return nil, nil, fmt.Errorf("attributes are not an object")
	}
	if int64(len(raw)) <= limit {
		var m map[string]any
		if err := parseJSON(raw, &m); err != nil {
			return nil, nil, fmt.Errorf("attributes: %v", err)
		}
		return attrsOrEmpty(m), nil, nil
	}
	// Unmarshal, unlike a Decoder, scans raw in place: only the members'
	// bytes are copied.
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return nil, nil, fmt.Errorf("attributes: invalid JSON: %v", err)
	}
	keys := make([]string, 0, len(members))
	for k := range members {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		fi, fj := slices.Contains(first, keys[i]), slices.Contains(first, keys[j])
		if fi != fj {
			return fi
		}
		return keys[i] < keys[j]
	})
	m := make(map[string]any, len(members))
	var out []string
	left := limit - 2
	for _, k := range keys {
		n := int64(len(k) + len(members[k]) + 4)
		var v any
		if n > left || parseJSON(members[k], &v) != nil {
			out = append(out, k)
			continue
		}
		m[k] = v
		left -= n
	}
	sort.Strings(out)
	return m, out, nil
}
