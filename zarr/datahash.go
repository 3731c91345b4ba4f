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
	var m map[string]any
	if a.doc != nil {
		d := json.NewDecoder(bytes.NewReader(a.doc))
		d.UseNumber()
		if d.Decode(&m) != nil {
			m = nil
		}
	}
	h := sha256.New()
	if m == nil {
		// Not a JSON object (an unsupported array): the document as it is.
		fmt.Fprintf(h, "raw\x00%d\x00%s\x00%d:", a.ZarrFormat, a.MetaHash, axis)
		return hex.EncodeToString(h.Sum(nil))
	}
	delete(m, "attributes")
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
