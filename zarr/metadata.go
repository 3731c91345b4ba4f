package zarr

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/zarrfs/zarrfs/codec"
)

// maxDims bounds the dimensionality accepted from metadata.
const maxDims = 32

// maxArrayBytes bounds the decoded size of a whole array, so that sizes
// computed from shapes (file sizes, offsets) never overflow.
const maxArrayBytes = 1 << 60

// maxChunkBytes bounds the decoded size of one unit of decompression (a
// chunk, or an inner chunk of a shard; a shard itself is never decoded
// whole): metadata that asks for more is refused rather than allocated.
const maxChunkBytes = 1 << 30

// pipeline is a parsed codec chain, in encode order.
type pipeline struct {
	// transpose is the permutation applied before serialisation: the
	// encoded array's dimension i is the decoded array's dimension
	// transpose[i]. Nil means none (C order).
	transpose []int
	// bigEndian is the serialised byte order (bytes codec, v2 ">").
	bigEndian bool
	// shard is set when the array-to-bytes codec is sharding_indexed.
	shard *shardSpec
	// bb are the bytes-to-bytes codecs in encode order.
	bb []bbCodec
}

type bbCodec struct {
	crc32c bool
	name   codec.Name
}

type shardSpec struct {
	inner        []int64 // inner chunk shape
	codecs       *pipeline
	index        *pipeline // index codecs (bytes + optional crc32c)
	indexAtStart bool
}

// parseJSON decodes strictly enough to catch garbage but keeps numbers exact.
func parseJSON(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		if se, ok := err.(*json.SyntaxError); ok {
			return fmt.Errorf("invalid JSON at offset %d: %v", se.Offset, se)
		}
		return fmt.Errorf("invalid JSON: %v", err)
	}
	// One document, one value, as zarr-python reads it: anything but
	// white space after it is refused, not ignored.
	end := d.InputOffset()
	if _, err := d.Token(); err != io.EOF {
		return fmt.Errorf("invalid JSON: data after the value that ends at offset %d", end)
	}
	return nil
}

func hashDocs(docs ...[]byte) string {
	h := sha256.New()
	for _, d := range docs {
		fmt.Fprintf(h, "%d:", len(d))
		h.Write(d)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func toInt64s(v any, what string) ([]int64, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s: expected a list of integers", what)
	}
	if len(list) > maxDims {
		return nil, fmt.Errorf("%w: %s has %d dimensions (at most %d)", codec.ErrUnsupported, what, len(list), maxDims)
	}
	out := make([]int64, len(list))
	for i, e := range list {
		n, ok := e.(json.Number)
		if !ok {
			return nil, fmt.Errorf("%s: element %d is not an integer", what, i)
		}
		x, err := n.Int64()
		if err != nil || x < 0 {
			return nil, fmt.Errorf("%s: element %d (%s) is not a non-negative integer", what, i, n)
		}
		out[i] = x
	}
	return out, nil
}

// checkGrid validates shape against the (outer) chunk shape, bounding the
// sizes computed from them.
func checkGrid(shape, chunks []int64, itemsize int) error {
	if len(shape) != len(chunks) {
		return fmt.Errorf("chunk shape %v does not match shape %v", chunks, shape)
	}
	total := uint64(itemsize)
	for _, s := range shape {
		hi, lo := bits.Mul64(total, uint64(s))
		if hi != 0 || lo > maxArrayBytes {
			return fmt.Errorf("%w: shape %v holds more than %d bytes", codec.ErrUnsupported, shape, uint64(maxArrayBytes))
		}
		total = lo
	}
	n := uint64(itemsize)
	for _, c := range chunks {
		if c <= 0 {
			return fmt.Errorf("chunk shape %v has a non-positive extent", chunks)
		}
		hi, lo := bits.Mul64(n, uint64(c))
		if hi != 0 || lo > maxArrayBytes {
			return fmt.Errorf("%w: chunk shape %v holds more than %d bytes", codec.ErrUnsupported, chunks, uint64(maxArrayBytes))
		}
		n = lo
	}
	return nil
}

// checkUnit bounds the decoded size of one unit of decompression.
func checkUnit(chunks []int64, itemsize int) error {
	n := int64(itemsize)
	for _, c := range chunks {
		n *= c
		if n > maxChunkBytes {
			return fmt.Errorf("%w: chunk shape %v decodes to more than %d bytes", codec.ErrUnsupported, chunks, maxChunkBytes)
		}
	}
	return nil
}

func names(list []any) []string {
	out := make([]string, len(list))
	for i, v := range list {
		if s, ok := v.(string); ok {
			out[i] = s
		}
	}
	return out
}

// checkFormat refuses a document whose zarr_format is not the number want,
// as zarr-python does: a zarr.json that says 2 (or "3", a string) is not a
// Zarr v3 document.
func checkFormat(v any, want int) error {
	if n, ok := v.(json.Number); ok {
		if f, err := n.Float64(); err == nil && f == float64(want) {
			return nil
		}
	}
	if v == nil {
		return fmt.Errorf("zarr_format missing (want %d)", want)
	}
	return fmt.Errorf("zarr_format %s (want %d)", jsonText(v), want)
}

// jsonText renders a metadata value for a message: strings quoted, so
// that "3" and 3 read differently.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil || len(b) > 64 {
		return fmt.Sprintf("%T", v)
	}
	return string(b)
}

// checkDimNames refuses dimension_names entries that are neither a string
// nor null, as zarr-python does.
func checkDimNames(list []any) error {
	for i, v := range list {
		switch v.(type) {
		case string, nil:
		default:
			return fmt.Errorf("dimension_names entry %d (%s) is neither a string nor null", i, jsonText(v))
		}
	}
	return nil
}

// ---------- Zarr v3 ----------

type v3Node struct {
	ZarrFormat          any             `json:"zarr_format"`
	NodeType            string          `json:"node_type"`
	Shape               any             `json:"shape"`
	DataType            any             `json:"data_type"`
	ChunkGrid           map[string]any  `json:"chunk_grid"`
	ChunkKeyEncoding    map[string]any  `json:"chunk_key_encoding"`
	FillValue           any             `json:"fill_value"`
	Codecs              []any           `json:"codecs"`
	Attributes          json.RawMessage `json:"attributes"`
	DimensionNames      []any           `json:"dimension_names"`
	StorageTransformers []any           `json:"storage_transformers"`
	Consolidated        *struct {
		Kind     string                     `json:"kind"`
		Metadata map[string]json.RawMessage `json:"metadata"`
	} `json:"consolidated_metadata"`
}

// parseV3Array fills a from a v3 array document. Errors wrapping
// codec.ErrUnsupported mark the array unsupported; other errors mean the document
// is malformed (also reported as unsupported by the walker, with the cause).
func parseV3Array(a *Array, n *v3Node, lim MetadataLimits) (*pipeline, []byte, error) {
	if err := checkFormat(n.ZarrFormat, 3); err != nil {
		return nil, nil, err
	}
	shape, err := toInt64s(n.Shape, "shape")
	if err != nil {
		return nil, nil, err
	}
	a.Shape = shape
	if len(n.StorageTransformers) > 0 {
		return nil, nil, fmt.Errorf("%w: storage transformers", codec.ErrUnsupported)
	}
	dtName, ok := n.DataType.(string)
	if !ok {
		return nil, nil, fmt.Errorf("%w: data type %v", codec.ErrUnsupported, n.DataType)
	}
	dt, err := ParseV3DType(dtName)
	if err != nil {
		return nil, nil, err
	}
	a.DType = dt
	if name, _ := n.ChunkGrid["name"].(string); name != "regular" {
		return nil, nil, fmt.Errorf("%w: chunk grid %q", codec.ErrUnsupported, name)
	}
	cfg, _ := n.ChunkGrid["configuration"].(map[string]any)
	chunks, err := toInt64s(cfg["chunk_shape"], "chunk_shape")
	if err != nil {
		return nil, nil, err
	}
	a.Chunks = chunks
	if err := checkGrid(shape, chunks, dt.Size); err != nil {
		return nil, nil, err
	}
	a.Dims = make([]string, len(shape))
	if n.DimensionNames != nil {
		if len(n.DimensionNames) != len(shape) {
			return nil, nil, fmt.Errorf("dimension_names has %d entries for %d dimensions", len(n.DimensionNames), len(shape))
		}
		if err := checkDimNames(n.DimensionNames); err != nil {
			return nil, nil, err
		}
		a.Dims = names(n.DimensionNames)
	}
	if a.Attributes, a.AttributesLeftOut, err = parseAttributes(n.Attributes, lim.Attributes); err != nil {
		return nil, nil, err
	}
	if err := parseKeyEncoding(a, n.ChunkKeyEncoding); err != nil {
		return nil, nil, err
	}
	a.Codecs = codecNames(n.Codecs)
	a.InnerChunks, a.InnerCodecs = innerChunks(n.Codecs)
	p, err := parseV3Codecs(n.Codecs, len(shape), dt, chunks, 0)
	if err != nil {
		return nil, nil, err
	}
	unit, data := chunks, p
	for q := p; q.shard != nil; q = q.shard.codecs {
		unit, data = q.shard.inner, q.shard.codecs
	}
	// v3 gives the byte order in the bytes codec (of the innermost
	// chunks, when sharded), not the data type: the DType carries it too,
	// so that everyone who asks the array (inspect's source dtype, the
	// device path, which leaves such chunks to the host that swaps them)
	// reads the one the chunks were written in.
	a.DType.BigEndian = data.bigEndian
	if err := checkUnit(unit, dt.Size); err != nil {
		return nil, nil, err
	}
	fill, fj, err := parseFill(n.FillValue, dt, 3)
	if err != nil {
		return nil, nil, err
	}
	a.FillValue = fj
	return p, fill, nil
}

func parseKeyEncoding(a *Array, enc map[string]any) error {
	name, _ := enc["name"].(string)
	cfg, _ := enc["configuration"].(map[string]any)
	sep, _ := cfg["separator"].(string)
	switch name {
	case "default":
		if sep == "" {
			sep = "/"
		}
		a.keyPrefix = "c"
	case "v2":
		if sep == "" {
			sep = "."
		}
	default:
		return fmt.Errorf("%w: chunk key encoding %q", codec.ErrUnsupported, name)
	}
	if sep != "/" && sep != "." {
		return fmt.Errorf("%w: chunk key separator %q", codec.ErrUnsupported, sep)
	}
	a.keySep = sep
	return nil
}

// codecNames lists codec names outermost first: the codec applied last when
// encoding (the one wrapping the stored bytes) comes first.
func codecNames(list []any) []string {
	out := make([]string, 0, len(list))
	for i := len(list) - 1; i >= 0; i-- {
		switch c := list[i].(type) {
		case string:
			out = append(out, c)
		case map[string]any:
			name, _ := c["name"].(string)
			out = append(out, name)
		}
	}
	return out
}

// innerChunks follows sharding_indexed codecs down a v3 codec list to the
// innermost chunks: their chunk_shape and codec names. It reads the JSON
// as written, so an array left out for its codecs still shows them.
func innerChunks(list []any) (shape []int64, codecs []string) {
	for depth := 0; depth <= 4; depth++ {
		var cfg map[string]any
		for _, c := range list {
			if m, ok := c.(map[string]any); ok && m["name"] == "sharding_indexed" {
				cfg, _ = m["configuration"].(map[string]any)
			}
		}
		if cfg == nil {
			return shape, codecs
		}
		s, err := toInt64s(cfg["chunk_shape"], "chunk_shape")
		if err != nil {
			return shape, codecs
		}
		inner, _ := cfg["codecs"].([]any)
		shape, codecs, list = s, codecNames(inner), inner
	}
	return shape, codecs
}

// parseV3Codecs parses a v3 codec list for arrays of the given rank, dtype and chunk shape.
func parseV3Codecs(list []any, rank int, dt DType, chunk []int64, depth int) (*pipeline, error) {
	if depth > 4 {
		return nil, fmt.Errorf("%w: sharding nested more than 4 deep", codec.ErrUnsupported)
	}
	p := &pipeline{}
	stage := 0 // 0: array->array, 1: after array->bytes
	for _, c := range list {
		var name string
		var cfg map[string]any
		switch v := c.(type) {
		case string:
			name = v
		case map[string]any:
			name, _ = v["name"].(string)
			cfg, _ = v["configuration"].(map[string]any)
		default:
			return nil, fmt.Errorf("codec entry %v is not an object", c)
		}
		switch name {
		case "transpose":
			if stage != 0 {
				return nil, fmt.Errorf("transpose after the array-to-bytes codec")
			}
			order, err := parsePerm(cfg["order"], rank)
			if err != nil {
				return nil, err
			}
			p.transpose = composePerm(p.transpose, order)
		case "bytes":
			if stage != 0 {
				return nil, fmt.Errorf("two array-to-bytes codecs")
			}
			stage = 1
			endian, _ := cfg["endian"].(string)
			switch endian {
			case "", "little":
			case "big":
				p.bigEndian = dt.Size > 1
			default:
				return nil, fmt.Errorf("bytes codec: endian %q", endian)
			}
			if endian == "" && dt.Size > 1 {
				return nil, fmt.Errorf("bytes codec: endian required for %s", dt.Name())
			}
		case "sharding_indexed":
			if stage != 0 {
				return nil, fmt.Errorf("two array-to-bytes codecs")
			}
			if chunk == nil {
				return nil, fmt.Errorf("%w: sharding_indexed inside index_codecs", codec.ErrUnsupported)
			}
			stage = 1
			s, err := parseShard(cfg, rank, dt, chunk, depth)
			if err != nil {
				return nil, err
			}
			p.shard = s
		case "gzip", "zstd", "blosc", "crc32c":
			if stage != 1 {
				return nil, fmt.Errorf("codec %q before the array-to-bytes codec", name)
			}
			if name == "crc32c" {
				p.bb = append(p.bb, bbCodec{crc32c: true})
			} else {
				if name == "blosc" {
					if err := checkBloscV3(cfg); err != nil {
						return nil, err
					}
				}
				p.bb = append(p.bb, bbCodec{name: codec.Name(name)})
			}
		default:
			if strings.HasPrefix(name, "numcodecs.") && stage == 1 { // filters.go
				c, err := numcodecsV3(name, cfg, dt)
				if err != nil {
					return nil, err
				}
				p.bb = append(p.bb, c)
				continue
			}
			return nil, fmt.Errorf("%w: codec %q", codec.ErrUnsupported, name)
		}
	}
	if stage != 1 {
		return nil, fmt.Errorf("codec list has no array-to-bytes codec")
	}
	if p.transpose != nil && p.shard != nil {
		return nil, fmt.Errorf("%w: transpose before sharding_indexed", codec.ErrUnsupported)
	}
	if p.shard != nil && len(p.bb) > 0 {
		return nil, fmt.Errorf("%w: codecs after sharding_indexed", codec.ErrUnsupported)
	}
	var err error
	if p.bb, err = foldChecksums(p.bb); err != nil {
		return nil, err
	}
	if compressions(p.bb) > 1 {
		return nil, fmt.Errorf("%w: more than one compression codec", codec.ErrUnsupported)
	}
	return p, nil
}

// checkBloscV3 refuses a v3 blosc configuration zarr-python refuses: a
// cname or shuffle outside the spec's lists. (A v2 compressor's cname only
// says how chunks were written; each chunk's header says how to read it,
// and zarr-python opens any.)
func checkBloscV3(cfg map[string]any) error {
	cn, ok := cfg["cname"]
	if !ok {
		cn = "zstd" // zarr-python's default
	}
	switch cn {
	case "lz4", "lz4hc", "blosclz", "zstd", "zlib":
	case "snappy":
		return fmt.Errorf("%w: blosc compressor snappy", codec.ErrUnsupported)
	default:
		return fmt.Errorf("blosc cname %s is not one of lz4, lz4hc, blosclz, zstd, snappy, zlib", jsonText(cfg["cname"]))
	}
	if sh, ok := cfg["shuffle"]; ok {
		switch sh {
		case "noshuffle", "shuffle", "bitshuffle":
		default:
			return fmt.Errorf("blosc shuffle %s is not one of noshuffle, shuffle, bitshuffle", jsonText(sh))
		}
	}
	return nil
}

func parseShard(cfg map[string]any, rank int, dt DType, outer []int64, depth int) (*shardSpec, error) {
	inner, err := toInt64s(cfg["chunk_shape"], "sharding_indexed chunk_shape")
	if err != nil {
		return nil, err
	}
	if len(inner) != rank {
		return nil, fmt.Errorf("sharding_indexed chunk_shape %v has the wrong rank", inner)
	}
	for i, c := range inner {
		if c <= 0 || outer[i]%c != 0 {
			return nil, fmt.Errorf("sharding_indexed chunk_shape %v does not divide the shard shape %v", inner, outer)
		}
	}
	codecs, _ := cfg["codecs"].([]any)
	ip, err := parseV3Codecs(codecs, rank, dt, inner, depth+1)
	if err != nil {
		return nil, err
	}
	idxCodecs, ok := cfg["index_codecs"].([]any)
	if !ok {
		idxCodecs = []any{map[string]any{"name": "bytes", "configuration": map[string]any{"endian": "little"}}, map[string]any{"name": "crc32c"}}
	}
	idx, err := parseV3Codecs(idxCodecs, rank+1, DType{Kind: 'u', Size: 8}, nil, depth+1)
	if err != nil {
		return nil, fmt.Errorf("index_codecs: %w", err)
	}
	if idx.shard != nil || idx.transpose != nil {
		return nil, fmt.Errorf("%w: index_codecs other than bytes and crc32c", codec.ErrUnsupported)
	}
	for _, c := range idx.bb {
		if !c.crc32c {
			return nil, fmt.Errorf("%w: compressed shard index", codec.ErrUnsupported)
		}
	}
	loc, _ := cfg["index_location"].(string)
	switch loc {
	case "", "end":
	case "start":
	default:
		return nil, fmt.Errorf("sharding_indexed index_location %q", loc)
	}
	return &shardSpec{inner: inner, codecs: ip, index: idx, indexAtStart: loc == "start"}, nil
}

func parsePerm(v any, rank int) ([]int, error) {
	if s, ok := v.(string); ok { // early drafts: "C" / "F"
		switch s {
		case "C":
			return identity(rank), nil
		case "F":
			return reversed(rank), nil
		}
		return nil, fmt.Errorf("transpose order %q", s)
	}
	list, err := toInt64s(v, "transpose order")
	if err != nil {
		return nil, err
	}
	if len(list) != rank {
		return nil, fmt.Errorf("transpose order %v has the wrong rank", list)
	}
	seen := make([]bool, rank)
	out := make([]int, rank)
	for i, x := range list {
		if x >= int64(rank) || seen[x] {
			return nil, fmt.Errorf("transpose order %v is not a permutation", list)
		}
		seen[x] = true
		out[i] = int(x)
	}
	return out, nil
}

func identity(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	return p
}

func reversed(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = n - 1 - i
	}
	return p
}

// composePerm returns the permutation of applying a then b.
func composePerm(a, b []int) []int {
	if a == nil {
		return b
	}
	out := make([]int, len(b))
	for i := range b {
		out[i] = a[b[i]]
	}
	return out
}

// ---------- Zarr v2 ----------

type v2Array struct {
	ZarrFormat         any    `json:"zarr_format"`
	Shape              any    `json:"shape"`
	Chunks             any    `json:"chunks"`
	DType              any    `json:"dtype"`
	Compressor         any    `json:"compressor"`
	FillValue          any    `json:"fill_value"`
	Order              string `json:"order"`
	Filters            []any  `json:"filters"`
	DimensionSeparator string `json:"dimension_separator"`
}

// parseV2Array fills a from a .zarray document and the .zattrs members
// parsed (walker.attrs).
func parseV2Array(a *Array, m *v2Array, attrs map[string]any) (*pipeline, []byte, error) {
	if err := checkFormat(m.ZarrFormat, 2); err != nil {
		return nil, nil, err
	}
	shape, err := toInt64s(m.Shape, "shape")
	if err != nil {
		return nil, nil, err
	}
	a.Shape = shape
	// Names first: an array left out below still shows its dimensions.
	a.Dims = make([]string, len(shape))
	if l, ok := attrs["_ARRAY_DIMENSIONS"].([]any); ok && len(l) == len(shape) {
		a.Dims = names(l)
	}
	chunks, err := toInt64s(m.Chunks, "chunks")
	if err != nil {
		return nil, nil, err
	}
	a.Chunks = chunks
	dts, ok := m.DType.(string)
	if !ok {
		return nil, nil, fmt.Errorf("%w: structured data type", codec.ErrUnsupported)
	}
	dt, err := ParseNumpyDType(dts)
	if err != nil {
		return nil, nil, err
	}
	a.DType = dt
	if err := checkGrid(shape, chunks, dt.Size); err != nil {
		return nil, nil, err
	}
	if err := checkUnit(chunks, dt.Size); err != nil {
		return nil, nil, err
	}
	p := &pipeline{bigEndian: dt.BigEndian}
	a.Codecs = nil
	switch m.Order {
	case "C", "":
	case "F":
		if len(shape) > 1 {
			p.transpose = reversed(len(shape))
		}
	default:
		return nil, nil, fmt.Errorf("order %q", m.Order)
	}
	var filters []string
	for i := len(m.Filters) - 1; i >= 0; i-- {
		fm, _ := m.Filters[i].(map[string]any)
		id, _ := fm["id"].(string)
		filters = append(filters, id)
	}
	var cm map[string]any
	if m.Compressor != nil {
		var ok bool
		if cm, ok = m.Compressor.(map[string]any); !ok {
			return nil, nil, fmt.Errorf("compressor is not an object")
		}
		id, _ := cm["id"].(string)
		a.Codecs = append(a.Codecs, id)
	}
	a.Codecs = append(a.Codecs, filters...)
	fb, err := v2Filters(m.Filters, dt) // filters.go
	if err != nil {
		return nil, nil, err
	}
	if cm != nil {
		id, _ := cm["id"].(string)
		switch id {
		case "blosc":
			if cn, _ := cm["cname"].(string); cn == "snappy" {
				return nil, nil, fmt.Errorf("%w: blosc compressor snappy", codec.ErrUnsupported)
			}
			p.bb = []bbCodec{{name: codec.Blosc}}
		case "zstd":
			p.bb = []bbCodec{{name: codec.Zstd}}
		case "zlib":
			p.bb = []bbCodec{{name: codec.Zlib}}
		case "gzip":
			p.bb = []bbCodec{{name: codec.Gzip}}
		case "lz4":
			p.bb = []bbCodec{{name: codec.LZ4}}
		default:
			return nil, nil, fmt.Errorf("%w: compressor %q", codec.ErrUnsupported, id)
		}
	}
	if p.bb, err = foldChecksums(append(fb, p.bb...)); err != nil {
		return nil, nil, err
	}
	if compressions(p.bb) > 1 {
		return nil, nil, fmt.Errorf("%w: more than one compression codec", codec.ErrUnsupported)
	}
	sep := m.DimensionSeparator
	switch sep {
	case "":
		sep = "."
	case ".", "/":
	default:
		return nil, nil, fmt.Errorf("%w: dimension_separator %q", codec.ErrUnsupported, sep)
	}
	a.keySep = sep
	a.Attributes = map[string]any{}
	for k, v := range attrs {
		if k != "_ARRAY_DIMENSIONS" {
			a.Attributes[k] = v
		}
	}
	fill, fj, err := parseFill(m.FillValue, dt, 2)
	if err != nil {
		return nil, nil, err
	}
	a.FillValue = fj
	return p, fill, nil
}

// ---------- fill values ----------

// intRange is the smallest and largest value of an integer dtype.
func intRange(dt DType) (lo int64, hi uint64) {
	bits := uint(dt.Size * 8)
	if dt.Kind == 'u' {
		return 0, math.MaxUint64 >> (64 - bits)
	}
	return -1 << (bits - 1), 1<<(bits-1) - 1
}

// parseFill returns the fill value as little-endian bytes of one element and
// as the JSON-ready value for sidecars.
func parseFill(v any, dt DType, format int) ([]byte, any, error) {
	out := make([]byte, dt.Size)
	if v == nil {
		if format == 3 {
			return nil, nil, fmt.Errorf("fill_value is null")
		}
		return out, nil, nil // v2 null: zarr-python reads missing chunks as zeros
	}
	switch x := v.(type) {
	case bool:
		if dt.Kind != 'b' {
			if x {
				putInt(out, dt, 1)
			}
			return out, x, nil
		}
		if x {
			out[0] = 1
		}
		return out, x, nil
	case json.Number:
		s := string(x)
		switch dt.Kind {
		case 'b':
			f, err := x.Float64()
			if err != nil {
				return nil, nil, fmt.Errorf("fill_value %s: %v", s, err)
			}
			if f != 0 {
				out[0] = 1
			}
			return out, f != 0, nil
		case 'i', 'u':
			lo, hi := intRange(dt)
			if i, err := strconv.ParseInt(s, 10, 64); err == nil {
				if i < lo || (i >= 0 && uint64(i) > hi) {
					return nil, nil, fmt.Errorf("fill_value %s is out of range for %s", s, dt.Name())
				}
				putInt(out, dt, i)
				return out, i, nil
			}
			if u, err := strconv.ParseUint(s, 10, 64); err == nil {
				if u > hi {
					return nil, nil, fmt.Errorf("fill_value %s is out of range for %s", s, dt.Name())
				}
				putUint(out, dt, u)
				return out, u, nil
			}
			f, err := x.Float64()
			if err != nil || f != math.Trunc(f) || math.IsInf(f, 0) {
				return nil, nil, fmt.Errorf("fill_value %s is not an integer", s)
			}
			// An integral number written as a float (1e3): within range,
			// it converts exactly; beyond it, zarr-python refuses it.
			if f < float64(lo) || f >= float64(hi)+1 {
				return nil, nil, fmt.Errorf("fill_value %s is out of range for %s", s, dt.Name())
			}
			if f >= 0 {
				u := uint64(f)
				putUint(out, dt, u)
				if u > math.MaxInt64 {
					return out, u, nil
				}
				return out, int64(u), nil
			}
			putInt(out, dt, int64(f))
			return out, int64(f), nil
		case 'f':
			f, err := x.Float64()
			if err != nil {
				return nil, nil, fmt.Errorf("fill_value %s: %v", s, err)
			}
			putFloat(out, dt, f)
			return out, f, nil
		}
	case string:
		if dt.Kind == 'f' {
			switch x {
			case "NaN":
				putFloat(out, dt, math.NaN())
				return out, x, nil
			case "Infinity":
				putFloat(out, dt, math.Inf(1))
				return out, x, nil
			case "-Infinity":
				putFloat(out, dt, math.Inf(-1))
				return out, x, nil
			}
		}
		if strings.HasPrefix(x, "0x") && format == 3 && dt.Kind == 'f' {
			u, err := strconv.ParseUint(x[2:], 16, 64)
			if err != nil || len(x)-2 > 2*dt.Size {
				return nil, nil, fmt.Errorf("fill_value %q is not a %d-byte hex pattern", x, dt.Size)
			}
			putUint(out, dt, u)
			if dt.Kind == 'f' && dt.Size == 2 && math.IsNaN(ReadFloat(out, dt)) {
				// zarr-python turns a float16 NaN pattern into the canonical
				// NaN (it keeps float32 and float64 payloads); match its reads.
				putFloat(out, dt, math.NaN())
			}
			return out, x, nil // the sidecar keeps the pattern as the metadata wrote it
		}
		return nil, nil, fmt.Errorf("fill_value %q", x)
	}
	return nil, nil, fmt.Errorf("%w: fill_value %v", codec.ErrUnsupported, v)
}
