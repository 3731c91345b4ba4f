package layout

import (
	"bytes"
	"encoding/json"
)

// GroupAttrsName is the file in every group directory of the mount (the
// root's included) that holds the group's Zarr attributes, as a JSON
// object: what Zarr v2 keeps in a group's .zattrs and v3 in its zarr.json
// "attributes". It is found by name but not listed, so listings, globs of
// *.npy and *.json, and readers of a directory see only what they did; no
// array can take the name, which is not a sidecar's "P.json" and which
// Zarr reserves for metadata.
const GroupAttrsName = ".zattrs"

// addGroupAttrs adds the unlisted attributes file of the group directory p.
func (b *treeBuilder) addGroupAttrs(p string, attrs map[string]any) error {
	if attrs == nil {
		attrs = map[string]any{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(attrs); err != nil {
		return err
	}
	bd := b.dirs[p]
	if bd.hidden == nil {
		bd.hidden = map[string]Entry{}
	}
	bd.hidden[GroupAttrsName] = Entry{Name: GroupAttrsName, Kind: KindSidecar, Data: buf.Bytes()}
	return nil
}
