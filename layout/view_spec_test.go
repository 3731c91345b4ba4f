package layout

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const goodSpec = `# training views
views:
  - name: train
    sample_dim: time
    samples: {start: 2, stop: 10, step: 2}
    dtype: float16
    channels:
      - var: t
        select: {level: [0, 2]}
      - var: /z/
        select_values:
          level: [850, 500.0]
      - var: lsm
  - name: plain
    channels:
      - var: u10
        select: {level: 1}
`

func TestParseViews(t *testing.T) {
	specs, err := ParseViews("views.yaml", []byte(goodSpec))
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 {
		t.Fatalf("%d views", len(specs))
	}
	s := specs[0]
	stop := int64(10)
	want := &ViewSpec{
		Name: "train", SampleDim: "time", DType: "float16",
		Samples: SampleRange{Start: 2, Stop: &stop, Step: 2},
		Channels: []ChannelSpec{
			{Var: "t", Select: []DimIndices{{Dim: "level", Indices: []int64{0, 2}}}},
			{Var: "z", SelectValues: []DimValues{{"level", []CoordValue{{Text: "850", IsInt: true, Int: 850, Float: 850}, {Text: "500.0", Float: 500}}}}},
			{Var: "lsm"},
		},
	}
	got := *s
	got.file, got.line, got.lines = "", 0, nil
	if !reflect.DeepEqual(&got, want) {
		t.Errorf("parsed\n%+v\nwant\n%+v", got, *want)
	}
	if s.File() != "views.yaml" || s.Line() != 3 || s.lines["channels[1].select_values.level[1]"] != 12 {
		t.Errorf("positions: file %q line %d lines %v", s.File(), s.Line(), s.lines)
	}
	p := specs[1]
	if p.SampleDim != "" || p.DType != "" || p.Samples.Stop != nil || p.Samples.Step != 1 || p.Samples.Start != 0 ||
		!reflect.DeepEqual(p.Channels[0].Select, []DimIndices{{Dim: "level", Indices: []int64{1}}}) {
		t.Errorf("defaults: %+v", *p)
	}
}

func TestParseViewsErrors(t *testing.T) {
	view := func(body string) string {
		return "views:\n  - name: train\n" + body
	}
	ch := func(body string) string {
		return view("    channels:\n      - var: t\n" + body)
	}
	for _, tt := range []struct {
		name, yaml, want string
	}{
		{"syntax", "views: [\n", `views.yaml:1: bad YAML: did not find expected node content`},
		{"tab", "views:\n\t- name: x\n", `views.yaml:2: bad YAML: found character that cannot start any token`},
		// The parser names the line where the enclosing list starts, from
		// 0; the error names the line of the problem.
		{"key outdented", "views:\n  - name: a\n channels: []\n", `views.yaml:3: bad YAML: did not find expected key`},
		{"item misindented", "views:\n  - name: a\n    channels:\n      - var: t\n     - var: u\n", `views.yaml:5: bad YAML: did not find expected key`},
		{"dash after mapping", "views:\n  - name: a\n    channels:\n      - var: t\n  x: 1\n  - name: b\n", `views.yaml:5: bad YAML: did not find expected '-' indicator`},
		{"unclosed flow", "views:\n  - name: a\n    channels: [t, u\n  - name: b\n", `views.yaml:3: bad YAML: did not find expected ',' or ']'`},
		{"empty file", "", `views.yaml: empty file: want a mapping with key "views"`},
		{"not a mapping", "- a\n", `views.yaml:1: want a mapping (views), found a list`},
		{"unknown top key", "view:\n  - name: a\n", `views.yaml:1: unknown key "view" (known: views)`},
		{"no views key", "{}\n", `views.yaml:1: missing key "views"`},
		{"views not a list", "views: {name: a}\n", `views.yaml:1: views: want a list of views`},
		{"no views", "views: []\n", `views.yaml:1: views: no views`},
		{"view not a mapping", "views:\n  - train\n", `views.yaml:2: views[0]: want a mapping (name, sample_dim, samples, dtype, channels), found "train"`},
		{"missing name", "views:\n  - channels: [{var: t}]\n", `views.yaml:2: views[0]: missing key "name"`},
		{"empty name", "views:\n  - name: ''\n", `views.yaml:2: views[0].name: want a name, found ""`},
		{"name with slash", "views:\n  - name: a/b\n", `views.yaml:2: views[0].name: "a/b" is not one path segment`},
		{"name dotdot", "views:\n  - name: ..\n", `views.yaml:2: views[0].name: ".." is not a usable directory name`},
		{"name too long", "views:\n  - name: " + strings.Repeat("n", 251) + "\n", `views.yaml:2: views[0].name: name of 251 bytes is longer than 250`},
		{"unknown view key", view("    dtyp: float32\n"), `views.yaml:3: view "train": unknown key "dtyp" (known: name, sample_dim, samples, dtype, channels)`},
		{"duplicate key", view("    dtype: float32\n    dtype: float64\n    channels: [{var: t}]\n"), `views.yaml:4: view "train": dtype: key given twice`},
		{"missing channels", view("    dtype: float32\n"), `views.yaml:2: view "train": missing key "channels"`},
		{"empty channels", view("    channels: []\n"), `views.yaml:3: view "train": channels: want a non-empty list of channels, found a list`},
		{"bad dtype", view("    dtype: complex64\n    channels: [{var: t}]\n"), `views.yaml:3: view "train": dtype: data type "complex64" is not supported (use one of ` + outputDTypes + `)`},
		{"big-endian dtype", view("    dtype: '>f4'\n    channels: [{var: t}]\n"), `views.yaml:3: view "train": dtype: data type ">f4" is big-endian; blobs are little-endian, use "<f4"`},
		{"dtype list", view("    dtype: [f4]\n    channels: [{var: t}]\n"), `views.yaml:3: view "train": dtype: want a data type name, found a list`},
		{"sample_dim mapping", view("    sample_dim: {a: 1}\n    channels: [{var: t}]\n"), `views.yaml:3: view "train": sample_dim: want a dimension name, found a mapping`},
		{"samples unknown key", view("    samples: {start: 0, end: 3}\n    channels: [{var: t}]\n"), `views.yaml:3: view "train": samples: unknown key "end" (known: start, stop, step)`},
		{"samples not a mapping", view("    samples: 5\n    channels: [{var: t}]\n"), `views.yaml:3: view "train": samples: want a mapping (start, stop, step), found "5"`},
		{"negative start", view("    samples:\n      start: -1\n    channels: [{var: t}]\n"), `views.yaml:4: view "train": samples.start: start -1 is negative`},
		{"float stop", view("    samples: {stop: 2.5}\n    channels: [{var: t}]\n"), `views.yaml:3: view "train": samples.stop: want an integer stop, found "2.5"`},
		{"empty range", view("    samples: {start: 4, stop: 4}\n    channels: [{var: t}]\n"), `views.yaml:3: view "train": samples.stop: stop 4 is not after start 4: the range selects no samples`},
		{"zero step", view("    samples:\n      step: 0\n    channels: [{var: t}]\n"), `views.yaml:4: view "train": samples.step: step must be at least 1`},
		{"huge index", ch("        select: {level: [99999999999999999999]}\n"), `views.yaml:5: view "train": channels[0].select.level[0]: want an integer index, found "99999999999999999999"`},
		{"channel not a mapping", view("    channels:\n      - t\n"), `views.yaml:4: view "train": channels[0]: want a mapping (var, select, select_values), found "t"`},
		{"unknown channel key", ch("        selct: {level: [0]}\n"), `views.yaml:5: view "train": channels[0]: unknown key "selct" (known: var, select, select_values)`},
		{"missing var", view("    channels:\n      - select: {level: [0]}\n"), `views.yaml:4: view "train": channels[0]: missing key "var"`},
		{"var null", view("    channels:\n      - var:\n"), `views.yaml:4: view "train": channels[0].var: want a name, found nothing`},
		{"select not a mapping", ch("        select: [0, 2]\n"), `views.yaml:5: view "train": channels[0].select: want a mapping, found a list`},
		{"negative index", ch("        select:\n          level: [0, -2]\n"), `views.yaml:6: view "train": channels[0].select.level[1]: index -2 is negative`},
		{"string index", ch("        select: {level: [a]}\n"), `views.yaml:5: view "train": channels[0].select.level[0]: want an integer index, found "a"`},
		{"no indices", ch("        select: {level: []}\n"), `views.yaml:5: view "train": channels[0].select.level: no indices`},
		{"value not a number", ch("        select_values:\n          level: [low]\n"), `views.yaml:6: view "train": channels[0].select_values.level[0]: want a number, found "low"`},
		{"nan value", ch("        select_values: {level: [.nan]}\n"), `views.yaml:5: view "train": channels[0].select_values.level[0]: NaN matches no coordinate value`},
		{"no values", ch("        select_values: {level: []}\n"), `views.yaml:5: view "train": channels[0].select_values.level: no values`},
		{"dim twice", ch("        select: {level: [0]}\n        select_values: {level: [850]}\n"), `views.yaml:6: view "train": channels[0].select_values.level: dimension level is already selected by index`},
		{"duplicate view", "views:\n  - name: a\n    channels: [{var: t}]\n  - name: a\n    channels: [{var: t}]\n", `views.yaml:4: view "a": name: a view named "a" is already defined at line 2`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseViews("views.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("no error, want %s", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n  %s\nwant\n  %s", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidView) {
				t.Errorf("%v does not wrap ErrInvalidView", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
		})
	}
}

func TestLoadViews(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "train.yaml")
	if err := os.WriteFile(p, []byte(goodSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	specs, err := LoadViews(p)
	if err != nil || len(specs) != 2 || specs[0].File() != p {
		t.Fatalf("%v %v", specs, err)
	}
	_, err = LoadViews(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, ErrInvalidView) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v", err)
	}
	// Anchors and aliases resolve.
	specs, err = ParseViews("a.yaml", []byte("sel: &lv {level: [1]}\nviews:\n  - name: v\n    channels:\n      - {var: t, select: *lv}\n"))
	if err == nil {
		t.Errorf("unknown top key with anchor accepted: %+v", specs)
	}
	specs, err = ParseViews("a.yaml", []byte("views:\n  - name: v\n    channels:\n      - &c {var: t, select: {level: [1]}}\n      - *c\n"))
	if err != nil || len(specs[0].Channels) != 2 || specs[0].Channels[1].Select[0].Indices[0] != 1 {
		t.Errorf("alias: %+v %v", specs, err)
	}
}

func FuzzParseViews(f *testing.F) {
	f.Add([]byte(goodSpec))
	f.Add([]byte("views:\n  - name: a\n    channels: [{var: t, select: {level: [0]}}]\n"))
	f.Add([]byte("views: [\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		specs, err := ParseViews("f.yaml", b)
		if err != nil {
			if !errors.Is(err, ErrInvalidView) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("bad error %q", err)
			}
			return
		}
		for _, s := range specs {
			if checkViewName(s.Name) != nil || len(s.Channels) == 0 || s.Samples.Step < 1 {
				t.Fatalf("accepted %+v", s)
			}
		}
	})
}
