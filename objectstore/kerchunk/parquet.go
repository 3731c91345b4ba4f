package kerchunk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/targets"
)

// The Parquet form of a reference set (fsspec's LazyReferenceMapper):
// ".zmetadata" holds {"metadata": {key: document}, "record_size": N}; the
// chunks of array FIELD are the rows of FIELD/refs.R.parq, chunk number i
// (C order over the chunk grid) at row i % N of record i / N, with
// columns path, offset, size and raw. A row with raw set is inline bytes;
// one with neither path nor raw is a missing chunk; offset and size both
// 0 mean the whole of path. Record files are read when a chunk of theirs
// is first asked for, and kept (a few) in memory.

const (
	maxRecordSize  = 10_000_000
	recordsKept    = 64
	maxRecordBytes = 1 << 30
)

type parquetSet struct {
	dir        objectstore.Store
	meta       map[string][]byte
	metaKeys   []string
	recordSize int64
	fields     map[string]*field

	*urlTable

	records targets.Kept[*record] // by record file key; nil for one that does not exist
}

type field struct {
	grid    []int64 // chunks along each dimension
	nchunks int64
}

type record struct {
	refs    []ref
	present []bool
}

func openParquet(_ context.Context, dir objectstore.Store, doc []byte) (*parquetSet, error) {
	var zm struct {
		Metadata   map[string]json.RawMessage `json:"metadata"`
		RecordSize json.Number                `json:"record_size"`
	}
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	if err := d.Decode(&zm); err != nil {
		return nil, fmt.Errorf("invalid JSON: %v", err)
	}
	rs, err := zm.RecordSize.Int64()
	if err != nil || rs < 1 || rs > maxRecordSize {
		return nil, fmt.Errorf("record_size %q: want an integer from 1 to %d", zm.RecordSize, maxRecordSize)
	}
	p := &parquetSet{dir: dir, meta: map[string][]byte{}, recordSize: rs, fields: map[string]*field{},
		urlTable: newURLTable()}
	p.records.Max = recordsKept
	for k, v := range zm.Metadata {
		ck, err := objectstore.CleanKey(k, false)
		if err != nil {
			return nil, fmt.Errorf("metadata key %q: %w", k, err)
		}
		p.meta[ck] = append([]byte(nil), v...)
		if name, ok := strings.CutSuffix(ck, "/.zarray"); ok || ck == ".zarray" {
			if ck == ".zarray" {
				name = ""
			}
			f, err := parseField(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", ck, err)
			}
			p.fields[name] = f
		}
	}
	// zarr reads the consolidated metadata from here, without listing.
	cons, err := json.Marshal(map[string]any{"zarr_consolidated_format": 1, "metadata": zm.Metadata})
	if err != nil {
		return nil, err
	}
	p.meta[".zmetadata"] = cons
	for k := range p.meta {
		p.metaKeys = append(p.metaKeys, k)
	}
	sort.Strings(p.metaKeys)
	return p, nil
}

func parseField(doc []byte) (*field, error) {
	var za struct {
		Shape  []int64 `json:"shape"`
		Chunks []int64 `json:"chunks"`
	}
	if err := json.Unmarshal(doc, &za); err != nil {
		return nil, err
	}
	if len(za.Shape) != len(za.Chunks) {
		return nil, fmt.Errorf("shape %v and chunks %v differ in rank", za.Shape, za.Chunks)
	}
	f := &field{nchunks: 1}
	for i, s := range za.Shape {
		c := za.Chunks[i]
		if s < 0 || c <= 0 {
			return nil, fmt.Errorf("shape %v, chunks %v", za.Shape, za.Chunks)
		}
		g := (s + c - 1) / c
		f.grid = append(f.grid, g)
		if g > 0 && f.nchunks > math.MaxInt64/g {
			return nil, fmt.Errorf("chunk grid %v too large", f.grid)
		}
		f.nchunks *= g
	}
	if len(f.grid) == 0 {
		f.grid = []int64{1} // a scalar: one chunk, "0"
	}
	return f, nil
}

// chunkIndex maps a chunk key of field f ("1.0.3") to its chunk number.
func (f *field) chunkIndex(name string) (int64, bool) {
	parts := strings.Split(name, ".")
	if len(parts) != len(f.grid) {
		return 0, false
	}
	var n int64
	for d, s := range parts {
		c, err := strconv.ParseInt(s, 10, 64)
		if err != nil || c < 0 || c >= f.grid[d] || strconv.FormatInt(c, 10) != s {
			return 0, false
		}
		n = n*f.grid[d] + c
	}
	return n, true
}

func (f *field) chunkName(n int64) string {
	parts := make([]string, len(f.grid))
	for d := len(f.grid) - 1; d >= 0; d-- {
		parts[d] = strconv.FormatInt(n%f.grid[d], 10)
		n /= f.grid[d]
	}
	return strings.Join(parts, ".")
}

func (p *parquetSet) lookup(ctx context.Context, key string) (ref, bool, error) {
	if b, ok := p.meta[key]; ok {
		return ref{url: -1, data: b}, true, nil
	}
	fname, chunk := "", key
	if i := strings.LastIndex(key, "/"); i >= 0 {
		fname, chunk = key[:i], key[i+1:]
	}
	f, ok := p.fields[fname]
	if !ok {
		return ref{}, false, nil
	}
	n, ok := f.chunkIndex(chunk)
	if !ok || n >= f.nchunks {
		return ref{}, false, nil
	}
	rec, err := p.record(ctx, fname, n/p.recordSize)
	if err != nil || rec == nil {
		return ref{}, false, err
	}
	row := n % p.recordSize
	if row >= int64(len(rec.refs)) || !rec.present[row] {
		return ref{}, false, nil
	}
	return rec.refs[row], true, nil
}

// record returns record n of a field, nil when its file does not exist.
func (p *parquetSet) record(ctx context.Context, fname string, n int64) (*record, error) {
	key := fmt.Sprintf("refs.%d.parq", n)
	if fname != "" {
		key = fname + "/" + key
	}
	return p.records.Get(ctx, key, func(ctx context.Context) (*record, error) {
		b, err := p.dir.Get(objectstore.WithSizeLimit(ctx, maxRecordBytes), key)
		if objectstore.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		rec, err := p.parseRecord(ctx, b)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w: %w", strings.TrimSuffix(p.dir.ID(), "/"), key, ErrMalformed, err)
		}
		return rec, nil
	})
}

func (p *parquetSet) parseRecord(ctx context.Context, b []byte) (rec *record, err error) {
	defer func() {
		// arrow-go panics on some malformed files; a reference set must
		// not take the daemon down.
		if r := recover(); r != nil {
			rec, err = nil, fmt.Errorf("unreadable Parquet file: %v", r)
		}
	}()
	tbl, err := pqarrow.ReadTable(ctx, bytes.NewReader(b), nil, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		return nil, err
	}
	defer tbl.Release()
	rows := tbl.NumRows()
	if rows > p.recordSize {
		return nil, fmt.Errorf("%d rows, more than record_size %d", rows, p.recordSize)
	}
	rec = &record{refs: make([]ref, rows), present: make([]bool, rows)}
	cols := map[string]arrow.Array{}
	schema := tbl.Schema()
	for i := 0; i < int(tbl.NumCols()); i++ {
		name := schema.Field(i).Name
		switch name {
		case "path", "offset", "size", "raw":
		default:
			continue
		}
		ch := tbl.Column(i).Data()
		arr, err := concat(ch)
		if err != nil {
			return nil, fmt.Errorf("column %s: %v", name, err)
		}
		defer arr.Release()
		cols[name] = arr
	}
	paths, hasPath := cols["path"]
	raws, hasRaw := cols["raw"]
	if !hasPath && !hasRaw {
		return nil, fmt.Errorf("neither a path nor a raw column")
	}
	for i := range int(rows) {
		if hasRaw && raws.IsValid(i) {
			data, ok := binaryAt(raws, i)
			if !ok {
				return nil, fmt.Errorf("raw column of type %s", raws.DataType())
			}
			rec.refs[i] = ref{url: -1, data: append([]byte(nil), data...)}
			rec.present[i] = true
			continue
		}
		if !hasPath || !paths.IsValid(i) {
			continue
		}
		u, ok := binaryAt(paths, i)
		if !ok {
			return nil, fmt.Errorf("path column of type %s", paths.DataType())
		}
		if len(u) == 0 {
			continue
		}
		off, err1 := intAt(cols["offset"], i)
		size, err2 := intAt(cols["size"], i)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("row %d: offset or size: %v", i, cmpErr(err1, err2))
		}
		if off < 0 || size < 0 {
			return nil, fmt.Errorf("row %d: negative offset %d or size %d", i, off, size)
		}
		r := ref{url: p.intern(string(u)), off: off, n: size}
		if off == 0 && size == 0 {
			r.n = -1 // the whole file
		}
		rec.refs[i] = r
		rec.present[i] = true
	}
	return rec, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func concat(ch *arrow.Chunked) (arrow.Array, error) {
	chunks := ch.Chunks()
	if len(chunks) == 1 {
		chunks[0].Retain()
		return chunks[0], nil
	}
	return array.Concatenate(chunks, memory.DefaultAllocator)
}

func binaryAt(a arrow.Array, i int) ([]byte, bool) {
	switch c := a.(type) {
	case *array.Binary:
		return c.Value(i), true
	case *array.LargeBinary:
		return c.Value(i), true
	case *array.String:
		return []byte(c.Value(i)), true
	case *array.LargeString:
		return []byte(c.Value(i)), true
	case *array.Dictionary:
		return binaryAt(c.Dictionary(), c.GetValueIndex(i))
	}
	return nil, false
}

func intAt(a arrow.Array, i int) (int64, error) {
	if a == nil || !a.IsValid(i) {
		return 0, nil
	}
	switch c := a.(type) {
	case *array.Int64:
		return c.Value(i), nil
	case *array.Int32:
		return int64(c.Value(i)), nil
	case *array.Uint64:
		if c.Value(i) > math.MaxInt64 {
			return 0, fmt.Errorf("%d out of range", c.Value(i))
		}
		return int64(c.Value(i)), nil
	case *array.Uint32:
		return int64(c.Value(i)), nil
	}
	return 0, fmt.Errorf("column of type %s", a.DataType())
}

func (p *parquetSet) children(ctx context.Context, dir string) ([]string, error) {
	out := sortedChildren(p.metaKeys, dir)
	if f, ok := p.fields[dir]; ok {
		err := p.eachChunk(ctx, dir, f, func(name string, _ ref) {
			out = append(out, name)
		})
		if err != nil {
			return nil, err
		}
		sort.Strings(out)
		out = dedupe(out)
	}
	return out, nil
}

// eachChunk calls fn with the name (not the full key) and reference of
// every chunk of a field that has one.
func (p *parquetSet) eachChunk(ctx context.Context, fname string, f *field, fn func(string, ref)) error {
	nrec := (f.nchunks + p.recordSize - 1) / p.recordSize
	for n := int64(0); n < nrec; n++ {
		rec, err := p.record(ctx, fname, n)
		if err != nil {
			return err
		}
		if rec == nil {
			continue
		}
		for row, ok := range rec.present {
			idx := n*p.recordSize + int64(row)
			if ok && idx < f.nchunks {
				fn(f.chunkName(idx), rec.refs[row])
			}
		}
	}
	return nil
}

func (p *parquetSet) each(ctx context.Context, prefix string, fn func(string, ref)) error {
	pre := ""
	if prefix != "" {
		pre = prefix + "/"
	}
	for _, k := range p.metaKeys {
		if strings.HasPrefix(k, pre) {
			fn(k, ref{url: -1, data: p.meta[k]})
		}
	}
	names := make([]string, 0, len(p.fields))
	for name := range p.fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		full := name + "/"
		if name == "" {
			full = ""
		}
		if !strings.HasPrefix(full, pre) && !(prefix == name) {
			continue
		}
		err := p.eachChunk(ctx, name, p.fields[name], func(chunk string, r ref) {
			fn(full+chunk, r)
		})
		if err != nil {
			return err
		}
	}
	return nil
}
