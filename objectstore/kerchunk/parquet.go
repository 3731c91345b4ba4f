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
		b, err := objectstore.GetLimit(ctx, p.dir, key, maxRecordBytes)
		if objectstore.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		rec, err := p.parseRecord(b)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w: %w", strings.TrimSuffix(p.dir.ID(), "/"), key, ErrMalformed, err)
		}
		return rec, nil
	})
}

func (p *parquetSet) parseRecord(b []byte) (rec *record, err error) {
	defer func() {
		// A reference set must not take the daemon down, whatever its
		// record files hold.
		if r := recover(); r != nil {
			rec, err = nil, fmt.Errorf("unreadable Parquet file: %v", r)
		}
	}()
	return p.readRecord(b)
}

func (p *parquetSet) readRecord(b []byte) (*record, error) {
	f, err := openPq(b)
	if err != nil {
		return nil, err
	}
	rows := f.md.NumRows
	if rows > p.recordSize {
		return nil, fmt.Errorf("%d rows, more than record_size %d", rows, p.recordSize)
	}
	_, hasPath := f.cols["path"]
	_, hasRaw := f.cols["raw"]
	if !hasPath && !hasRaw {
		return nil, fmt.Errorf("neither a path nor a raw column")
	}
	rec := &record{refs: make([]ref, rows), present: make([]bool, rows)}
	// A row with raw set is inline bytes, whatever its path says.
	err = f.each("raw", func(i int, v pqValue) error {
		if v.null {
			return nil
		}
		if v.b == nil {
			return fmt.Errorf("raw column of type %s", f.cols["raw"].typ)
		}
		rec.refs[i] = ref{url: -1, data: append([]byte(nil), v.b...)}
		rec.present[i] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The rows that reference a target; offset and size (null: 0) are
	// read for them only.
	target := make([]bool, rows)
	err = f.each("path", func(i int, v pqValue) error {
		if rec.present[i] || v.null {
			return nil
		}
		if v.b == nil {
			return fmt.Errorf("path column of type %s", f.cols["path"].typ)
		}
		if len(v.b) > 0 {
			rec.refs[i] = ref{url: p.intern(string(v.b))}
			target[i] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, col := range []string{"offset", "size"} {
		err = f.each(col, func(i int, v pqValue) error {
			if !target[i] || v.null {
				return nil
			}
			if v.b != nil {
				return fmt.Errorf("row %d: %s column of type %s", i, col, f.cols[col].typ)
			}
			if v.n < 0 {
				return fmt.Errorf("row %d: negative %s %d", i, col, v.n)
			}
			if col == "offset" {
				rec.refs[i].off = v.n
			} else {
				rec.refs[i].n = v.n
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for i, ok := range target {
		if !ok {
			continue
		}
		if rec.refs[i].off == 0 && rec.refs[i].n == 0 {
			rec.refs[i].n = -1 // the whole file
		}
		rec.present[i] = true
	}
	return rec, nil
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
