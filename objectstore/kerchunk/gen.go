package kerchunk

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Generators ("gen") describe many references by a pattern over integer
// dimensions: fsspec renders each field with Jinja2 for every point of the
// product of the dimensions. zarrfs renders the part of Jinja2 that
// generators use: "{{ expr }}" where expr is integer arithmetic (+ - * //
// % and parentheses) over the dimension variables and integer literals,
// or a template name. Anything else refuses the reference set, with the
// expression named, rather than guessing; so does a result that int64
// cannot hold (Python's integers would), and nesting deeper than
// maxNesting. Each field is parsed once per generator and rendered for
// every point.

type generator struct {
	Key        string                     `json:"key"`
	URL        string                     `json:"url"`
	Offset     *json.RawMessage           `json:"offset"`
	Length     *json.RawMessage           `json:"length"`
	Dimensions map[string]json.RawMessage `json:"dimensions"`
}

type dimension struct {
	name   string
	values []int64
}

func (b *builder) generate(raw json.RawMessage, templates map[string]string) error {
	var gens []generator
	if err := json.Unmarshal(raw, &gens); err != nil {
		return err
	}
	for gi, g := range gens {
		if (g.Offset == nil) != (g.Length == nil) {
			return fmt.Errorf("generator %d: offset and length go together", gi)
		}
		dims, err := parseDimensions(g.Dimensions)
		if err != nil {
			return fmt.Errorf("generator %d: %w", gi, err)
		}
		total := int64(1)
		for _, d := range dims {
			total *= int64(len(d.values))
			if total > maxKeys {
				return fmt.Errorf("generator %d: more than %d keys", gi, maxKeys)
			}
		}
		// Each field is parsed once, then rendered for every point.
		key, err := parseTemplate(g.Key, templates)
		if err != nil {
			return fmt.Errorf("generator %d key: %w", gi, err)
		}
		u, err := parseTemplate(g.URL, templates)
		if err != nil {
			return fmt.Errorf("generator %d url: %w", gi, err)
		}
		var off, length intField
		if g.Offset != nil {
			if off, err = parseIntField(*g.Offset, templates); err != nil {
				return fmt.Errorf("generator %d offset: %w", gi, err)
			}
			if length, err = parseIntField(*g.Length, templates); err != nil {
				return fmt.Errorf("generator %d length: %w", gi, err)
			}
		}
		vars := map[string]int64{}
		idx := make([]int, len(dims))
		for n := int64(0); n < total; n++ {
			for i, d := range dims {
				vars[d.name] = d.values[idx[i]]
			}
			k, err := key.render(vars)
			if err != nil {
				return fmt.Errorf("generator %d key: %w", gi, err)
			}
			us, err := u.render(vars)
			if err != nil {
				return fmt.Errorf("generator %d url: %w", gi, err)
			}
			r := ref{url: b.intern(us), n: -1}
			if g.Offset != nil {
				if r.off, err = off.render(vars); err != nil {
					return fmt.Errorf("generator %d offset: %w", gi, err)
				}
				if r.n, err = length.render(vars); err != nil {
					return fmt.Errorf("generator %d length: %w", gi, err)
				}
				if r.off < 0 || r.n < 0 {
					return fmt.Errorf("generator %d: key %s: negative offset or length", gi, k)
				}
			}
			if err := b.add(k, r); err != nil {
				return err
			}
			// Next point, last dimension fastest (itertools.product).
			for i := len(idx) - 1; i >= 0; i-- {
				idx[i]++
				if idx[i] < len(dims[i].values) {
					break
				}
				idx[i] = 0
			}
		}
	}
	return nil
}

// parseDimensions reads {"i": {"start": 0, "stop": 10, "step": 1}} or
// {"i": [values]}.
func parseDimensions(raw map[string]json.RawMessage) ([]dimension, error) {
	// The order of the dimensions decides only the order keys are made
	// in, which a map of keys does not keep: any order will do.
	var out []dimension
	for name, v := range raw {
		d := dimension{name: name}
		var list []int64
		if err := json.Unmarshal(v, &list); err == nil {
			d.values = list
		} else {
			var rg struct {
				Start *int64 `json:"start"`
				Stop  *int64 `json:"stop"`
				Step  *int64 `json:"step"`
			}
			if err := json.Unmarshal(v, &rg); err != nil || rg.Stop == nil {
				return nil, fmt.Errorf("dimension %q: want a list of integers or {start, stop, step}", name)
			}
			start, step := int64(0), int64(1)
			if rg.Start != nil {
				start = *rg.Start
			}
			if rg.Step != nil {
				step = *rg.Step
			}
			if step == 0 {
				return nil, fmt.Errorf("dimension %q: step 0", name)
			}
			for x := start; (step > 0 && x < *rg.Stop) || (step < 0 && x > *rg.Stop); x += step {
				d.values = append(d.values, x)
				if len(d.values) > maxKeys {
					return nil, fmt.Errorf("dimension %q: more than %d values", name, maxKeys)
				}
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// intField is an offset or length: a JSON integer, or a string template
// that renders to one.
type intField struct {
	lit  int64
	tmpl *template // nil for a literal
}

func parseIntField(raw json.RawMessage, templates map[string]string) (intField, error) {
	if n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil {
		return intField{lit: n}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return intField{}, fmt.Errorf("%s is neither an integer nor a string", raw)
	}
	t, err := parseTemplate(s, templates)
	if err != nil {
		return intField{}, err
	}
	return intField{tmpl: &t}, nil
}

func (f intField) render(vars map[string]int64) (int64, error) {
	if f.tmpl == nil {
		return f.lit, nil
	}
	out, err := f.tmpl.render(vars)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q renders to %q, not an integer", f.tmpl.src, out)
	}
	return n, nil
}

// template is a field with "{{ expr }}" parts, parsed once: the text
// around the parts (template names already substituted) and the parts'
// expressions.
type template struct {
	src   string
	lits  []string // len(exprs)+1
	exprs []expr
}

// parseTemplate parses s; "{{ name }}" of a template is its text.
func parseTemplate(s string, templates map[string]string) (template, error) {
	t := template{src: s}
	var lit strings.Builder
	for {
		i := strings.Index(s, "{{")
		if i < 0 {
			break
		}
		j := strings.Index(s[i:], "}}")
		if j < 0 {
			return template{}, fmt.Errorf("%q: unclosed {{", t.src)
		}
		src := strings.TrimSpace(s[i+2 : i+j])
		lit.WriteString(s[:i])
		if v, ok := templates[src]; ok {
			lit.WriteString(v)
		} else {
			p := exprParser{src: src}
			e, err := p.parse()
			if err != nil {
				return template{}, fmt.Errorf("expression %q: %w", src, err)
			}
			t.lits = append(t.lits, lit.String())
			t.exprs = append(t.exprs, e)
			lit.Reset()
		}
		s = s[i+j+2:]
	}
	lit.WriteString(s)
	t.lits = append(t.lits, lit.String())
	return t, nil
}

func (t *template) render(vars map[string]int64) (string, error) {
	if len(t.exprs) == 0 {
		return t.lits[0], nil
	}
	var out strings.Builder
	for i, e := range t.exprs {
		out.WriteString(t.lits[i])
		v, err := e.eval(vars)
		if err != nil {
			return "", fmt.Errorf("%q: %w", t.src, err)
		}
		out.WriteString(strconv.FormatInt(v, 10))
	}
	out.WriteString(t.lits[len(t.exprs)])
	return out.String(), nil
}

// An expr is integer arithmetic as Python evaluates it, on int64: a result
// Python's integers would hold and int64 cannot is an error, never a
// wrapped value (a wrapped offset would read the wrong bytes).
type expr interface {
	eval(vars map[string]int64) (int64, error)
}

type (
	num   int64
	name  string
	neg   struct{ x expr }
	binop struct {
		op   string // + - * // %
		l, r expr
	}
)

var errOverflow = errors.New("integer overflow")

func (n num) eval(map[string]int64) (int64, error) { return int64(n), nil }

func (n name) eval(vars map[string]int64) (int64, error) {
	v, ok := vars[string(n)]
	if !ok {
		return 0, fmt.Errorf("unknown name %q", string(n))
	}
	return v, nil
}

func (n neg) eval(vars map[string]int64) (int64, error) {
	v, err := n.x.eval(vars)
	if err != nil {
		return 0, err
	}
	if v == math.MinInt64 {
		return 0, errOverflow
	}
	return -v, nil
}

func (b binop) eval(vars map[string]int64) (int64, error) {
	x, err := b.l.eval(vars)
	if err != nil {
		return 0, err
	}
	y, err := b.r.eval(vars)
	if err != nil {
		return 0, err
	}
	switch b.op {
	case "+":
		if (y > 0 && x > math.MaxInt64-y) || (y < 0 && x < math.MinInt64-y) {
			return 0, errOverflow
		}
		return x + y, nil
	case "-":
		if (y < 0 && x > math.MaxInt64+y) || (y > 0 && x < math.MinInt64+y) {
			return 0, errOverflow
		}
		return x - y, nil
	case "*":
		if x == 0 || y == 0 {
			return 0, nil
		}
		p := x * y
		if p/y != x || (x == -1 && y == math.MinInt64) || (y == -1 && x == math.MinInt64) {
			return 0, errOverflow
		}
		return p, nil
	}
	// Floor division and modulo, as Python's.
	if y == 0 {
		return 0, errors.New("division by zero")
	}
	if x == math.MinInt64 && y == -1 {
		return 0, errOverflow
	}
	q, r := x/y, x%y
	if r != 0 && (r < 0) != (y < 0) {
		q--
		r += y
	}
	if b.op == "//" {
		return q, nil
	}
	return r, nil
}

// maxNesting bounds parentheses and unary minus within one expression: a
// reference set of a million "(" must be refused, not overflow the stack.
const maxNesting = 64

// exprParser parses integer expressions by recursive descent.
type exprParser struct {
	src   string
	pos   int
	depth int
}

func (p *exprParser) parse() (expr, error) {
	e, err := p.sum()
	if err != nil {
		return nil, err
	}
	p.space()
	if p.pos != len(p.src) {
		return nil, fmt.Errorf("unexpected %q", p.src[p.pos:])
	}
	return e, nil
}

func (p *exprParser) space() {
	for p.pos < len(p.src) && p.src[p.pos] == ' ' {
		p.pos++
	}
}

func (p *exprParser) sum() (expr, error) {
	e, err := p.product()
	if err != nil {
		return nil, err
	}
	for {
		p.space()
		if p.pos >= len(p.src) || (p.src[p.pos] != '+' && p.src[p.pos] != '-') {
			return e, nil
		}
		op := p.src[p.pos : p.pos+1]
		p.pos++
		r, err := p.product()
		if err != nil {
			return nil, err
		}
		e = binop{op, e, r}
	}
}

func (p *exprParser) product() (expr, error) {
	e, err := p.unary()
	if err != nil {
		return nil, err
	}
	for {
		p.space()
		rest := p.src[p.pos:]
		var op string
		switch {
		case strings.HasPrefix(rest, "//"):
			op = "//"
		case strings.HasPrefix(rest, "*") && !strings.HasPrefix(rest, "**"):
			op = "*"
		case strings.HasPrefix(rest, "%"):
			op = "%"
		default:
			return e, nil
		}
		p.pos += len(op)
		r, err := p.unary()
		if err != nil {
			return nil, err
		}
		e = binop{op, e, r}
	}
}

// nest enters one level of parentheses or unary minus.
func (p *exprParser) nest() error {
	if p.depth++; p.depth > maxNesting {
		return fmt.Errorf("nested more than %d deep", maxNesting)
	}
	return nil
}

func (p *exprParser) unary() (expr, error) {
	p.space()
	if p.pos < len(p.src) && p.src[p.pos] == '-' {
		p.pos++
		if err := p.nest(); err != nil {
			return nil, err
		}
		x, err := p.unary()
		p.depth--
		if err != nil {
			return nil, err
		}
		return neg{x}, nil
	}
	return p.atom()
}

func (p *exprParser) atom() (expr, error) {
	p.space()
	if p.pos >= len(p.src) {
		return nil, fmt.Errorf("ends early")
	}
	c := p.src[p.pos]
	switch {
	case c == '(':
		p.pos++
		if err := p.nest(); err != nil {
			return nil, err
		}
		e, err := p.sum()
		p.depth--
		if err != nil {
			return nil, err
		}
		p.space()
		if p.pos >= len(p.src) || p.src[p.pos] != ')' {
			return nil, fmt.Errorf("missing )")
		}
		p.pos++
		return e, nil
	case c >= '0' && c <= '9':
		start := p.pos
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		v, err := strconv.ParseInt(p.src[start:p.pos], 10, 64)
		if err != nil {
			return nil, errOverflow
		}
		return num(v), nil
	case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		start := p.pos
		for p.pos < len(p.src) {
			c := p.src[p.pos]
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				break
			}
			p.pos++
		}
		return name(p.src[start:p.pos]), nil
	}
	return nil, fmt.Errorf("unsupported %q (zarrfs renders integer arithmetic only)", p.src[p.pos:])
}
