package layout

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"testing"
)

// Every group directory answers GroupAttrsName with the group's attributes,
// and lists nothing new.
func TestGroupAttributes(t *testing.T) {
	h := viewtest.Hierarchy()
	h.Groups[""] = map[string]any{"title": "ERA5 <subset>", "version": json.Number("2")}
	h.Groups["sub"] = map[string]any{"level": "surface"}
	l := build(t, h, Options{})
	for p, want := range map[string]map[string]any{
		".zattrs":       {"title": "ERA5 <subset>", "version": float64(2)},
		"sub/.zattrs":   {"level": "surface"},
		"empty/.zattrs": {},
	} {
		e, ok := l.Lookup(p)
		if !ok || e.Kind != KindSidecar {
			t.Errorf("%s: %v %+v", p, ok, e)
			continue
		}
		if p == ".zattrs" && !bytes.Contains(e.Data, []byte(`"ERA5 <subset>"`)) {
			t.Errorf("%s escapes HTML: %s", p, e.Data)
		}
		var got map[string]any
		if err := json.Unmarshal(e.Data, &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %s (%v), want %v", p, e.Data, err, want)
		}
	}
	if slices.Contains(names(l.Root()), GroupAttrsName) {
		t.Errorf("the root lists %s: %v", GroupAttrsName, names(l.Root()))
	}
	// Not in a sample directory, nor beside an array.
	for _, p := range []string{"t/.zattrs", "lsm.npy/.zattrs"} {
		if _, ok := l.Lookup(p); ok {
			t.Errorf("%s exists", p)
		}
	}
}
