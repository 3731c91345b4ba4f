package kerchunk

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Generators ("gen") describe many references by a pattern over integer
// dimensions: fsspec renders each field with Jinja2 for every point of the
// product of the dimensions. zarrfs renders the part of Jinja2 that
// generators use: "{{ expr }}" where expr is integer arithmetic (+ - * //
// % and parentheses) over the dimension variables and integer literals,
// or a template name. Anything else refuses the reference set, with the
// expression named, rather than guessing.

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
		vars := map[string]int64{}
		idx := make([]int, len(dims))
		for n := int64(0); n < total; n++ {
			for i, d := range dims {
				vars[d.name] = d.values[idx[i]]
			}
			key, err := renderExpr(g.Key, vars, templates)
			if err != nil {
				return fmt.Errorf("generator %d key: %w", gi, err)
			}
			u, err := renderExpr(g.URL, vars, templates)
			if err != nil {
				return fmt.Errorf("generator %d url: %w", gi, err)
			}
			r := ref{url: b.intern(u), n: -1}
			if g.Offset != nil {
				if r.off, err = renderInt(*g.Offset, vars, templates); err != nil {
					return fmt.Errorf("generator %d offset: %w", gi, err)
				}
				if r.n, err = renderInt(*g.Length, vars, templates); err != nil {
					return fmt.Errorf("generator %d length: %w", gi, err)
				}
				if r.off < 0 || r.n < 0 {
					return fmt.Errorf("generator %d: key %s: negative offset or length", gi, key)
				}
			}
			if err := b.add(key, r); err != nil {
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

// renderInt renders an offset or length: a JSON integer, or a string
// template that renders to one.
func renderInt(raw json.RawMessage, vars map[string]int64, templates map[string]string) (int64, error) {
	if n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil {
		return n, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, fmt.Errorf("%s is neither an integer nor a string", raw)
	}
	out, err := renderExpr(s, vars, templates)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q renders to %q, not an integer", s, out)
	}
	return n, nil
}

// renderExpr renders every "{{ expr }}" of s.
func renderExpr(s string, vars map[string]int64, templates map[string]string) (string, error) {
	if !strings.Contains(s, "{{") {
		return s, nil
	}
	var out strings.Builder
	for {
		i := strings.Index(s, "{{")
		if i < 0 {
			out.WriteString(s)
			return out.String(), nil
		}
		j := strings.Index(s[i:], "}}")
		if j < 0 {
			return "", fmt.Errorf("%q: unclosed {{", s)
		}
		expr := strings.TrimSpace(s[i+2 : i+j])
		out.WriteString(s[:i])
		if t, ok := templates[expr]; ok {
			out.WriteString(t)
		} else {
			p := exprParser{src: expr, vars: vars}
			v, err := p.parse()
			if err != nil {
				return "", fmt.Errorf("expression %q: %w", expr, err)
			}
			out.WriteString(strconv.FormatInt(v, 10))
		}
		s = s[i+j+2:]
	}
}

// exprParser evaluates integer expressions by recursive descent.
type exprParser struct {
	src  string
	pos  int
	vars map[string]int64
}

func (p *exprParser) parse() (int64, error) {
	v, err := p.sum()
	if err != nil {
		return 0, err
	}
	p.space()
	if p.pos != len(p.src) {
		return 0, fmt.Errorf("unexpected %q", p.src[p.pos:])
	}
	return v, nil
}

func (p *exprParser) space() {
	for p.pos < len(p.src) && p.src[p.pos] == ' ' {
		p.pos++
	}
}

func (p *exprParser) sum() (int64, error) {
	v, err := p.product()
	if err != nil {
		return 0, err
	}
	for {
		p.space()
		if p.pos >= len(p.src) || (p.src[p.pos] != '+' && p.src[p.pos] != '-') {
			return v, nil
		}
		op := p.src[p.pos]
		p.pos++
		w, err := p.product()
		if err != nil {
			return 0, err
		}
		if op == '+' {
			v += w
		} else {
			v -= w
		}
	}
}

func (p *exprParser) product() (int64, error) {
	v, err := p.unary()
	if err != nil {
		return 0, err
	}
	for {
		p.space()
		var op string
		switch {
		case strings.HasPrefix(p.src[p.pos:], "//"):
			op = "//"
		case strings.HasPrefix(p.src[p.pos:], "*") && !strings.HasPrefix(p.src[p.pos:], "**"):
			op = "*"
		case strings.HasPrefix(p.src[p.pos:], "%"):
			op = "%"
		default:
			return v, nil
		}
		p.pos += len(op)
		w, err := p.unary()
		if err != nil {
			return 0, err
		}
		switch op {
		case "*":
			v *= w
		case "//", "%":
			if w == 0 {
				return 0, fmt.Errorf("division by zero")
			}
			q, r := v/w, v%w
			if r != 0 && (r < 0) != (w < 0) { // Python floors
				q--
				r += w
			}
			if op == "//" {
				v = q
			} else {
				v = r
			}
		}
	}
}

func (p *exprParser) unary() (int64, error) {
	p.space()
	if p.pos < len(p.src) && p.src[p.pos] == '-' {
		p.pos++
		v, err := p.unary()
		return -v, err
	}
	return p.atom()
}

func (p *exprParser) atom() (int64, error) {
	p.space()
	if p.pos >= len(p.src) {
		return 0, fmt.Errorf("ends early")
	}
	c := p.src[p.pos]
	switch {
	case c == '(':
		p.pos++
		v, err := p.sum()
		if err != nil {
			return 0, err
		}
		p.space()
		if p.pos >= len(p.src) || p.src[p.pos] != ')' {
			return 0, fmt.Errorf("missing )")
		}
		p.pos++
		return v, nil
	case c >= '0' && c <= '9':
		start := p.pos
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		return strconv.ParseInt(p.src[start:p.pos], 10, 64)
	case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		start := p.pos
		for p.pos < len(p.src) {
			c := p.src[p.pos]
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				break
			}
			p.pos++
		}
		name := p.src[start:p.pos]
		v, ok := p.vars[name]
		if !ok {
			return 0, fmt.Errorf("unknown name %q", name)
		}
		return v, nil
	}
	return 0, fmt.Errorf("unsupported %q (zarrfs renders integer arithmetic only)", p.src[p.pos:])
}
