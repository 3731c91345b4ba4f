package kerchunk

import (
	"context"
	"strings"
	"testing"
)

func genSet(t *testing.T, doc string) (*jsonSet, error) {
	t.Helper()
	return parseJSON([]byte(doc))
}

// lookupURL returns the target URL and range of key.
func lookupURL(t *testing.T, s *jsonSet, key string) (string, int64, int64) {
	t.Helper()
	r, ok, _ := s.lookup(context.Background(), key)
	if !ok || r.inline() {
		t.Fatalf("%s: no reference", key)
	}
	return s.url(r.url), r.off, r.n
}

// Generators render as Python would: floor division and modulo of
// negative numbers, template names, every point of the product.
func TestGeneratorArithmetic(t *testing.T) {
	s, err := genSet(t, `{"version": 1, "templates": {"u": "s3://b"},
	  "gen": [{"key": "a/{{i}}", "url": "{{ u }}/f{{ (i - 7) // 2 }}.nc", "offset": "{{ (i - 7) % 3 * 10 + -i }}", "length": 5,
	           "dimensions": {"i": [0, 3, 9]}}], "refs": {}}`)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]struct {
		url string
		off int64
	}{
		"a/0": {"s3://b/f-4.nc", 20}, // (-7)//2 = -4, (-7)%3 = 2
		"a/3": {"s3://b/f-2.nc", 17}, // (-4)//2 = -2, (-4)%3 = 2
		"a/9": {"s3://b/f1.nc", 11},  // 2%3 = 2 -> 20 - 9
	} {
		u, off, n := lookupURL(t, s, key)
		if u != want.url || off != want.off || n != 5 {
			t.Errorf("%s = %s %d+%d, want %s %d+5", key, u, off, n, want.url, want.off)
		}
	}
}

// A hostile generator is refused with one error naming what is wrong:
// nesting deep enough to overflow a recursive parser's stack, arithmetic
// that int64 would wrap (2^64 + 100 is not offset 100), and names that are
// neither dimensions nor templates.
func TestGeneratorRefused(t *testing.T) {
	deep := strings.Repeat("(", 200_000) + "1" + strings.Repeat(")", 200_000)
	minus := strings.Repeat("-", 200_000) + "1"
	for name, c := range map[string]struct{ offset, want string }{
		"parentheses": {"{{ " + deep + " }}", "nested more than"},
		"minus":       {"{{ " + minus + " }}", "nested more than"},
		"wrap":        {"{{ 4294967296 * 4294967296 + 100 }}", "overflow"},
		"add":         {"{{ 9223372036854775807 + i + 1 }}", "overflow"},
		"literal":     {"{{ 99999999999999999999 }}", "overflow"},
		"divide":      {"{{ 100 // (i - i) }}", "division by zero"},
		"name":        {"{{ j * 10 }}", `unknown name "j"`},
		"power":       {"{{ i ** 2 }}", "unexpected"},
	} {
		doc := `{"version": 1, "gen": [{"key": "a/{{i}}", "url": "f.nc", "offset": "` + c.offset + `", "length": "1", "dimensions": {"i": {"stop": 2}}}], "refs": {}}`
		_, err := genSet(t, doc)
		if err == nil || !strings.Contains(err.Error(), c.want) || len(err.Error()) > 400+len(c.offset) {
			t.Errorf("%s: %.200v, want an error naming %q", name, err, c.want)
		}
	}
}

// Where "refs" and a generator name one key, the generator's reference
// is kept, as fsspec keeps it (it applies generators after "refs").
func TestGeneratorOverridesRefs(t *testing.T) {
	s, err := genSet(t, `{"version": 1, "gen": [{"key": "a/{{i}}", "url": "g{{i}}.nc", "dimensions": {"i": {"stop": 2}}}],
	  "refs": {"a/0": ["r.nc", 0, 1], "a/5": ["r.nc", 0, 1]}}`)
	if err != nil {
		t.Fatal(err)
	}
	if u, _, _ := lookupURL(t, s, "a/0"); u != "g0.nc" {
		t.Errorf("a/0 = %s, want the generator's g0.nc", u)
	}
	if u, _, _ := lookupURL(t, s, "a/5"); u != "r.nc" {
		t.Errorf("a/5 = %s, want r.nc", u)
	}
}

// Template references in "refs" URLs are substituted; one naming no
// template refuses the set (fsspec fails on it too), and without
// templates a URL is kept as written.
func TestRefTemplates(t *testing.T) {
	s, err := genSet(t, `{"version": 1, "templates": {"u": "s3://b"}, "refs": {"a": ["{{u}}/x.nc", 1, 2], "b": ["{{ u }}/y.nc"]}}`)
	if err != nil {
		t.Fatal(err)
	}
	if u, _, _ := lookupURL(t, s, "a"); u != "s3://b/x.nc" {
		t.Errorf("a = %s", u)
	}
	if u, _, _ := lookupURL(t, s, "b"); u != "s3://b/y.nc" {
		t.Errorf("b = %s", u)
	}
	if _, err := genSet(t, `{"version": 1, "templates": {"u": "s3://b"}, "refs": {"a": ["{{v}}/x.nc", 1, 2]}}`); err == nil || !strings.Contains(err.Error(), `"v"`) {
		t.Errorf("unknown template: %v", err)
	}
	s, err = genSet(t, `{"version": 1, "refs": {"a": ["{{v}}/x.nc", 1, 2]}}`)
	if err != nil {
		t.Fatal(err)
	}
	if u, _, _ := lookupURL(t, s, "a"); u != "{{v}}/x.nc" {
		t.Errorf("a without templates = %s", u)
	}
}
