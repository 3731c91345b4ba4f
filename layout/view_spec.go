package layout

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ErrInvalidView is wrapped by every error about a view file: its syntax, its
// fields, or a mismatch with the store it is bound to.
var ErrInvalidView = errors.New("invalid view")

// SpecError is one problem in a view file, located by file, line and field
// so that the user can go straight to it. Error() renders it as one line:
//
//	train.yaml:9: view "train": channels[1].select_values.level[0]: value 925 not found in coordinate array "level"
type SpecError struct {
	File  string // the file as given ("" when parsed from bytes without a name)
	Line  int    // 1-based line; 0 when unknown
	View  string // the view's name, "" before it is known
	Field string // the field's path, relative to the view when View is set
	Msg   string
}

func (e *SpecError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.File == "" {
		b.WriteString("view spec")
	}
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.View != "" {
		fmt.Fprintf(&b, "view %q: ", e.View)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

func (e *SpecError) Unwrap() error { return ErrInvalidView }

// ViewSpec is one view as written in a view file (docs/design.md §5),
// checked for syntax but not yet against a store; Bind does that.
type ViewSpec struct {
	// Name is the view's directory in the mount: MOUNT/Name/ and MOUNT/Name.json.
	Name string
	// SampleDim is the dimension whose indices become samples. Empty means
	// the mount's sample dimension.
	SampleDim string
	// Samples is the half-open range of indices along SampleDim.
	Samples SampleRange
	// DType is the output type ("float32"). Empty means the channels'
	// common type.
	DType string
	// Channels are stacked in this order, each possibly expanding to several
	// channels through its selections.
	Channels []ChannelSpec

	file  string
	line  int            // line of the view's entry
	lines map[string]int // field path (relative to the view) -> line
}

// SampleRange selects samples Start, Start+Step, ... below Stop.
type SampleRange struct {
	Start int64
	// Stop is nil for the end of the sample dimension.
	Stop *int64
	// Step is at least 1.
	Step int64
}

// ChannelSpec is one entry of a view's channel list.
type ChannelSpec struct {
	// Var is the array's store path.
	Var string
	// Select picks indices along dimensions, in file order.
	Select []DimIndices
	// SelectValues picks coordinate values along dimensions, in file order.
	SelectValues []DimValues
}

// DimIndices selects indices along one dimension.
type DimIndices struct {
	Dim     string
	Indices []int64
	// All selects every index along Dim, one channel each, in index order
	// (select: {level: all}); Indices is then empty.
	All bool
}

// DimValues selects coordinate values along one dimension.
type DimValues struct {
	Dim    string
	Values []CoordValue
}

// CoordValue is a coordinate value as written: its text (for messages) and
// its number. Integers are kept exactly, since int64 coordinates (epoch
// nanoseconds, say) do not fit a float64.
type CoordValue struct {
	Text  string
	IsInt bool
	Int   int64
	Float float64
}

// File returns the file the spec came from.
func (s *ViewSpec) File() string { return s.file }

// Line returns the line of the view's entry in its file.
func (s *ViewSpec) Line() int { return s.line }

// errorf builds an error about field (a path relative to the view), located
// at the line of the field or of its nearest parent that has one.
func (s *ViewSpec) errorf(field, format string, args ...any) error {
	line := s.line
	for f := field; f != ""; f = parentField(f) {
		if l, ok := s.lines[f]; ok {
			line = l
			break
		}
	}
	return &SpecError{File: s.file, Line: line, View: s.Name, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// parentField drops the last element of a field path: "a.b[2]" -> "a.b" -> "a".
func parentField(f string) string {
	if i := strings.LastIndexAny(f, ".["); i >= 0 {
		return f[:i]
	}
	return ""
}

// LoadViews reads a view file.
func LoadViews(path string) ([]*ViewSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidView, err)
	}
	return ParseViews(path, data)
}

// yamlLine finds the line number yaml puts in its syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// yamlProblem splits a yaml syntax error into the line it names (0 for
// none) and the problem.
func yamlProblem(err error) (int, string) {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return line, msg[len(m[0]):]
	}
	return 0, strings.TrimPrefix(msg, "yaml: ")
}

// maxProblemScan bounds the lines yamlProblemLine parses prefixes of.
const maxProblemScan = 5000

// yamlProblemLine returns the line a YAML syntax error is on, 0 when it
// cannot tell. The parser names the line where the enclosing collection
// starts (counted from 0) for a problem found inside it: a key indented
// wrongly on line 5 of a list that starts on line 2 is reported at line 1.
// The problem is on the first line at which the text up to it fails with
// the same problem: text cut at a line end parses until it reaches the
// problem (an unclosed flow collection fails from the line it opens on,
// which is where to look).
func yamlProblemLine(data []byte, problem string) int {
	end := 0
	for line := 1; line <= maxProblemScan && end < len(data); line++ {
		if i := bytes.IndexByte(data[end:], '\n'); i >= 0 {
			end += i + 1
		} else {
			end = len(data)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(data[:end], &doc); err != nil {
			if _, p := yamlProblem(err); p == problem {
				return line
			}
		}
	}
	return 0
}

// ParseViews parses the YAML text of a view file; file names it in errors.
// It checks everything that does not need the store: keys at every level,
// types, name syntax, dtype names, index signs and the samples range.
func ParseViews(file string, data []byte) ([]*ViewSpec, error) {
	p := &parser{file: file}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, msg := yamlProblem(err)
		if l := yamlProblemLine(data, msg); l > 0 {
			line = l
		}
		return nil, &SpecError{File: file, Line: line, Msg: "bad YAML: " + msg}
	}
	if len(doc.Content) == 0 {
		return nil, &SpecError{File: file, Msg: "empty file: want a mapping with key \"views\""}
	}
	root := deref(doc.Content[0])
	fields, err := p.mapping(root, "", nil, "views")
	if err != nil {
		return nil, err
	}
	vs, ok := fields["views"]
	if !ok {
		return nil, p.errAt(root, "", "missing key \"views\"")
	}
	vs = deref(vs)
	if vs.Kind != yaml.SequenceNode {
		return nil, p.errAt(vs, "views", "want a list of views")
	}
	if len(vs.Content) == 0 {
		return nil, p.errAt(vs, "views", "no views")
	}
	var out []*ViewSpec
	seen := map[string]int{}
	for i, n := range vs.Content {
		s, err := p.view(deref(n), fmt.Sprintf("views[%d]", i))
		if err != nil {
			return nil, err
		}
		if prev, dup := seen[s.Name]; dup {
			return nil, s.errorf("name", "a view named %q is already defined at line %d", s.Name, prev)
		}
		seen[s.Name] = s.lines["name"]
		out = append(out, s)
	}
	return out, nil
}

type parser struct {
	file string
}

func (p *parser) errAt(n *yaml.Node, field, format string, args ...any) error {
	return &SpecError{File: p.file, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// deref follows aliases, so anchors and aliases work anywhere.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// mapping checks that n is a mapping whose keys are all in known, and
// returns the value nodes by key. Keys are returned in file order in keys
// (when non-nil).
func (p *parser) mapping(n *yaml.Node, field string, keys *[]*yaml.Node, known ...string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		if known == nil {
			return nil, p.errAt(n, field, "want a mapping, found %s", describe(n))
		}
		return nil, p.errAt(n, field, "want a mapping (%s), found %s", strings.Join(known, ", "), describe(n))
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, p.errAt(k, field, "keys must be plain names")
		}
		if known != nil && !contains(known, k.Value) {
			return nil, p.errAt(k, field, "unknown key %q (known: %s)", k.Value, strings.Join(known, ", "))
		}
		if _, dup := out[k.Value]; dup {
			return nil, p.errAt(k, joinField(field, k.Value), "key given twice")
		}
		out[k.Value] = v
		if keys != nil {
			*keys = append(*keys, k)
		}
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func joinField(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// str reads a non-empty scalar as a string.
func (p *parser) str(n *yaml.Node, field string) (string, error) {
	n = deref(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" || n.Value == "" {
		return "", p.errAt(n, field, "want a name, found %s", describe(n))
	}
	return n.Value, nil
}

// nonNegInt reads a scalar integer >= 0.
func (p *parser) nonNegInt(n *yaml.Node, field, what string) (int64, error) {
	n = deref(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return 0, p.errAt(n, field, "want an integer %s, found %s", what, describe(n))
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		return 0, p.errAt(n, field, "integer %s out of range: %s", what, n.Value)
	}
	if v < 0 {
		return 0, p.errAt(n, field, "%s %d is negative", what, v)
	}
	return v, nil
}

// list reads a sequence, or a single scalar as a list of one.
func list(n *yaml.Node) []*yaml.Node {
	n = deref(n)
	if n.Kind == yaml.SequenceNode {
		return n.Content
	}
	return []*yaml.Node{n}
}

var (
	viewKeys    = []string{"name", "sample_dim", "samples", "dtype", "channels"}
	samplesKeys = []string{"start", "stop", "step"}
	channelKeys = []string{"var", "select", "select_values"}
)

// maxNameLen keeps NAME.json within the 255 bytes a file name may have.
const maxNameLen = 250

func (p *parser) view(n *yaml.Node, field string) (*ViewSpec, error) {
	s := &ViewSpec{file: p.file, line: n.Line, lines: map[string]int{}, Samples: SampleRange{Step: 1}}
	// The name comes first, so that every other error can name the view.
	// Until it is known, errors name the field from the file's root.
	rel := func(f string) string { return joinField(field, f) }
	var nameNode *yaml.Node
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := deref(n.Content[i]); k.Kind == yaml.ScalarNode && k.Value == "name" {
				nameNode = deref(n.Content[i+1])
			}
		}
	}
	if nameNode != nil {
		var err error
		if s.Name, err = p.str(nameNode, rel("name")); err != nil {
			return nil, err
		}
		s.lines["name"] = nameNode.Line
		if err := checkViewName(s.Name); err != nil {
			return nil, p.errAt(nameNode, rel("name"), "%v", err)
		}
	}
	var keys []*yaml.Node
	fields, err := p.mapping(n, field, &keys, viewKeys...)
	if err != nil {
		return nil, s.wrapIfNamed(err, field)
	}
	if nameNode == nil {
		return nil, p.errAt(n, field, "missing key \"name\"")
	}
	// From here on errors carry the view's name and view-relative fields,
	// located at the key's line (a block value starts on the next one).
	for _, k := range keys {
		s.lines[k.Value] = k.Line
	}
	if v, ok := fields["sample_dim"]; ok {
		if s.SampleDim, err = p.str(v, "sample_dim"); err != nil {
			return nil, s.errorf("sample_dim", "want a dimension name, found %s", describe(deref(v)))
		}
	}
	if v, ok := fields["dtype"]; ok {
		d, err := p.str(v, "dtype")
		if err != nil {
			return nil, s.errorf("dtype", "want a data type name, found %s", describe(deref(v)))
		}
		if _, err := ParseOutputDType(d); err != nil {
			return nil, s.errorf("dtype", "%v", err)
		}
		s.DType = d
	}
	if v, ok := fields["samples"]; ok {
		if err := p.samples(s, deref(v)); err != nil {
			return nil, err
		}
	}
	chans, ok := fields["channels"]
	if !ok {
		return nil, s.errorf("", "missing key \"channels\"")
	}
	chans = deref(chans)
	if chans.Kind != yaml.SequenceNode || len(chans.Content) == 0 {
		return nil, s.errorf("channels", "want a non-empty list of channels, found %s", describe(chans))
	}
	for i, c := range chans.Content {
		cs, err := p.channel(s, deref(c), fmt.Sprintf("channels[%d]", i))
		if err != nil {
			return nil, err
		}
		s.Channels = append(s.Channels, cs)
	}
	return s, nil
}

// wrap turns a parser error (field relative to the file) into one that
// names the view, keeping its line.
func (s *ViewSpec) wrap(err error, field string) error {
	var se *SpecError
	if errors.As(err, &se) {
		return &SpecError{File: se.File, Line: se.Line, View: s.Name, Field: field, Msg: se.Msg}
	}
	return err
}

// wrapIfNamed names the view in err when its name is known; the field
// then becomes view-relative (empty for the view itself).
func (s *ViewSpec) wrapIfNamed(err error, field string) error {
	if s.Name == "" {
		return err
	}
	var se *SpecError
	if errors.As(err, &se) && strings.HasPrefix(se.Field, field) {
		return s.wrap(err, strings.TrimPrefix(strings.TrimPrefix(se.Field, field), "."))
	}
	return err
}

func (p *parser) samples(s *ViewSpec, n *yaml.Node) error {
	fields, err := p.mapping(n, "samples", nil, samplesKeys...)
	if err != nil {
		return s.wrap(err, "samples")
	}
	get := func(k string) (int64, bool, error) {
		v, ok := fields[k]
		if !ok {
			return 0, false, nil
		}
		f := "samples." + k
		s.lines[f] = deref(v).Line
		x, err := p.nonNegInt(v, f, k)
		return x, true, s.wrap(err, f)
	}
	if v, ok, err := get("start"); err != nil {
		return err
	} else if ok {
		s.Samples.Start = v
	}
	if v, ok, err := get("stop"); err != nil {
		return err
	} else if ok {
		s.Samples.Stop = &v
		if v <= s.Samples.Start {
			return s.errorf("samples.stop", "stop %d is not after start %d: the range selects no samples", v, s.Samples.Start)
		}
	}
	if v, ok, err := get("step"); err != nil {
		return err
	} else if ok {
		if v == 0 {
			return s.errorf("samples.step", "step must be at least 1")
		}
		s.Samples.Step = v
	}
	return nil
}

func (p *parser) channel(s *ViewSpec, n *yaml.Node, field string) (ChannelSpec, error) {
	var c ChannelSpec
	s.lines[field] = n.Line
	var keys []*yaml.Node
	fields, err := p.mapping(n, field, &keys, channelKeys...)
	if err != nil {
		return c, s.wrap(err, field)
	}
	for _, k := range keys {
		s.lines[field+"."+k.Value] = k.Line
	}
	v, ok := fields["var"]
	if !ok {
		return c, s.errorf(field, "missing key \"var\"")
	}
	if c.Var, err = p.str(v, field+".var"); err != nil {
		return c, s.wrap(err, field+".var")
	}
	c.Var = strings.Trim(c.Var, "/")
	dims := map[string]string{} // dim -> which selection named it
	if v, ok := fields["select"]; ok {
		err := p.eachDim(s, v, field+".select", func(dim, df string, n *yaml.Node) error {
			di := DimIndices{Dim: dim}
			dims[dim] = "select"
			if n := deref(n); n.Kind == yaml.ScalarNode && n.Value == "all" {
				di.All = true
				c.Select = append(c.Select, di)
				return nil
			}
			for j, e := range list(n) {
				ef := fmt.Sprintf("%s[%d]", df, j)
				s.lines[ef] = deref(e).Line
				x, err := p.nonNegInt(e, ef, "index")
				if err != nil {
					return s.wrap(err, ef)
				}
				di.Indices = append(di.Indices, x)
			}
			if len(di.Indices) == 0 {
				return s.errorf(df, "no indices")
			}
			c.Select = append(c.Select, di)
			return nil
		})
		if err != nil {
			return c, err
		}
	}
	if v, ok := fields["select_values"]; ok {
		err := p.eachDim(s, v, field+".select_values", func(dim, df string, n *yaml.Node) error {
			if dims[dim] != "" {
				return s.errorf(df, "dimension %s is already selected by index", dim)
			}
			dv := DimValues{Dim: dim}
			for j, e := range list(n) {
				ef := fmt.Sprintf("%s[%d]", df, j)
				e = deref(e)
				s.lines[ef] = e.Line
				cv, err := parseCoordValue(e)
				if err != nil {
					return s.errorf(ef, "%v", err)
				}
				dv.Values = append(dv.Values, cv)
			}
			if len(dv.Values) == 0 {
				return s.errorf(df, "no values")
			}
			c.SelectValues = append(c.SelectValues, dv)
			return nil
		})
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// eachDim parses the mapping of dimensions at field f (a channel's select
// or select_values) and calls fn for each dimension, in the file's order,
// with the field that names it and its value.
func (p *parser) eachDim(s *ViewSpec, v *yaml.Node, f string, fn func(dim, df string, n *yaml.Node) error) error {
	var keys []*yaml.Node
	m, err := p.mapping(deref(v), f, &keys)
	if err != nil {
		return s.wrap(err, f)
	}
	for _, k := range keys {
		df := f + "." + k.Value
		s.lines[df] = k.Line
		if err := fn(k.Value, df, m[k.Value]); err != nil {
			return err
		}
	}
	return nil
}

func parseCoordValue(n *yaml.Node) (CoordValue, error) {
	cv := CoordValue{Text: n.Value}
	if n.Kind != yaml.ScalarNode {
		return cv, fmt.Errorf("want a number, found %s", describe(n))
	}
	switch n.ShortTag() {
	case "!!int":
		if err := n.Decode(&cv.Int); err != nil {
			return cv, fmt.Errorf("integer %s out of range", n.Value)
		}
		cv.IsInt = true
		cv.Float = float64(cv.Int)
	case "!!float":
		if err := n.Decode(&cv.Float); err != nil {
			return cv, fmt.Errorf("bad number %s", n.Value)
		}
		if math.IsNaN(cv.Float) {
			return cv, fmt.Errorf("NaN matches no coordinate value")
		}
	default:
		return cv, fmt.Errorf("want a number, found %s", describe(n))
	}
	return cv, nil
}

// checkViewName accepts one path segment that a file system can hold.
func checkViewName(name string) error {
	switch {
	case name == "." || name == "..":
		return fmt.Errorf("%q is not a usable directory name", name)
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("%q is not one path segment", name)
	case len(name) > maxNameLen:
		return fmt.Errorf("name of %d bytes is longer than %d", len(name), maxNameLen)
	}
	return nil
}
