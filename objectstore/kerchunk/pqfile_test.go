package kerchunk

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// parquetFile wraps a footer in a Parquet file's framing.
func parquetFile(footer []byte) []byte {
	b := append([]byte("PAR1"), footer...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(footer)))
	return append(b, "PAR1"...)
}

// Sizes a record file states beyond the bytes that hold them are refused
// with an error, never allocated: a footer of ten bytes that claims a
// schema of 2^31-1 elements, or a name of 2^31-1 bytes, would otherwise
// ask the runtime for more memory than the machine has, which no recover
// catches.
func TestParquetSizesBounded(t *testing.T) {
	p := &parquetSet{recordSize: 10, urlTable: newURLTable()}
	for name, footer := range map[string][]byte{
		// FileMetaData: version 1, then field 2 (schema), a list of
		// structs of 2^31-1 elements.
		"list": {0x15, 0x02, 0x19, 0xFC, 0xFF, 0xFF, 0xFF, 0xFF, 0x07, 0x00},
		// A schema of one element whose name (field 4, binary) claims
		// 2^31-1 bytes.
		"string": {0x15, 0x02, 0x19, 0x1C, 0x48, 0xFF, 0xFF, 0xFF, 0xFF, 0x07, 0x00, 0x00},
		// A footer longer than the file.
		"footer": nil,
	} {
		b := parquetFile(footer)
		if footer == nil {
			binary.LittleEndian.PutUint32(b[len(b)-8:], 1<<20)
		}
		if _, err := p.parseRecord(b); err == nil || strings.Contains(err.Error(), "unreadable") {
			t.Errorf("%s: %v, want an error of the reader's own", name, err)
		}
	}
}

// Every record file of the fixtures, cut short or with a byte changed
// anywhere, is read or refused, never taken for more rows than it has.
func TestParquetDamaged(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "parquet", "*.parq", "*", "refs.*.parq"))
	if len(files) < 8 {
		t.Fatalf("%d record files in testdata", len(files))
	}
	p := &parquetSet{recordSize: 6, urlTable: newURLTable()}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.parseRecord(b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i := range b {
			for _, d := range [][]byte{b[:i], flip(b, i)} {
				rec, err := p.parseRecord(d)
				if err != nil && strings.Contains(err.Error(), "unreadable") {
					t.Fatalf("%s, damaged at %d: %v", name, i, err)
				}
				if err == nil && (len(rec.refs) > 6 || len(rec.present) != len(rec.refs)) {
					t.Fatalf("%s, damaged at %d: %d rows", name, i, len(rec.refs))
				}
			}
		}
	}
}

func flip(b []byte, i int) []byte {
	d := bytes.Clone(b)
	d[i] ^= 0x5a
	return d
}

func FuzzParquetRecord(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "parquet", "*.parq", "*", "refs.*.parq"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	p := &parquetSet{recordSize: 1000, urlTable: newURLTable()}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := p.readRecord(b) // no recover: a panic fails
		if err == nil && len(rec.refs) > 1000 {
			t.Fatalf("%d rows", len(rec.refs))
		}
	})
}
