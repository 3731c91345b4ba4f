package kerchunk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go/deprecated"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// The record files of a Parquet reference set are read here: parquet-go's
// description of the format (format) and its thrift decoder, under a page
// loop of our own. Record files are small and flat (four columns read
// whole), and parquet-go's own reader does not take them as they come:
// fastparquet, kerchunk's writer, pads a page past its values, which
// parquet-go decodes as values and warns of on the process's stderr for
// every page; and its thrift decoder trusts the sizes of lists, so that a
// few bytes of footer can ask for more memory than the machine has. Here
// every size a file states is checked against the bytes that hold it, and
// a page's values stop at the count its header gives.
//
// What is read: data pages v1 and v2, PLAIN and dictionary encodings,
// uncompressed, snappy, gzip and zstd pages (what fastparquet and pyarrow
// write); columns of BYTE_ARRAY, INT32 and INT64, required or optional.

// pqColumn is a top-level column of a record file.
type pqColumn struct {
	index    int
	optional bool
	typ      format.Type
	unsigned bool
}

// pqValue is a row's value in a column: null, bytes (a view of the page,
// valid during the call it is passed to) or an integer.
type pqValue struct {
	null bool
	b    []byte
	n    int64
}

type pqFile struct {
	b    []byte
	md   format.FileMetaData
	cols map[string]pqColumn
}

func openPq(b []byte) (*pqFile, error) {
	if len(b) < 12 || string(b[:4]) != "PAR1" || string(b[len(b)-4:]) != "PAR1" {
		return nil, errors.New("not a Parquet file")
	}
	n := int(binary.LittleEndian.Uint32(b[len(b)-8:]))
	if n > len(b)-12 {
		return nil, fmt.Errorf("a footer of %d bytes in a file of %d", n, len(b))
	}
	f := &pqFile{b: b, cols: map[string]pqColumn{}}
	if err := decodeThrift(bytes.NewReader(b[len(b)-8-n:len(b)-8]), &f.md); err != nil {
		return nil, fmt.Errorf("footer: %w", err)
	}
	if f.md.NumRows < 0 || len(f.md.Schema) == 0 {
		return nil, fmt.Errorf("footer: %d rows, %d schema elements", f.md.NumRows, len(f.md.Schema))
	}
	// A flat schema: the root, then its columns.
	for i, el := range f.md.Schema[1:] {
		if nc, _ := el.NumChildren.Get(); nc > 0 {
			return nil, fmt.Errorf("column %s is nested", el.Name)
		}
		rep, _ := el.RepetitionType.Get()
		if rep == format.Repeated {
			return nil, fmt.Errorf("column %s is repeated", el.Name)
		}
		typ, _ := el.Type.Get()
		ct, _ := el.ConvertedType.Get()
		c := pqColumn{index: i, optional: rep == format.Optional, typ: typ,
			unsigned: ct == deprecated.Uint8 || ct == deprecated.Uint16 || ct == deprecated.Uint32 || ct == deprecated.Uint64}
		if it, ok := el.LogicalType.Value.(*format.IntType); ok {
			c.unsigned = !it.IsSigned
		}
		f.cols[el.Name] = c
	}
	var rows int64
	for _, rg := range f.md.RowGroups {
		if len(rg.Columns) != len(f.md.Schema)-1 || rg.NumRows < 0 || rg.NumRows > f.md.NumRows-rows {
			return nil, fmt.Errorf("a row group of %d columns and %d rows", len(rg.Columns), rg.NumRows)
		}
		rows += rg.NumRows
	}
	if rows != f.md.NumRows {
		return nil, fmt.Errorf("row groups of %d rows in a file of %d", rows, f.md.NumRows)
	}
	return f, nil
}

// each calls fn with every row's value of the column name, in order; a
// file without that column calls it never.
func (f *pqFile) each(name string, fn func(row int, v pqValue) error) error {
	c, ok := f.cols[name]
	if !ok {
		return nil
	}
	row := 0
	for _, rg := range f.md.RowGroups {
		start := row
		err := f.eachInChunk(c, &rg.Columns[c.index], rg.NumRows, func(v pqValue) error {
			row++
			return fn(row-1, v)
		})
		if err != nil {
			return fmt.Errorf("column %s: %w", name, err)
		}
		if int64(row-start) != rg.NumRows {
			return fmt.Errorf("column %s: %d values in a row group of %d rows", name, row-start, rg.NumRows)
		}
	}
	return nil
}

// eachInChunk calls fn with the values of a column chunk of rows rows.
func (f *pqFile) eachInChunk(c pqColumn, cc *format.ColumnChunk, rows int64, fn func(pqValue) error) error {
	md := &cc.MetaData
	if cc.FilePath != "" {
		return fmt.Errorf("a column chunk in another file (%s)", cc.FilePath)
	}
	start := md.DataPageOffset
	if d := md.DictionaryPageOffset; d > 0 && d < start {
		start = d
	}
	if start < 4 || start > int64(len(f.b)) || md.TotalCompressedSize < 0 || md.TotalCompressedSize > int64(len(f.b))-start {
		return fmt.Errorf("a column chunk at %d+%d in a file of %d bytes", start, md.TotalCompressedSize, len(f.b))
	}
	chunk := f.b[start : start+md.TotalCompressedSize]
	src := bytes.NewReader(chunk)
	var dict []pqValue
	for seen := int64(0); seen < rows; {
		var h format.PageHeader
		if err := decodeThrift(src, &h); err != nil {
			return fmt.Errorf("page header: %w", err)
		}
		at := len(chunk) - src.Len()
		if h.CompressedPageSize < 0 || int(h.CompressedPageSize) > src.Len() {
			return fmt.Errorf("a page of %d bytes past its column chunk", h.CompressedPageSize)
		}
		body := chunk[at : at+int(h.CompressedPageSize)]
		src.Seek(int64(h.CompressedPageSize), io.SeekCurrent)
		var err error
		switch h.Type {
		case format.DictionaryPage:
			dict, err = dictionaryPage(c, md.Codec, &h, body)
		case format.DataPage, format.DataPageV2:
			var n int
			n, err = dataPage(c, md.Codec, &h, body, rows-seen, dict, fn)
			seen += int64(n)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func dictionaryPage(c pqColumn, codec format.CompressionCodec, h *format.PageHeader, body []byte) ([]pqValue, error) {
	dh, ok := h.DictionaryPageHeader.Get()
	if !ok || (dh.Encoding != format.Plain && dh.Encoding != format.PlainDictionary) {
		return nil, errors.New("a dictionary page that is not PLAIN")
	}
	data, err := decompress(codec, body, h.UncompressedPageSize)
	if err != nil {
		return nil, err
	}
	return plainValues(c, data, int(dh.NumValues))
}

// dataPage calls fn with a data page's values (at most max of them) and
// returns how many it held.
func dataPage(c pqColumn, codec format.CompressionCodec, h *format.PageHeader, body []byte, max int64, dict []pqValue, fn func(pqValue) error) (int, error) {
	var n int
	var enc format.Encoding
	var levels, data []byte
	var err error
	if dh, ok := h.DataPageHeader.Get(); ok && h.Type == format.DataPage {
		n, enc = int(dh.NumValues), dh.Encoding
		if n < 0 || int64(n) > max {
			return 0, fmt.Errorf("a page of %d values where %d are left", n, max)
		}
		if data, err = decompress(codec, body, h.UncompressedPageSize); err != nil {
			return 0, err
		}
		if c.optional { // definition levels, their length first
			if len(data) < 4 || int(binary.LittleEndian.Uint32(data)) > len(data)-4 {
				return 0, errors.New("definition levels past the page")
			}
			l := int(binary.LittleEndian.Uint32(data))
			levels, data = data[4:4+l], data[4+l:]
		}
	} else if dh, ok := h.DataPageHeaderV2.Get(); ok && h.Type == format.DataPageV2 {
		n, enc = int(dh.NumValues), dh.Encoding
		rl, dl := int(dh.RepetitionLevelsByteLength), int(dh.DefinitionLevelsByteLength)
		if n < 0 || int64(n) > max || rl < 0 || dl < 0 || rl > len(body) || dl > len(body)-rl {
			return 0, fmt.Errorf("a page of %d values, levels of %d and %d bytes, in %d bytes", n, rl, dl, len(body))
		}
		levels, data = body[rl:rl+dl], body[rl+dl:]
		if compressed, set := dh.IsCompressed.Get(); compressed || !set {
			if data, err = decompress(codec, data, h.UncompressedPageSize-int32(rl+dl)); err != nil {
				return 0, err
			}
		}
	} else {
		return 0, errors.New("a data page without its header")
	}
	return n, pageValues(c, enc, levels, n, data, dict, fn)
}

// pageValues calls fn with a page's n values: levels (nil for a required
// column) say which are null, data holds the others.
func pageValues(c pqColumn, enc format.Encoding, levels []byte, n int, data []byte, dict []pqValue, fn func(pqValue) error) error {
	present := n
	var def []uint32
	if c.optional {
		var err error
		if def, err = decodeHybrid(levels, 1, n); err != nil {
			return fmt.Errorf("definition levels: %w", err)
		}
		present = 0
		for _, d := range def {
			present += int(d)
		}
	}
	var value func(k int) (pqValue, error) // the k-th value present, k in order
	switch enc {
	case format.Plain:
		p, err := newPlain(c, data, present)
		if err != nil {
			return err
		}
		value = p.value
	case format.PlainDictionary, format.RLEDictionary:
		if len(data) < 1 {
			return errors.New("dictionary indexes missing")
		}
		idx, err := decodeHybrid(data[1:], uint(data[0]), present)
		if err != nil {
			return fmt.Errorf("dictionary indexes: %w", err)
		}
		value = func(k int) (pqValue, error) {
			if int64(idx[k]) >= int64(len(dict)) {
				return pqValue{}, fmt.Errorf("dictionary index %d of %d", idx[k], len(dict))
			}
			return dict[idx[k]], nil
		}
	default:
		return fmt.Errorf("encoding %s", enc)
	}
	k := 0
	for i := range n {
		v := pqValue{null: true}
		if def == nil || def[i] == 1 {
			var err error
			if v, err = value(k); err != nil {
				return err
			}
			k++
		}
		if err := fn(v); err != nil {
			return err
		}
	}
	return nil
}

// plainPage reads the PLAIN values of a page in order; bytes past its
// values are ignored (fastparquet pads its pages).
type plainPage struct {
	c    pqColumn
	data []byte
}

func newPlain(c pqColumn, data []byte, n int) (*plainPage, error) {
	width := 4 // a BYTE_ARRAY's length, an INT32
	switch c.typ {
	case format.ByteArray, format.Int32:
	case format.Int64:
		width = 8
	default:
		return nil, fmt.Errorf("a column of type %s", c.typ)
	}
	if n < 0 || n > len(data)/width {
		return nil, fmt.Errorf("%d values in %d bytes", n, len(data))
	}
	return &plainPage{c: c, data: data}, nil
}

// value returns the k-th value, k counting up from 0.
func (p *plainPage) value(k int) (v pqValue, err error) {
	switch p.c.typ {
	case format.ByteArray:
		if len(p.data) < 4 || int(binary.LittleEndian.Uint32(p.data)) > len(p.data)-4 {
			return v, fmt.Errorf("value %d past the page", k)
		}
		l := int(binary.LittleEndian.Uint32(p.data))
		v.b, p.data = p.data[4:4+l:4+l], p.data[4+l:]
	case format.Int32:
		u := binary.LittleEndian.Uint32(p.data[4*k:])
		v.n = int64(int32(u))
		if p.c.unsigned {
			v.n = int64(u)
		}
	case format.Int64:
		u := binary.LittleEndian.Uint64(p.data[8*k:])
		if p.c.unsigned && u > math.MaxInt64 {
			return v, fmt.Errorf("%d out of range", u)
		}
		v.n = int64(u)
	}
	return v, nil
}

// plainValues decodes n PLAIN values.
func plainValues(c pqColumn, data []byte, n int) ([]pqValue, error) {
	p, err := newPlain(c, data, n)
	if err != nil {
		return nil, err
	}
	out := make([]pqValue, n)
	for k := range out {
		if out[k], err = p.value(k); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// decodeHybrid decodes n values of the RLE / bit-packed hybrid encoding
// of width bits each; what follows them is ignored.
func decodeHybrid(src []byte, width uint, n int) ([]uint32, error) {
	if width > 32 {
		return nil, fmt.Errorf("a bit width of %d", width)
	}
	out := make([]uint32, 0, n)
	for len(out) < n {
		h, k := binary.Uvarint(src)
		if k <= 0 {
			return nil, fmt.Errorf("%d of %d values", len(out), n)
		}
		src = src[k:]
		if h&1 == 0 { // a run of one value
			vb := int(width+7) / 8
			if len(src) < vb {
				return nil, errors.New("a run past its data")
			}
			var w [4]byte
			copy(w[:], src[:vb])
			v := binary.LittleEndian.Uint32(w[:])
			src = src[vb:]
			for m := min(h>>1, uint64(n-len(out))); m > 0; m-- {
				out = append(out, v)
			}
			continue
		}
		groups := h >> 1 // of 8 values, width bytes each
		if groups > uint64(len(src)) || groups*uint64(width) > uint64(len(src)) {
			return nil, errors.New("bit-packed values past their data")
		}
		packed := src[:groups*uint64(width)]
		src = src[len(packed):]
		for bit := uint64(0); bit < groups*8*uint64(width) && len(out) < n; bit += uint64(width) {
			out = append(out, bitsAt(packed, bit, width))
		}
	}
	return out, nil
}

func bitsAt(b []byte, bit uint64, width uint) uint32 {
	var w [8]byte
	copy(w[:], b[bit/8:])
	return uint32(binary.LittleEndian.Uint64(w[:]) >> (bit % 8) & (1<<width - 1))
}

// zstdPages decodes zstd pages, made at the first; its memory is bounded
// by the largest record file.
var zstdPages = sync.OnceValues(func() (*zstd.Decoder, error) {
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxRecordBytes))
})

// decompress returns a page's size bytes.
func decompress(codec format.CompressionCodec, src []byte, size int32) ([]byte, error) {
	if size < 0 || int64(size) > maxRecordBytes {
		return nil, fmt.Errorf("a page of %d bytes", size)
	}
	var out []byte
	var err error
	switch codec {
	case format.Uncompressed:
		out = src
	case format.Snappy:
		if n, e := snappy.DecodedLen(src); e != nil || n != int(size) {
			return nil, fmt.Errorf("a snappy page of %d bytes, %d said", n, size)
		}
		out, err = snappy.Decode(make([]byte, size), src)
	case format.Gzip:
		var z *gzip.Reader
		if z, err = gzip.NewReader(bytes.NewReader(src)); err == nil {
			out, err = io.ReadAll(io.LimitReader(z, int64(size)+1))
		}
	case format.Zstd:
		var d *zstd.Decoder
		if d, err = zstdPages(); err == nil {
			out, err = d.DecodeAll(src, nil)
		}
	default:
		return nil, fmt.Errorf("pages compressed with %s", codec)
	}
	if err != nil {
		return nil, fmt.Errorf("a %s page: %w", codec, err)
	}
	if len(out) != int(size) {
		return nil, fmt.Errorf("a %s page of %d bytes, %d said", codec, len(out), size)
	}
	return out, nil
}

// decodeThrift decodes a thrift struct from src, refusing any list, map or
// string longer than the bytes left in src.
func decodeThrift(src *bytes.Reader, v any) error {
	var p thrift.CompactProtocol
	return thrift.NewDecoder(boundedThrift{p.NewReader(src), src}).Decode(v)
}

// thriftReader names thrift.Reader as a field of boundedThrift apart from
// its Reader method.
type thriftReader = thrift.Reader

type boundedThrift struct {
	thriftReader
	src *bytes.Reader
}

var errThriftSize = errors.New("a size past the end of its data")

func (r boundedThrift) check(n int64) error {
	if n < 0 || n > int64(r.src.Len()) {
		return errThriftSize
	}
	return nil
}

func (r boundedThrift) ReadLength() (int, error) {
	n, err := r.thriftReader.ReadLength()
	if err == nil {
		err = r.check(int64(n))
	}
	return n, err
}

func (r boundedThrift) ReadBytes() ([]byte, error) {
	n, err := r.ReadLength()
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	_, err = io.ReadFull(r.src, b)
	return b, err
}

func (r boundedThrift) ReadString() (string, error) {
	b, err := r.ReadBytes()
	return string(b), err
}

func (r boundedThrift) ReadList() (thrift.List, error) {
	l, err := r.thriftReader.ReadList()
	if err == nil {
		err = r.check(int64(l.Size))
	}
	return l, err
}

func (r boundedThrift) ReadSet() (thrift.Set, error) {
	s, err := r.thriftReader.ReadSet()
	if err == nil {
		err = r.check(int64(s.Size))
	}
	return s, err
}

func (r boundedThrift) ReadMap() (thrift.Map, error) {
	m, err := r.thriftReader.ReadMap()
	if err == nil {
		err = r.check(int64(m.Size))
	}
	return m, err
}
