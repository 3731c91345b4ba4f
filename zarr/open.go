package zarr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/ratelog"
	"github.com/zarrfs/zarrfs/objectstore"
)

// Open reads the store's metadata: a v3 or v2 group (consolidated or not) or
// a single array at the root. It fails when the root itself cannot be read
// or parsed, or when the metadata passes Options.Limits in all; an array
// that cannot be read is kept with Unsupported set, and logged with one
// warning that no rate limit holds back (internal/ratelog).
func Open(ctx context.Context, store objectstore.Store, opts Options) (*Hierarchy, error) {
	lim, err := opts.Limits.withDefaults()
	if err != nil {
		return nil, err
	}
	opts.Limits = lim
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Fetchers < 0 {
		return nil, fmt.Errorf("zarr: Options.Fetchers %d: want 0 (16) or more", opts.Fetchers)
	}
	if opts.Fetchers == 0 {
		opts.Fetchers = 16
	}
	if opts.LazyVersions == 0 {
		opts.LazyVersions = DefaultLazyVersions
	}
	h := &Hierarchy{Store: store, Groups: map[string]map[string]any{}, opts: opts, stats: opts.Stats}
	if h.stats == nil {
		h.stats = &Stats{}
	}
	if opts.Decoder == nil {
		// No workers the caller did not ask for: chunks decode in the
		// goroutine that reads them.
		h.opts.Decoder = codec.Inline{}
	}
	h.mem = opts.Memory
	if h.mem == nil {
		h.mem, _ = h.opts.Decoder.(codec.HostMemory)
	}
	h.host = opts.Host
	if opts.ChunkCacheBytes >= 0 {
		h.chunks = newChunkCache(opts.ChunkCacheBytes, h.host)
	}
	w := &walker{h: h, ctx: ctx, lim: lim}
	if err := w.root(); err != nil {
		h.Close()
		return nil, err
	}
	sort.Slice(h.Arrays, func(i, j int) bool { return h.Arrays[i].Path < h.Arrays[j].Path })
	// Every array left out is named, however many: the count is bounded
	// by Limits.Nodes, and a rate limit would leave some unnamed.
	wctx := ratelog.Unlimited(ctx)
	for _, a := range h.Arrays {
		a.h = h
		if a.Unsupported != "" {
			opts.Logger.WarnContext(wctx, "array left out", "array", a.Path, "reason", a.Unsupported)
		}
	}
	return h, nil
}

// Close drops the decoded-chunk cache. The store and the decoder belong to
// the caller. Reads must be done.
func (h *Hierarchy) Close() error {
	if h.chunks != nil {
		h.chunks.reset()
	}
	return nil
}

// Memory returns the memory reads borrow buffers from (Options.Memory),
// nil for none. Fills that decode into a buffer of their own
// borrow from it too, so the GPU writes it without staging.
func (h *Hierarchy) Memory() codec.HostMemory { return h.mem }

// Array returns the array at path, or nil.
func (h *Hierarchy) Array(path string) *Array {
	i := sort.Search(len(h.Arrays), func(i int) bool { return h.Arrays[i].Path >= path })
	if i < len(h.Arrays) && h.Arrays[i].Path == path {
		return h.Arrays[i]
	}
	return nil
}

type walker struct {
	h     *Hierarchy
	ctx   context.Context
	lim   MetadataLimits
	bytes int64 // of the documents read so far
	nodes int   // arrays and groups found so far
	// consolidated is the key of the consolidated metadata being read
	// ("" while walking the arrays' own documents).
	consolidated string
}

// limitError is a metadata limit that a document or the tree passed. A
// fatal one (the tree's total, its node count) fails Open; the others
// leave their node out.
type limitError struct {
	msg   string
	fatal bool
}

func (e *limitError) Error() string        { return e.msg }
func (e *limitError) Is(target error) bool { return target == ErrMetadataLimit }

func (w *walker) id() string { return strings.TrimSuffix(w.h.Store.ID(), "/") }

// node counts one more array or group, failing past Limits.Nodes.
func (w *walker) node(p string) error {
	w.nodes++
	if w.nodes > w.lim.Nodes {
		return &limitError{fatal: true, msg: fmt.Sprintf("%s: more than %d arrays and groups (at %q), past the metadata limit", w.id(), w.lim.Nodes, p)}
	}
	return nil
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// get reads an optional metadata key: nil, nil when it does not exist (an
// empty object is a document, an empty one). A document larger than
// Limits.Document is refused before it is read; one that takes the bytes
// read past Limits.Total fails Open.
func (w *walker) get(key string) ([]byte, error) {
	if err := w.ctx.Err(); err != nil {
		return nil, err
	}
	b, err := objectstore.GetLimit(w.ctx, w.h.Store, key, w.lim.Document)
	if objectstore.IsNotFound(err) {
		return nil, nil
	}
	if errors.Is(err, objectstore.ErrTooLarge) || (err == nil && int64(len(b)) > w.lim.Document) {
		// The second: a store that does not honour the size limit.
		return nil, &limitError{msg: fmt.Sprintf("%s/%s is larger than the metadata limit of %s per document", w.id(), key, human(w.lim.Document))}
	}
	if err != nil {
		return nil, err
	}
	w.bytes += int64(len(b))
	if w.bytes > w.lim.Total {
		return nil, &limitError{fatal: true, msg: fmt.Sprintf("%s/%s takes the metadata read past the limit of %s in all", w.id(), key, human(w.lim.Total))}
	}
	return nonNil(b), nil
}

func (w *walker) root() error {
	id := w.id()
	if err := w.node(""); err != nil {
		return err
	}
	doc, err := w.get("zarr.json")
	if err != nil {
		return err
	}
	if doc != nil {
		var n v3Node
		if err := parseJSON(doc, &n); err != nil {
			return fmt.Errorf("%s/zarr.json: %v", id, err)
		}
		switch n.NodeType {
		case "array":
			w.addV3Array("", doc, &n)
			return nil
		case "group":
			w.h.Groups[""] = w.groupAttrs(n.Attributes)
			if n.Consolidated != nil && n.Consolidated.Metadata != nil {
				return w.consolidatedV3(n.Consolidated.Metadata)
			}
			return unlisted(w.walkV3("", 0), id+"/zarr.json: a group without consolidated_metadata")
		}
		return fmt.Errorf("%s/zarr.json: node_type %q is neither array nor group", id, n.NodeType)
	}
	if zm, err := w.get(".zmetadata"); err != nil {
		return err
	} else if zm != nil {
		return w.consolidatedV2(zm)
	}
	if g, err := w.get(".zgroup"); err != nil {
		return err
	} else if g != nil {
		attrs, err := w.get(".zattrs")
		if err != nil {
			return err
		}
		w.h.Groups[""] = w.groupAttrs(attrs)
		return unlisted(w.walkV2("", 0), id+": a group without .zmetadata")
	}
	if a, err := w.get(".zarray"); err != nil {
		return err
	} else if a != nil {
		attrs, err := w.get(".zattrs")
		if err != nil {
			return err
		}
		w.addV2Array("", a, attrs)
		return nil
	}
	if w.h.opts.EmptyWhenGone {
		w.h.Vanished = true
		return nil
	}
	return fmt.Errorf("%s: %w (zarr.json, .zgroup, .zarray or .zmetadata) at the root", id, ErrNoMetadata)
}

// errConsolidate says what a store that cannot be listed (served over
// HTTP) needs for its tree to be known.
var errConsolidate = errors.New("consolidate its metadata (zarr.consolidate_metadata) to read it without listings")

// unlisted explains a walk of the root group that failed because the
// store cannot list (what: the group, and what it lacks).
func unlisted(err error, what string) error {
	if errors.Is(err, objectstore.ErrNoListing) {
		return fmt.Errorf("%s, and %w: %w", what, objectstore.ErrNoListing, errConsolidate)
	}
	return err
}

func attrsOrEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

func (w *walker) unsupported(a *Array, err error) {
	a.Unsupported = err.Error()
	if !errors.Is(err, codec.ErrUnsupported) && !errors.Is(err, ErrMetadataLimit) {
		a.Unsupported = "invalid metadata: " + a.Unsupported
	}
	a.Unsupported = strings.TrimPrefix(a.Unsupported, codec.ErrUnsupported.Error()+": ")
	w.h.Arrays = append(w.h.Arrays, a)
}

func (w *walker) addV3Array(path string, doc []byte, n *v3Node) {
	a := &Array{Path: path, ZarrFormat: 3, MetaHash: hashDocs(doc), doc: doc, consolidated: w.consolidated}
	p, fill, err := parseV3Array(a, n, w.lim)
	if err != nil {
		w.unsupported(a, err)
		return
	}
	a.pipe, a.fill = p, fill
	w.h.Arrays = append(w.h.Arrays, a)
}

func (w *walker) addV2Array(path string, doc, attrsDoc []byte) {
	a := &Array{Path: path, ZarrFormat: 2, MetaHash: hashDocs(doc, attrsDoc), doc: doc, consolidated: w.consolidated}
	var m v2Array
	if err := parseJSON(doc, &m); err != nil {
		w.unsupported(a, fmt.Errorf(".zarray: %v", err))
		return
	}
	attrs, leftOut := w.attrs(attrsDoc, "_ARRAY_DIMENSIONS")
	a.AttributesLeftOut = leftOut
	p, fill, err := parseV2Array(a, &m, attrs)
	if err != nil {
		w.unsupported(a, err)
		return
	}
	a.pipe, a.fill = p, fill
	w.h.Arrays = append(w.h.Arrays, a)
}

// nodeError decides what a failure to read one node below the root means:
// a failure of the source as a whole (transient, cancelled, the source
// down) fails the open; anything about the node itself (not a regular
// file, a link leaving the store, a refused permission) leaves that node
// out as unsupported, with the reason, and the walk goes on.
func (w *walker) nodeError(p string, format int, what string, err error) error {
	if objectstore.IsTransient(err) || errors.Is(err, objectstore.ErrSourceDown) || w.ctx.Err() != nil {
		return err
	}
	var le *limitError
	if errors.As(err, &le) {
		if le.fatal {
			return err
		}
		w.unsupported(&Array{Path: p, ZarrFormat: format}, err)
		return nil
	}
	w.unsupported(&Array{Path: p, ZarrFormat: format}, fmt.Errorf("%s: %w", what, unwrapStoreError(err)))
	return nil
}

// tooDeep leaves out group p, depth levels below the root, past
// Limits.Depth: it is named, with the limit, and nothing below is read.
func (w *walker) tooDeep(p string, format, depth int) {
	w.unsupported(&Array{Path: p, ZarrFormat: format}, &limitError{msg: fmt.Sprintf(
		"group %d levels below the root, past the metadata limit of %d: nothing below it is read", depth, w.lim.Depth)})
}

// unwrapStoreError drops the store's name and key from err, which the
// unsupported entry already names.
func unwrapStoreError(err error) error {
	var se *objectstore.Error
	if errors.As(err, &se) {
		return se.Err
	}
	return err
}

// walkV3 lists dir and visits every child holding a zarr.json.
func (w *walker) walkV3(dir string, depth int) error {
	dirs, err := w.childDirs(dir)
	if err != nil {
		if dir == "" {
			return err
		}
		return w.nodeError(dir, 3, "list", err)
	}
	for _, p := range dirs {
		doc, err := w.get(p + "/zarr.json")
		if err != nil {
			if err := w.nodeError(p, 3, "zarr.json", err); err != nil {
				return err
			}
			continue
		}
		if doc == nil {
			continue
		}
		if err := w.node(p); err != nil {
			return err
		}
		var n v3Node
		if err := parseJSON(doc, &n); err != nil {
			w.unsupported(&Array{Path: p, ZarrFormat: 3}, fmt.Errorf("zarr.json: %v", err))
			continue
		}
		switch n.NodeType {
		case "array":
			w.addV3Array(p, doc, &n)
		case "group":
			if depth+1 > w.lim.Depth {
				w.tooDeep(p, 3, depth+1)
				continue
			}
			w.h.Groups[p] = w.groupAttrs(n.Attributes)
			if err := w.walkV3(p, depth+1); err != nil {
				return err
			}
		default:
			w.unsupported(&Array{Path: p, ZarrFormat: 3}, fmt.Errorf("zarr.json: node_type %q is neither array nor group", n.NodeType))
		}
	}
	return nil
}

// validPath reports whether a node path from consolidated metadata is a
// clean relative path: no empty, "." or ".." segments, no leading or
// trailing slash. Anything else could make the mount's tree loop or escape.
func validPath(p string) bool {
	if p == "" {
		return true
	}
	if strings.ContainsAny(p, "\x00\\") {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

func (w *walker) badPath(p string) {
	w.h.opts.Logger.Warn("consolidated metadata entry ignored", "path", p, "reason", "not a clean relative path")
}

func (w *walker) consolidatedV3(md map[string]json.RawMessage) error {
	w.consolidated = "zarr.json"
	for p, raw := range md {
		if !validPath(p) {
			w.badPath(p)
			continue
		}
		if err := w.node(p); err != nil {
			return err
		}
		var n v3Node
		if err := parseJSON(raw, &n); err != nil {
			w.unsupported(&Array{Path: p, ZarrFormat: 3}, fmt.Errorf("consolidated metadata: %v", err))
			continue
		}
		switch n.NodeType {
		case "array":
			w.addV3Array(p, raw, &n)
		case "group":
			w.h.Groups[p] = w.groupAttrs(n.Attributes)
		}
	}
	return nil
}

// attrs parses attributes (a v2 .zattrs document or a v3 "attributes"
// member; nil when absent) within Limits.Attributes, the members named in
// first before the others, and names those left out. Broken attributes
// never hide data: they read as none.
func (w *walker) attrs(raw []byte, first ...string) (map[string]any, []string) {
	m, out, err := parseAttributes(raw, w.lim.Attributes, first...)
	if err != nil {
		return map[string]any{}, nil
	}
	return m, out
}

// groupAttrs is attrs for a group, which keeps no list of those left out.
func (w *walker) groupAttrs(raw []byte) map[string]any {
	m, _ := w.attrs(raw)
	return m
}

// childDirs lists the subdirectories of dir, as paths from the store root.
func (w *walker) childDirs(dir string) ([]string, error) {
	if err := w.ctx.Err(); err != nil {
		return nil, err
	}
	children, err := w.h.Store.List(w.ctx, dir)
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, c := range children {
		if name, ok := strings.CutSuffix(c, "/"); ok {
			dirs = append(dirs, join(dir, name))
		}
	}
	return dirs, nil
}

func (w *walker) walkV2(dir string, depth int) error {
	dirs, err := w.childDirs(dir)
	if err != nil {
		if dir == "" {
			return err
		}
		return w.nodeError(dir, 2, "list", err)
	}
	for _, p := range dirs {
		doc, err := w.get(p + "/.zarray")
		if err != nil {
			if err := w.nodeError(p, 2, ".zarray", err); err != nil {
				return err
			}
			continue
		}
		isGroup := false
		if doc == nil {
			g, err := w.get(p + "/.zgroup")
			if err != nil {
				if err := w.nodeError(p, 2, ".zgroup", err); err != nil {
					return err
				}
				continue
			}
			if isGroup = g != nil; !isGroup {
				continue // neither array nor group
			}
		}
		if err := w.node(p); err != nil {
			return err
		}
		if isGroup && depth+1 > w.lim.Depth {
			w.tooDeep(p, 2, depth+1)
			continue
		}
		attrs, err := w.get(p + "/.zattrs")
		if err != nil {
			if err := w.nodeError(p, 2, ".zattrs", err); err != nil {
				return err
			}
			continue
		}
		if !isGroup {
			w.addV2Array(p, doc, attrs)
			continue
		}
		w.h.Groups[p] = w.groupAttrs(attrs)
		if err := w.walkV2(p, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// consolidatedMembers parses consolidated metadata as Open reads it: the
// members of a v3 root zarr.json's consolidated_metadata (format 3), keyed
// by node path, or of a v2 .zmetadata's metadata (format 2), keyed by
// document ("t/.zarray"). Nil members: the document holds none.
func consolidatedMembers(doc []byte, format int) (map[string]json.RawMessage, error) {
	if format == 2 {
		var zm struct {
			Metadata map[string]json.RawMessage `json:"metadata"`
		}
		err := parseJSON(doc, &zm)
		return zm.Metadata, err
	}
	var n v3Node
	if err := parseJSON(doc, &n); err != nil || n.Consolidated == nil {
		return nil, err
	}
	return n.Consolidated.Metadata, nil
}

func (w *walker) consolidatedV2(doc []byte) error {
	members, err := consolidatedMembers(doc, 2)
	if err != nil {
		return fmt.Errorf("%s/.zmetadata: %v", strings.TrimSuffix(w.h.Store.ID(), "/"), err)
	}
	w.consolidated = ".zmetadata"
	for key, raw := range members {
		dir, base := "", key
		if i := strings.LastIndex(key, "/"); i >= 0 {
			dir, base = key[:i], key[i+1:]
		}
		if !validPath(dir) {
			w.badPath(key)
			continue
		}
		if (base == ".zgroup" || base == ".zarray") && dir != "" { // root() counted the root
			if err := w.node(dir); err != nil {
				return err
			}
		}
		switch base {
		case ".zgroup":
			w.h.Groups[dir] = w.groupAttrs(members[join(dir, ".zattrs")])
		case ".zarray":
			w.addV2Array(dir, raw, members[join(dir, ".zattrs")])
		}
	}
	return nil
}
