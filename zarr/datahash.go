package zarr

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// DataHash returns a hex SHA-256 of what determines how the array's stored
// chunks decode: its metadata document less the user attributes, with the
// dimension names in effect, and with the extent of dimension axis left out
// (axis < 0 or out of range: the whole shape counts). Appending along axis
// rewrites no chunk before the append point and keeps DataHash(axis), so
// bytes derived from those chunks keep their identity; any other change of
// metadata changes it. Attributes never change decoded bytes (v2 dimension
// names, which live among them, are counted through Dims).
func (a *Array) DataHash(axis int) string {
	m := decodeLessAttributes(a.doc)
	h := sha256.New()
	if m == nil {
		// Not a JSON object (an unsupported array): the document as it is.
		fmt.Fprintf(h, "raw\x00%d\x00%s\x00%d:", a.ZarrFormat, a.MetaHash, axis)
		return hex.EncodeToString(h.Sum(nil))
	}
	if shape, ok := m["shape"].([]any); ok && axis >= 0 && axis < len(shape) {
		shape[axis] = nil
	}
	m["zarrfs:dims"] = a.Dims
	m["zarrfs:format"] = a.ZarrFormat
	b, err := json.Marshal(m) // sorted keys: a canonical form
	if err != nil {
		b = a.doc
	}
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// decodeLessAttributes decodes a metadata document's members but its
// attributes, which are left as the raw bytes they were and never parsed:
// they may be most of a large document, and parsing them into values takes
// many times their size. nil when doc is not a JSON object.
func decodeLessAttributes(doc []byte) map[string]any {
	if doc == nil {
		return nil
	}
	// Unmarshal, unlike a Decoder, scans doc in place, copying only the
	// members' bytes.
	var raw map[string]json.RawMessage
	if json.Unmarshal(doc, &raw) != nil || raw == nil {
		return nil
	}
	delete(raw, "attributes")
	m := make(map[string]any, len(raw))
	for k, v := range raw {
		var x any
		d := json.NewDecoder(bytes.NewReader(v))
		d.UseNumber()
		if d.Decode(&x) != nil {
			return nil
		}
		m[k] = x
	}
	return m
}
