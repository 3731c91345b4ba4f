package kerchunk

import "testing"

func FuzzParseJSON(f *testing.F) {
	for _, s := range []string{
		`{"version": 1, "refs": {"a/.zarray": "{}", "a/0": ["f.nc", 10, 20], "b": "base64:AAEC", "c": ["s3://b/k"]}}`,
		`{"version": 1, "templates": {"u": "x"}, "gen": [{"key": "a/{{i}}", "url": "{{u}}", "offset": "{{i*10}}", "length": "10", "dimensions": {"i": {"stop": 3}}}], "refs": {}}`,
		`{"a": "b", ".zgroup": "{\"zarr_format\":2}"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		s, err := parseJSON(doc)
		if err != nil {
			return
		}
		for _, k := range s.keys {
			if _, ok := s.refs[k]; !ok {
				t.Fatalf("key %q listed but not held", k)
			}
		}
		sortedChildren(s.keys, "")
	})
}
