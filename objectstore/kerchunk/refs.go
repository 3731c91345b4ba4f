package kerchunk

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/zarrfs/zarrfs/objectstore"
)

// ref is one key of a reference set: inline bytes, or a range (or the
// whole) of a target object.
type ref struct {
	url    int32 // index into the set's URLs; -1 for inline data
	off, n int64 // n < 0: the whole object
	data   []byte
}

func (r ref) inline() bool { return r.url < 0 }

// refSet is a parsed reference set, immutable once built.
type refSet interface {
	// lookup returns the reference at key.
	lookup(ctx context.Context, key string) (ref, bool, error)
	// children lists the immediate children of dir ("" for the root),
	// sorted, directories with a trailing "/".
	children(ctx context.Context, dir string) ([]string, error)
	// each calls fn with every key below prefix ("" for all), any depth.
	each(ctx context.Context, prefix string, fn func(key string, r ref)) error
	// url returns the target URL of index i.
	url(i int32) string
	// urlCount is how many distinct target URLs the set names.
	urlCount() int
}

// maxKeys bounds the keys of one JSON reference set, generators
// included, against a hostile "gen" that expands to billions.
const maxKeys = 50_000_000

// jsonSet is a version 0 or 1 JSON reference set, all in memory.
type jsonSet struct {
	*urlTable
	keys []string // sorted
	refs map[string]ref
}

// urlTable interns the target URLs that references name by index. A
// Parquet set interns while its record files load, so it locks.
type urlTable struct {
	mu   sync.RWMutex
	list []string
	ix   map[string]int32
}

func newURLTable() *urlTable { return &urlTable{ix: map[string]int32{}} }

func (t *urlTable) intern(u string) int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, ok := t.ix[u]; ok {
		return i
	}
	i := int32(len(t.list))
	t.list = append(t.list, u)
	t.ix[u] = i
	return i
}

func (t *urlTable) url(i int32) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.list[i]
}

func (t *urlTable) urlCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.list)
}

func (s *jsonSet) lookup(_ context.Context, key string) (ref, bool, error) {
	r, ok := s.refs[key]
	return r, ok, nil
}

func (s *jsonSet) children(_ context.Context, dir string) ([]string, error) {
	return sortedChildren(s.keys, dir), nil
}

// sortedChildren lists the immediate children of dir among sorted keys,
// skipping over each child directory's keys with one binary search.
func sortedChildren(keys []string, dir string) []string {
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	var out []string
	i := sort.SearchStrings(keys, prefix)
	for i < len(keys) && strings.HasPrefix(keys[i], prefix) {
		rest := keys[i][len(prefix):]
		name, _, isDir := strings.Cut(rest, "/")
		if !isDir {
			out = append(out, name)
			i++
			continue
		}
		out = append(out, name+"/")
		// '/'+1 is '0': the first key past this directory's.
		i += sort.SearchStrings(keys[i:], prefix+name+"0")
	}
	sort.Strings(out)
	return dedupe(out)
}

func dedupe(s []string) []string {
	out := s[:0]
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

func (s *jsonSet) each(ctx context.Context, prefix string, fn func(string, ref)) error {
	p := ""
	if prefix != "" {
		p = prefix + "/"
	}
	for i := sort.SearchStrings(s.keys, p); i < len(s.keys) && strings.HasPrefix(s.keys[i], p); i++ {
		if i%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		fn(s.keys[i], s.refs[s.keys[i]])
	}
	return nil
}

// builder collects references, interning target URLs.
type builder struct {
	*urlTable
	refs     map[string]ref
	rendered map[string]string // URL templates of "refs", rendered
}

func newBuilder() *builder {
	return &builder{urlTable: newURLTable(), refs: map[string]ref{}, rendered: map[string]string{}}
}

func (b *builder) add(key string, r ref) error {
	k, err := objectstore.CleanKey(key, false)
	if err != nil {
		return fmt.Errorf("key %q: %w", key, err)
	}
	if len(b.refs) >= maxKeys {
		return fmt.Errorf("more than %d keys", maxKeys)
	}
	b.refs[k] = r
	return nil
}

func (b *builder) set() *jsonSet {
	s := &jsonSet{urlTable: b.urlTable, refs: b.refs, keys: make([]string, 0, len(b.refs))}
	for k := range b.refs {
		s.keys = append(s.keys, k)
	}
	sort.Strings(s.keys)
	return s
}

// parseJSON parses a kerchunk JSON reference set: version 1 ({"version":
// 1, "templates": ..., "gen": ..., "refs": ...}) or version 0 (the refs
// object alone).
func parseJSON(doc []byte) (*jsonSet, error) {
	var top map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	if err := d.Decode(&top); err != nil {
		if se, ok := err.(*json.SyntaxError); ok {
			return nil, fmt.Errorf("invalid JSON at offset %d: %v", se.Offset, se)
		}
		return nil, fmt.Errorf("invalid JSON: %v", err)
	}
	b := newBuilder()
	verRaw, versioned := top["version"]
	if !versioned {
		// Version 0: every entry is a reference.
		for k, v := range top {
			if err := b.addRaw(k, v, nil); err != nil {
				return nil, err
			}
		}
		return b.set(), nil
	}
	var ver json.Number
	if err := json.Unmarshal(verRaw, &ver); err != nil || ver.String() != "1" {
		return nil, fmt.Errorf("reference set version %s: only versions 0 and 1 are read", string(verRaw))
	}
	templates := map[string]string{}
	if t, ok := top["templates"]; ok && string(t) != "null" {
		if err := json.Unmarshal(t, &templates); err != nil {
			return nil, fmt.Errorf("templates: %v", err)
		}
	}
	var refs map[string]json.RawMessage
	if r, ok := top["refs"]; ok {
		if err := json.Unmarshal(r, &refs); err != nil {
			return nil, fmt.Errorf("refs: %v", err)
		}
	} else {
		return nil, fmt.Errorf("version 1 reference set without \"refs\"")
	}
	for k, v := range refs {
		if err := b.addRaw(k, v, templates); err != nil {
			return nil, err
		}
	}
	// Generated keys after "refs": where both name a key, fsspec keeps
	// the generator's.
	if g, ok := top["gen"]; ok && string(g) != "null" {
		if err := b.generate(g, templates); err != nil {
			return nil, fmt.Errorf("gen: %w", err)
		}
	}
	return b.set(), nil
}

// addRaw adds one "refs" entry: a string (inline, "base64:" for binary) or
// a list [url] / [url, offset, length].
func (b *builder) addRaw(key string, v json.RawMessage, templates map[string]string) error {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return fmt.Errorf("refs[%q]: empty value", key)
	}
	switch v[0] {
	case '"':
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("refs[%q]: %v", key, err)
		}
		data, err := inlineBytes(s)
		if err != nil {
			return fmt.Errorf("refs[%q]: %v", key, err)
		}
		return b.add(key, ref{url: -1, data: data})
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(v, &parts); err != nil {
			return fmt.Errorf("refs[%q]: %v", key, err)
		}
		if len(parts) != 1 && len(parts) != 3 {
			return fmt.Errorf("refs[%q]: a list of %d items (want [url] or [url, offset, length])", key, len(parts))
		}
		var u string
		if err := json.Unmarshal(parts[0], &u); err != nil {
			return fmt.Errorf("refs[%q]: url is not a string", key)
		}
		u, err := b.render(u, templates)
		if err != nil {
			return fmt.Errorf("refs[%q]: url: %w", key, err)
		}
		r := ref{url: b.intern(u), n: -1}
		if len(parts) == 3 {
			off, err1 := strconv.ParseInt(string(parts[1]), 10, 64)
			n, err2 := strconv.ParseInt(string(parts[2]), 10, 64)
			if err1 != nil || err2 != nil || off < 0 || n < 0 {
				return fmt.Errorf("refs[%q]: offset %s and length %s are not non-negative integers", key, parts[1], parts[2])
			}
			r.off, r.n = off, n
		}
		return b.add(key, r)
	case '{':
		// A metadata document given as JSON rather than a string (some
		// writers do this): its bytes are the document.
		var m map[string]any
		if err := json.Unmarshal(v, &m); err != nil {
			return fmt.Errorf("refs[%q]: %v", key, err)
		}
		return b.add(key, ref{url: -1, data: append([]byte(nil), v...)})
	case 'n':
		return nil // null: a deleted key
	}
	return fmt.Errorf("refs[%q]: %.40s is neither a string nor a list", key, v)
}

// inlineBytes decodes an inline value: "base64:..." is binary, any other
// string stands for its UTF-8 bytes (kerchunk inlines only ASCII that way).
func inlineBytes(s string) ([]byte, error) {
	if rest, ok := strings.CutPrefix(s, "base64:"); ok {
		b, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return nil, fmt.Errorf("bad base64: %v", err)
		}
		return b, nil
	}
	return []byte(s), nil
}

// render substitutes "{{name}}" template references in a URL, as fsspec
// does when the set has templates: a name that is none refuses the set.
// Many keys name one URL: it is rendered once.
func (b *builder) render(u string, templates map[string]string) (string, error) {
	if len(templates) == 0 || !strings.Contains(u, "{{") {
		return u, nil
	}
	if r, ok := b.rendered[u]; ok {
		return r, nil
	}
	t, err := parseTemplate(u, templates)
	if err != nil {
		return "", err
	}
	r, err := t.render(nil)
	if err != nil {
		return "", err
	}
	b.rendered[u] = r
	return r, nil
}
