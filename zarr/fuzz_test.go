package zarr_test

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/fixtures"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

func openPosix(dir string) (objectstore.Store, error) { return objectstore.OpenPosix(dir) }

// fixtureDocs returns the metadata documents of the tensorstore fixtures
// (more seeds for the metadata fuzzers), when they can be made here: the
// seeds of this file's own pipelines do not depend on them, and
// TestConformanceTensorstore reports why they cannot.
func fixtureDocs(name string) [][]byte {
	var out [][]byte
	root, err := fixtures.TensorstoreDir()
	if err != nil {
		return nil
	}
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && filepath.Base(p) == name {
			if b, err := os.ReadFile(p); err == nil {
				out = append(out, b)
			}
		}
		return nil
	})
	return out
}

// metadataKeys are the documents Open reads at the root; an Open error
// must name the one it could not use.
var metadataKeys = []string{"zarr.json", ".zarray", ".zgroup", ".zmetadata", "no Zarr metadata"}

// knownReadError reports whether err is what Read promises for bad input:
// a ChunkError naming the array and chunk, of a known class.
func knownReadError(err error) bool {
	var ce *zarr.ChunkError
	if !errors.As(err, &ce) || ce.Key == "" {
		return false
	}
	for _, class := range []error{codec.ErrCorrupt, zarr.ErrChecksum, codec.ErrUnsupported} {
		if errors.Is(err, class) {
			return true
		}
	}
	return false
}

// readAll opens the store and reads every supported array whole. It must
// never panic, whatever the store holds, and fails t on an error Open or
// Read do not promise: Open fails only naming the root document it could
// not use, Read only with a known ChunkError. It returns the hierarchy
// (nil when Open failed) and the bytes read, by array path.
func readAll(t *testing.T, files map[string][]byte) (*zarr.Hierarchy, map[string][]byte) {
	t.Helper()
	h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		for _, k := range metadataKeys {
			if strings.Contains(err.Error(), k) {
				return nil, nil
			}
		}
		t.Fatalf("Open: an error naming no metadata document: %v", err)
	}
	out := map[string][]byte{}
	for _, a := range h.Arrays {
		if a.Unsupported != "" {
			continue
		}
		n := int64(a.DType.Size)
		for _, s := range a.Shape {
			n *= s
		}
		if n > 1<<22 {
			continue
		}
		dst := make([]byte, n)
		err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: make([]int64, len(a.Shape)), Count: a.Shape, Dst: dst}})
		if err != nil {
			if !knownReadError(err) {
				t.Fatalf("Read %q: an error of no known class, or not naming its chunk: %v", a.Path, err)
			}
			continue
		}
		out[a.Path] = dst
	}
	readPart(t, files, out, false)
	return h, out
}

// readPart reads the first half (along the first dimension) of every
// supported array with every chunk read in part where its codecs allow:
// it fails only with a known ChunkError, and where the whole read
// succeeded it gives the same bytes. (Where the whole read failed, a
// partial one may succeed: the damage can lie in blocks it does not read.)
// With strict, a partial read must succeed wherever the whole one did
// (valid chunks); hostile ones may fail either way.
func readPart(t *testing.T, files map[string][]byte, whole map[string][]byte, strict bool) {
	t.Helper()
	h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{ChunkCacheBytes: -1, Partial: zarr.PartialAlways})
	if err != nil {
		return
	}
	for _, a := range h.Arrays {
		if a.Unsupported != "" || len(a.Shape) == 0 || a.Shape[0] == 0 {
			continue
		}
		n := int64(a.DType.Size)
		count := slices.Clone(a.Shape)
		count[0] = (count[0] + 1) / 2
		for _, s := range count {
			n *= s
		}
		if n > 1<<22 {
			continue
		}
		dst := make([]byte, n)
		err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: make([]int64, len(a.Shape)), Count: count, Dst: dst}})
		if err != nil {
			if !knownReadError(err) {
				t.Fatalf("partial Read %q: an error of no known class, or not naming its chunk: %v", a.Path, err)
			}
			if _, ok := whole[a.Path]; ok && strict {
				t.Fatalf("partial Read %q failed where the whole read succeeded: %v", a.Path, err)
			}
			continue
		}
		if w, ok := whole[a.Path]; ok && !bytes.Equal(dst, w[:n]) {
			t.Fatalf("partial Read %q differs from the whole read", a.Path)
		}
	}
}

func FuzzV3Metadata(f *testing.F) {
	for _, d := range fixtureDocs("zarr.json") {
		f.Add(d)
	}
	files, _ := shardedStore(f, false)
	f.Add(files["zarr.json"])
	for _, p := range pipelines(f) {
		if d, ok := p.meta["zarr.json"]; ok {
			f.Add(d)
		}
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		readAll(t, map[string][]byte{"zarr.json": doc, "c/0/0": {1, 2, 3}, "c/0": {0}})
	})
}

func FuzzV2Metadata(f *testing.F) {
	for _, d := range fixtureDocs(".zarray") {
		f.Add(d)
	}
	for _, p := range pipelines(f) {
		if d, ok := p.meta[".zarray"]; ok {
			f.Add(d)
		}
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		readAll(t, map[string][]byte{".zarray": doc, "0": {1, 2, 3, 4}, "0.0": {0}, "0.0.0": {0, 0}})
	})
}

// FuzzShardIndex feeds arbitrary shards to a fixed sharded array: Open
// always succeeds, Read succeeds or fails with a known ChunkError, and the
// intact shard reads back exactly.
func FuzzShardIndex(f *testing.F) {
	base, want := shardedStore(f, false)
	f.Add(base["c/0/0"])
	start, _ := shardedStore(f, true)
	f.Add(start["c/0/0"])
	f.Fuzz(func(t *testing.T, shard []byte) {
		h, got := readAll(t, map[string][]byte{"zarr.json": base["zarr.json"], "c/0/0": shard})
		if h == nil {
			t.Fatal("Open failed on good metadata")
		}
		if bytes.Equal(shard, base["c/0/0"]) && !bytes.Equal(got[""], want) {
			t.Fatal("the intact shard did not read back")
		}
	})
}

// pipeline is an array of uint16 shaped (4, 8) in one chunk (or shard)
// whose metadata selects a codec pipeline; chunk is a valid encoding of
// pipelineValues, and keys are where the fuzzer puts its chunk.
type pipeline struct {
	name  string
	meta  map[string][]byte
	keys  []string
	chunk []byte
}

// pipelineValues is what every pipeline's chunk decodes to: (4, 8) uint16,
// element k being k*0x0101+1 (its two bytes differ, so a wrong byte order
// shows), little-endian, C order.
func pipelineValues() []byte {
	b := make([]byte, 64)
	for i := range 32 {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(i*0x0101+1))
	}
	return b
}

// gzipBytes is b compressed as one gzip member.
func gzipBytes(b []byte) []byte {
	var w bytes.Buffer
	g := gzip.NewWriter(&w)
	g.Write(b)
	g.Close()
	return w.Bytes()
}

// zlibBytes is b compressed as a zlib stream.
func zlibBytes(b []byte) []byte {
	var w bytes.Buffer
	g := zlib.NewWriter(&w)
	g.Write(b)
	g.Close()
	return w.Bytes()
}

// pipelines builds the arrays FuzzChunkDecode feeds: every codec, crc32c,
// transpose (v3) and order F (v2), big endian, and sharding, written here
// so that the target needs no fixtures.
func pipelines(tb testing.TB) []pipeline {
	raw := pipelineValues()
	zenc, err := zstd.NewWriter(nil)
	if err != nil {
		tb.Fatal(err)
	}
	zst := func(b []byte) []byte { return zenc.EncodeAll(b, nil) }
	lz := func(b []byte) []byte { // numcodecs LZ4: size, then one block
		out := make([]byte, 4+lz4.CompressBlockBound(len(b)))
		binary.LittleEndian.PutUint32(out, uint32(len(b)))
		n, err := lz4.CompressBlock(b, out[4:], nil)
		if err != nil || n == 0 {
			tb.Fatalf("lz4: %d bytes, %v", n, err)
		}
		return out[:4+n]
	}
	blosc := func(b []byte) []byte { // a memcpyed frame: header, then the bytes
		h := []byte{2, 1, 0x02, 2}
		h = binary.LittleEndian.AppendUint32(h, uint32(len(b)))
		h = binary.LittleEndian.AppendUint32(h, uint32(len(b)))
		h = binary.LittleEndian.AppendUint32(h, uint32(16+len(b)))
		return append(h, b...)
	}
	crc := func(b []byte) []byte {
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	}
	swapped := bytes.Clone(raw) // big endian
	for i := 0; i < len(swapped); i += 2 {
		swapped[i], swapped[i+1] = swapped[i+1], swapped[i]
	}
	fortran := make([]byte, len(raw)) // (8, 4) in C order: the transpose
	for i := range 4 {
		for j := range 8 {
			copy(fortran[2*(j*4+i):], raw[2*(i*8+j):2*(i*8+j)+2])
		}
	}
	// A shard of inner chunks (2, 4), each zstd, index at the end.
	var shard []byte
	var index []byte
	for ci := range 2 {
		for cj := range 2 {
			inner := make([]byte, 0, 16)
			for i := range 2 {
				row := (ci*2+i)*8 + cj*4
				inner = append(inner, raw[2*row:2*row+8]...)
			}
			c := zst(inner)
			index = binary.LittleEndian.AppendUint64(index, uint64(len(shard)))
			index = binary.LittleEndian.AppendUint64(index, uint64(len(c)))
			shard = append(shard, c...)
		}
	}
	shard = append(shard, crc(index)...)

	v3 := func(dtype, codecs string) map[string][]byte {
		return map[string][]byte{"zarr.json": fmt.Appendf(nil, `{"zarr_format":3,"node_type":"array","shape":[4,8],"data_type":%q,
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4,8]}},"chunk_key_encoding":{"name":"default"},
"fill_value":0,"codecs":%s}`, dtype, codecs)}
	}
	v2 := func(dtype, order, compressor string) map[string][]byte {
		return map[string][]byte{".zarray": fmt.Appendf(nil, `{"zarr_format":2,"shape":[4,8],"chunks":[4,8],"dtype":%q,
"compressor":%s,"fill_value":0,"order":%q,"filters":null}`, dtype, compressor, order)}
	}
	le := `{"name":"bytes","configuration":{"endian":"little"}}`
	be := `{"name":"bytes","configuration":{"endian":"big"}}`
	k3, k2 := []string{"c/0/0"}, []string{"0.0"}
	return []pipeline{
		{"v3 zstd", v3("uint16", `[`+le+`,{"name":"zstd","configuration":{"level":1}}]`), k3, zst(raw)},
		{"v3 gzip crc32c", v3("uint16", `[`+le+`,{"name":"gzip","configuration":{"level":1}},{"name":"crc32c"}]`), k3, crc(gzipBytes(raw))},
		{"v3 big endian blosc", v3("uint16", `[`+be+`,{"name":"blosc","configuration":{"cname":"lz4","clevel":5,"shuffle":"shuffle","typesize":2,"blocksize":0}}]`), k3, blosc(swapped)},
		{"v3 transpose zstd", v3("uint16", `[{"name":"transpose","configuration":{"order":[1,0]}},`+le+`,{"name":"zstd","configuration":{"level":1}}]`), k3, zst(fortran)},
		{"v3 sharding", v3("uint16", `[{"name":"sharding_indexed","configuration":{"chunk_shape":[2,4],
"codecs":[`+le+`,{"name":"zstd","configuration":{"level":1}}],"index_codecs":[`+le+`,{"name":"crc32c"}],"index_location":"end"}}]`), k3, shard},
		{"v2 zlib", v2("<u2", "C", `{"id":"zlib","level":1}`), k2, zlibBytes(raw)},
		{"v2 gzip big endian", v2(">u2", "C", `{"id":"gzip","level":1}`), k2, gzipBytes(swapped)},
		{"v2 lz4 order F", v2("<u2", "F", `{"id":"lz4","acceleration":1}`), k2, lz(fortran)},
		{"v2 blosc", v2("<u2", "C", `{"id":"blosc","cname":"lz4","clevel":5,"shuffle":1,"blocksize":0}`), k2, blosc(raw)},
		{"v2 zstd", v2("<u2", "C", `{"id":"zstd","level":1}`), k2, zst(raw)},
	}
}

// Every pipeline's own chunk reads back as the values it encodes: the
// seeds of FuzzChunkDecode reach the decoders, not only their errors.
func TestPipelineSeeds(t *testing.T) {
	want := pipelineValues()
	for _, p := range pipelines(t) {
		t.Run(p.name, func(t *testing.T) {
			files := map[string][]byte{}
			for k, v := range p.meta {
				files[k] = v
			}
			for _, k := range p.keys {
				files[k] = p.chunk
			}
			h, got := readAll(t, files)
			if h == nil || len(h.Arrays) != 1 || h.Arrays[0].Unsupported != "" {
				t.Fatalf("not one supported array: %v", h)
			}
			if !bytes.Equal(got[""], want) {
				t.Fatalf("read % x, want % x", got[""], want)
			}
			readPart(t, files, got, true)
		})
	}
}

// FuzzChunkDecode feeds arbitrary chunk bytes through every pipeline
// above (and those of the tensorstore fixtures, when they can be made): reads succeed
// or fail with a known ChunkError, and each pipeline's own chunk reads
// back exactly.
func FuzzChunkDecode(f *testing.F) {
	ps := pipelines(f)
	for i, p := range ps {
		f.Add(uint8(i), p.chunk)
	}
	for _, d := range fixtureDocs("zarr.json") {
		ps = append(ps, pipeline{name: "fixture", meta: map[string][]byte{"zarr.json": d}, keys: []string{"c/0", "c/0/0", "c/0/0/0", "c/0/0/0/0", "c.0.0"}})
	}
	for _, d := range fixtureDocs(".zarray") {
		ps = append(ps, pipeline{name: "fixture", meta: map[string][]byte{".zarray": d}, keys: []string{"0", "0.0", "0.0.0", "0/0/0"}})
	}
	f.Add(uint8(0), []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0})
	f.Add(uint8(2), []byte{2, 1, 0x21, 4, 16, 0, 0, 0, 16, 0, 0, 0, 32, 0, 0, 0})
	want := pipelineValues()
	f.Fuzz(func(t *testing.T, which uint8, chunk []byte) {
		p := ps[int(which)%len(ps)]
		files := map[string][]byte{}
		for k, v := range p.meta {
			files[k] = v
		}
		for _, k := range p.keys {
			files[k] = chunk
		}
		h, got := readAll(t, files)
		if p.chunk != nil && bytes.Equal(chunk, p.chunk) && !bytes.Equal(got[""], want) {
			t.Fatalf("%s: its own chunk did not read back (open: %v)", p.name, h != nil)
		}
	})
}
