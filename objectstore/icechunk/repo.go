package icechunk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	flatbuffers "github.com/google/flatbuffers/go"
	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/icechunk/format"
)

// The binary header every Icechunk metadata file starts with: magic,
// the writer's name (24 bytes, space padded), spec version, file type,
// compression.
var magic = []byte("ICE\U0001F9CACHUNK")

const (
	headerLen = 12 + 24 + 3

	fileSnapshot = 1
	fileManifest = 2
	fileRepo     = 6

	compressNone = 0
	compressZstd = 1

	// maxMetadataFile bounds a snapshot, manifest or repo file, compressed
	// and decompressed, against hostile input.
	maxMetadataFile = 1 << 30
)

// SpecVersions are the Icechunk spec versions read.
var SpecVersions = []int{1, 2}

// ErrSpecVersion is returned (wrapped) for a repository written with a
// spec version zarrfs does not read.
var ErrSpecVersion = errors.New("Icechunk spec version not read")

// ErrNoRef is returned (wrapped) when the branch, tag or snapshot asked
// for does not exist.
var ErrNoRef = errors.New("no such branch, tag or snapshot")

// errCorrupt is wrapped for a metadata file that cannot be parsed: data
// that is not what its format says (codec.ErrCorrupt).
var errCorrupt = fmt.Errorf("Icechunk metadata: %w", codec.ErrCorrupt)

var zstdDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxMetadataFile))

// readFile reads and unpacks a metadata file: its spec version and the
// flatbuffers payload.
func readFile(ctx context.Context, st objectstore.Store, key string, want byte) (int, []byte, error) {
	b, err := objectstore.GetLimit(ctx, st, key, maxMetadataFile)
	if err != nil {
		return 0, nil, err
	}
	spec, payload, err := unpack(b, want)
	if err != nil {
		return spec, nil, fmt.Errorf("%s/%s: %w", strings.TrimSuffix(st.ID(), "/"), key, err)
	}
	return spec, payload, nil
}

func unpack(b []byte, want byte) (int, []byte, error) {
	if len(b) < headerLen || !bytes.Equal(b[:12], magic) {
		return 0, nil, fmt.Errorf("%w: not an Icechunk file (no magic bytes)", errCorrupt)
	}
	spec := int(b[36])
	if spec != 1 && spec != 2 {
		return spec, nil, fmt.Errorf("%w: spec version %d (zarrfs reads %v)", ErrSpecVersion, spec, SpecVersions)
	}
	if b[37] != want {
		return spec, nil, fmt.Errorf("%w: file type %d, want %d", errCorrupt, b[37], want)
	}
	body := b[headerLen:]
	switch b[38] {
	case compressNone:
	case compressZstd:
		out, err := zstdDecoder.DecodeAll(body, nil)
		if err != nil {
			return spec, nil, fmt.Errorf("%w: zstd: %v", errCorrupt, err)
		}
		body = out
	default:
		return spec, nil, fmt.Errorf("%w: compression %d", errCorrupt, b[38])
	}
	if len(body) < 8 {
		return spec, nil, fmt.Errorf("%w: %d-byte payload", errCorrupt, len(body))
	}
	return spec, body, nil
}

// guard turns a panic of the generated readers (an offset out of range in
// a damaged file) into an error.
func guard(err *error, what string) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %s: %v", errCorrupt, what, r)
	}
}

// crockford is Crockford's base 32 alphabet, in which ids name files.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// encodeID encodes an id as its file name: Crockford base 32, upper case,
// no padding, zero bits appended to a multiple of 5.
func encodeID(b []byte) string {
	var out strings.Builder
	var acc uint32
	n := 0
	for _, x := range b {
		acc = acc<<8 | uint32(x)
		n += 8
		for n >= 5 {
			out.WriteByte(crockford[(acc>>(n-5))&31])
			n -= 5
		}
	}
	if n > 0 {
		out.WriteByte(crockford[(acc<<(5-n))&31])
	}
	return out.String()
}

// isSnapshotID reports whether s has the form of an encoded 12-byte id.
func isSnapshotID(s string) bool {
	if len(s) != 20 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune(crockford, c) {
			return false
		}
	}
	return true
}

func id12(o *format.ObjectId12) []byte {
	if o == nil {
		return nil
	}
	return []byte{o.B0(), o.B1(), o.B2(), o.B3(), o.B4(), o.B5(), o.B6(), o.B7(), o.B8(), o.B9(), o.B10(), o.B11()}
}

func id8(o *format.ObjectId8) []byte {
	if o == nil {
		return nil
	}
	return []byte{o.B0(), o.B1(), o.B2(), o.B3(), o.B4(), o.B5(), o.B6(), o.B7()}
}

// specOf returns the spec version of the repository in st: 2 when it has
// a repo info file, 1 when it has refs.
func specOf(ctx context.Context, st objectstore.Store) (int, []byte, error) {
	spec, repo, err := readFile(ctx, st, "repo", fileRepo)
	switch {
	case err == nil:
		return spec, repo, nil
	case !objectstore.IsNotFound(err):
		return spec, nil, err
	}
	if names, err := st.List(ctx, "refs"); err == nil && len(names) > 0 {
		return 1, nil, nil
	}
	return 0, nil, fmt.Errorf("%s: not an Icechunk repository (no repo file, no refs)", st.ID())
}

// resolveRef returns the snapshot id (encoded) that ref names: a branch,
// else a tag, else a snapshot id.
func resolveRef(ctx context.Context, st objectstore.Store, spec int, repo []byte, ref string) (id string, err error) {
	if spec == 1 {
		for _, kind := range []string{"branch.", "tag."} {
			if strings.ContainsAny(ref, "/\\") || ref == "" || ref == "." || ref == ".." {
				break
			}
			b, err := objectstore.GetLimit(ctx, st, "refs/"+kind+ref+"/ref.json", 1<<20)
			if objectstore.IsNotFound(err) {
				continue
			}
			if err != nil {
				return "", err
			}
			if kind == "tag." {
				if _, err := st.Get(ctx, "refs/tag."+ref+"/ref.json.deleted"); err == nil {
					continue // a deleted tag
				}
			}
			var r struct {
				Snapshot string `json:"snapshot"`
			}
			if err := json.Unmarshal(b, &r); err != nil || !isSnapshotID(r.Snapshot) {
				return "", fmt.Errorf("%s/refs/%s%s/ref.json: %w: not a snapshot reference", st.ID(), kind, ref, errCorrupt)
			}
			return r.Snapshot, nil
		}
		if isSnapshotID(ref) {
			if _, err := st.GetRange(ctx, "snapshots/"+ref, 0, 1); err == nil {
				return ref, nil
			}
		}
		return "", fmt.Errorf("%s: ref %q: %w", st.ID(), ref, ErrNoRef)
	}
	defer guard(&err, "repo")
	r := format.GetRootAsRepo(repo, 0)
	snap := func(i uint32) string {
		var si format.SnapshotInfo
		if int(i) >= r.SnapshotsLength() || !r.Snapshots(&si, int(i)) {
			return ""
		}
		return encodeID(id12(si.Id(nil)))
	}
	find := func(n int, get func(*format.Ref, int) bool) string {
		var x format.Ref
		i := sort.Search(n, func(i int) bool { get(&x, i); return string(x.Name()) >= ref })
		if i < n && get(&x, i) && string(x.Name()) == ref {
			return snap(x.SnapshotIndex())
		}
		return ""
	}
	if id := find(r.BranchesLength(), r.Branches); id != "" {
		return id, nil
	}
	if id := find(r.TagsLength(), r.Tags); id != "" {
		return id, nil
	}
	if isSnapshotID(ref) {
		for i := 0; i < r.SnapshotsLength(); i++ {
			if snap(uint32(i)) == ref {
				return ref, nil
			}
		}
	}
	return "", fmt.Errorf("%s: ref %q: %w", st.ID(), ref, ErrNoRef)
}

// node is one array or group of a snapshot.
type node struct {
	path      string // store path: "" for the root, "a/b"
	id        string // the 8-byte node id, as bytes
	doc       []byte // zarr.json
	array     bool
	manifests []manifestRef
	// Chunk keys of an array: prefix "c" and separator, from its
	// chunk_key_encoding.
	keyPrefix, keySep string
	rank              int
}

type manifestRef struct {
	id     string // encoded file name
	lo, hi []uint32
}

// snapshot is a parsed snapshot: its nodes by store path.
type snapshot struct {
	id    string
	nodes map[string]*node
	paths []string // sorted
}

func loadSnapshot(ctx context.Context, st objectstore.Store, id string) (_ *snapshot, err error) {
	_, payload, err := readFile(ctx, st, "snapshots/"+id, fileSnapshot)
	if err != nil {
		return nil, err
	}
	defer guard(&err, "snapshots/"+id)
	fs := format.GetRootAsSnapshot(payload, 0)
	s := &snapshot{id: id, nodes: map[string]*node{}}
	var ns format.NodeSnapshot
	for i := 0; i < fs.NodesLength(); i++ {
		if !fs.Nodes(&ns, i) {
			continue
		}
		p := string(ns.Path())
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("%w: node path %q", errCorrupt, p)
		}
		sp := strings.TrimPrefix(p, "/")
		if sp != "" {
			c, err := objectstore.CleanKey(sp, false)
			if err != nil || c != sp {
				return nil, fmt.Errorf("%w: node path %q", errCorrupt, p)
			}
		}
		n := &node{path: sp, id: string(id8(ns.Id(nil))), doc: append([]byte(nil), ns.UserDataBytes()...)}
		var tbl flatbuffers.Table
		if ns.NodeDataType() == format.NodeDataArray && ns.NodeData(&tbl) {
			var a format.ArrayNodeData
			a.Init(tbl.Bytes, tbl.Pos)
			n.array = true
			if err := n.parseArray(&a); err != nil {
				return nil, fmt.Errorf("node %s: %w", p, err)
			}
		}
		s.nodes[sp] = n
		s.paths = append(s.paths, sp)
	}
	sort.Strings(s.paths)
	return s, nil
}

func (n *node) parseArray(a *format.ArrayNodeData) error {
	var mr format.ManifestRef
	var ext format.ChunkIndexRange
	for i := 0; i < a.ManifestsLength(); i++ {
		if !a.Manifests(&mr, i) {
			continue
		}
		m := manifestRef{id: encodeID(id12(mr.ObjectId(nil)))}
		for d := 0; d < mr.ExtentsLength(); d++ {
			mr.Extents(&ext, d)
			m.lo = append(m.lo, ext.From())
			m.hi = append(m.hi, ext.To())
		}
		n.manifests = append(n.manifests, m)
	}
	var meta struct {
		Shape            []int64 `json:"shape"`
		ChunkKeyEncoding struct {
			Name          string `json:"name"`
			Configuration struct {
				Separator string `json:"separator"`
			} `json:"configuration"`
		} `json:"chunk_key_encoding"`
	}
	if err := json.Unmarshal(n.doc, &meta); err != nil {
		return fmt.Errorf("%w: zarr.json: %v", errCorrupt, err)
	}
	n.rank = len(meta.Shape)
	n.keySep = meta.ChunkKeyEncoding.Configuration.Separator
	switch meta.ChunkKeyEncoding.Name {
	case "default", "":
		n.keyPrefix = "c"
		if n.keySep == "" {
			n.keySep = "/"
		}
	case "v2":
		if n.keySep == "" {
			n.keySep = "."
		}
	default:
		// zarr marks the array unsupported from its zarr.json; its
		// chunks are not found here.
	}
	return nil
}

// chunkIndex parses a chunk key (below the array) into coordinates.
func (n *node) chunkIndex(rest string) ([]uint32, bool) {
	if n.keyPrefix != "" {
		r, ok := strings.CutPrefix(rest, n.keyPrefix)
		if !ok {
			return nil, false
		}
		if n.rank == 0 {
			return []uint32{}, r == ""
		}
		if r, ok = strings.CutPrefix(r, n.keySep); !ok {
			return nil, false
		}
		rest = r
	} else if n.rank == 0 {
		return []uint32{}, rest == "0"
	}
	parts := strings.Split(rest, n.keySep)
	if len(parts) != n.rank {
		return nil, false
	}
	out := make([]uint32, len(parts))
	for i, p := range parts {
		var x uint64
		if p == "" || len(p) > 10 || (len(p) > 1 && p[0] == '0') {
			return nil, false
		}
		for _, c := range p {
			if c < '0' || c > '9' {
				return nil, false
			}
			x = x*10 + uint64(c-'0')
		}
		if x > 1<<32-1 {
			return nil, false
		}
		out[i] = uint32(x)
	}
	return out, true
}

func (n *node) chunkKey(idx []uint32) string {
	parts := make([]string, 0, len(idx)+1)
	if n.keyPrefix != "" {
		parts = append(parts, n.keyPrefix)
	}
	for _, x := range idx {
		parts = append(parts, fmt.Sprint(x))
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, n.keySep)
}

// manifestFor returns the manifest whose extent holds idx (false: none,
// a chunk never written). Two that both hold it (overlapping extents)
// are an error: which one has the chunk cannot be told.
func (n *node) manifestFor(idx []uint32) (manifestRef, bool, error) {
	var found *manifestRef
	for i := range n.manifests {
		m := &n.manifests[i]
		if !m.holds(idx) {
			continue
		}
		if found != nil {
			return manifestRef{}, false, fmt.Errorf("%w: chunk %v of array %q lies in the extents of manifests %s and %s", errCorrupt, idx, "/"+n.path, found.id, m.id)
		}
		found = m
	}
	if found == nil {
		return manifestRef{}, false, nil
	}
	return *found, true, nil
}

// holds reports whether the manifest's extent holds chunk idx.
func (m *manifestRef) holds(idx []uint32) bool {
	if len(m.lo) != len(idx) {
		return false
	}
	for d, x := range idx {
		if x < m.lo[d] || x >= m.hi[d] {
			return false
		}
	}
	return true
}
