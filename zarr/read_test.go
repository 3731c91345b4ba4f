package zarr_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/fixtures"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// shardedStore builds a v3 array of uint16 shaped (8, 64) in one shard of
// (8, 64) with inner chunks (2, 16), values i*64+j, inner chunks zstd
// compressed, index at the end with crc32c. Inner chunk (1, 2) is left
// empty (all-ones marker).
func shardedStore(t testing.TB, indexAtStart bool) (map[string][]byte, []byte) {
	enc, _ := zstd.NewWriter(nil)
	want := make([]byte, 8*64*2)
	for i := range 8 * 64 {
		binary.LittleEndian.PutUint16(want[2*i:], uint16(i))
	}
	const gi, gj = 4, 4
	var body []byte
	index := make([]byte, gi*gj*16)
	idxLen := int64(len(index) + 4)
	base := int64(0)
	if indexAtStart {
		base = idxLen
	}
	for ci := range gi {
		for cj := range gj {
			lin := ci*gj + cj
			if ci == 1 && cj == 2 {
				binary.LittleEndian.PutUint64(index[lin*16:], ^uint64(0))
				binary.LittleEndian.PutUint64(index[lin*16+8:], ^uint64(0))
				for i := 2; i < 4; i++ {
					for j := 32; j < 48; j++ {
						binary.LittleEndian.PutUint16(want[2*(i*64+j):], 7) // fill value
					}
				}
				continue
			}
			raw := make([]byte, 2*16*2)
			for i := range 2 {
				for j := range 16 {
					v := uint16((ci*2+i)*64 + cj*16 + j)
					binary.LittleEndian.PutUint16(raw[2*(i*16+j):], v)
				}
			}
			c := enc.EncodeAll(raw, nil)
			binary.LittleEndian.PutUint64(index[lin*16:], uint64(base+int64(len(body))))
			binary.LittleEndian.PutUint64(index[lin*16+8:], uint64(len(c)))
			body = append(body, c...)
		}
	}
	index = binary.LittleEndian.AppendUint32(index, crc32.Checksum(index, castagnoli))
	var shard []byte
	loc := "end"
	if indexAtStart {
		shard = append(append(shard, index...), body...)
		loc = "start"
	} else {
		shard = append(append(shard, body...), index...)
	}
	meta := `{"zarr_format":3,"node_type":"array","shape":[8,64],"data_type":"uint16",
	"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[8,64]}},
	"chunk_key_encoding":{"name":"default"},"fill_value":7,
	"codecs":[{"name":"sharding_indexed","configuration":{"chunk_shape":[2,16],
	  "codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1}}],
	  "index_codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"crc32c"}],
	  "index_location":"` + loc + `"}}]}`
	return map[string][]byte{"zarr.json": []byte(meta), "c/0/0": shard}, want
}

func openMem(t testing.TB, files map[string][]byte) (*zarr.Hierarchy, *memStore) {
	t.Helper()
	st := newMemStore(files)
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	return h, st
}

func read(h *zarr.Hierarchy, a *zarr.Array, start, count []int64) ([]byte, error) {
	n := int64(a.DType.Size)
	for _, c := range count {
		n *= c
	}
	dst := make([]byte, n)
	err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: start, Count: count, Dst: dst}})
	return dst, err
}

func TestShardPartialRead(t *testing.T) {
	for _, atStart := range []bool{false, true} {
		t.Run(map[bool]string{false: "index at end", true: "index at start"}[atStart], func(t *testing.T) {
			files, want := shardedStore(t, atStart)
			h, st := openMem(t, files)
			a := h.Array("")
			st.gets.Store(0)
			// Rows 0..1, columns 10..20: inner chunks (0,0) and (0,1).
			got, err := read(h, a, []int64{0, 10}, []int64{2, 11})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				row := want[2*(i*64+10) : 2*(i*64+21)]
				if !bytes.Equal(got[i*22:(i+1)*22], row) {
					t.Fatalf("row %d differs", i)
				}
			}
			if g, r := st.gets.Load(), st.ranges.Load(); g != 0 || r != 3 {
				t.Errorf("fetched with %d whole gets and %d range gets; want 0 and 3 (index + 2 inner chunks)", g, r)
			}
			// The whole array, the empty inner chunk included.
			got, err = read(h, a, []int64{0, 0}, []int64{8, 64})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("whole array differs")
			}
		})
	}
}

func TestHostileShard(t *testing.T) {
	cases := map[string]func(shard []byte) []byte{
		"offset past the end": func(s []byte) []byte {
			idx := s[len(s)-4-16*16 : len(s)-4]
			binary.LittleEndian.PutUint64(idx[0:], 1<<40)
			binary.LittleEndian.PutUint32(s[len(s)-4:], crc32.Checksum(idx, castagnoli))
			return s
		},
		"huge length": func(s []byte) []byte {
			idx := s[len(s)-4-16*16 : len(s)-4]
			binary.LittleEndian.PutUint64(idx[8:], 1<<50)
			binary.LittleEndian.PutUint32(s[len(s)-4:], crc32.Checksum(idx, castagnoli))
			return s
		},
		"index checksum": func(s []byte) []byte { s[len(s)-10] ^= 0xff; return s },
		"truncated":      func(s []byte) []byte { return s[:100] },
		"corrupt chunk":  func(s []byte) []byte { s[3] ^= 0x55; s[9] ^= 0x55; return s },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			files, _ := shardedStore(t, false)
			files["c/0/0"] = mutate(append([]byte(nil), files["c/0/0"]...))
			h, _ := openMem(t, files)
			_, err := read(h, h.Array(""), []int64{0, 0}, []int64{8, 64})
			if err == nil {
				t.Fatal("read of a damaged shard succeeded")
			}
			var ce *zarr.ChunkError
			if !errors.As(err, &ce) || !strings.HasPrefix(ce.Key, "c/0/0") {
				t.Errorf("error %v does not name the chunk", err)
			}
			if !errors.Is(err, codec.ErrCorrupt) && !errors.Is(err, zarr.ErrChecksum) && !errors.Is(err, codec.ErrCorrupt) {
				t.Errorf("error %v is neither a corrupt chunk nor a checksum mismatch", err)
			}
		})
	}
}

// A shard whose index is intact but whose stored checksum is wrong is
// refused as a checksum error: the offsets alone would read fine, so only
// the comparison itself can fail the read. Both index locations, and the
// same shard with the right checksum reads.
func TestShardIndexChecksum(t *testing.T) {
	for _, atStart := range []bool{false, true} {
		t.Run(map[bool]string{false: "index at end", true: "index at start"}[atStart], func(t *testing.T) {
			files, want := shardedStore(t, atStart)
			h, _ := openMem(t, files)
			if got, err := read(h, h.Array(""), []int64{0, 0}, []int64{8, 64}); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("intact shard: %v", err)
			}
			shard := append([]byte(nil), files["c/0/0"]...)
			crc := len(shard) - 4 // the index's crc32c, after its 16 entries
			if atStart {
				crc = 16 * 16
			}
			shard[crc] ^= 0x01
			files["c/0/0"] = shard
			h, _ = openMem(t, files)
			_, err := read(h, h.Array(""), []int64{0, 0}, []int64{8, 64})
			if !errors.Is(err, zarr.ErrChecksum) {
				t.Fatalf("shard with a wrong index checksum: %v, want a checksum error", err)
			}
			var ce *zarr.ChunkError
			if !errors.As(err, &ce) || ce.Key != "c/0/0" {
				t.Errorf("error %v does not name the shard", err)
			}
		})
	}
}

func TestChecksumMismatch(t *testing.T) {
	raw := make([]byte, 16)
	for i := range raw {
		raw[i] = byte(i)
	}
	chunk := binary.LittleEndian.AppendUint32(append([]byte(nil), raw...), crc32.Checksum(raw, castagnoli)^1)
	files := map[string][]byte{
		"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":[16],"data_type":"uint8",
		"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[16]}},"chunk_key_encoding":{"name":"default"},
		"fill_value":0,"codecs":[{"name":"bytes"},{"name":"crc32c"}]}`),
		"c/0": chunk,
	}
	h, _ := openMem(t, files)
	_, err := read(h, h.Array(""), []int64{0}, []int64{16})
	if !errors.Is(err, zarr.ErrChecksum) {
		t.Fatalf("got %v, want a checksum error", err)
	}
}

// A chunk that decompresses to more than its metadata says is refused.
func TestOversizedChunk(t *testing.T) {
	enc, _ := zstd.NewWriter(nil)
	files := map[string][]byte{
		"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":[16],"data_type":"uint8",
		"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[16]}},"chunk_key_encoding":{"name":"default"},
		"fill_value":0,"codecs":[{"name":"bytes"},{"name":"zstd","configuration":{"level":1}}]}`),
		"c/0": enc.EncodeAll(make([]byte, 1<<20), nil),
	}
	h, _ := openMem(t, files)
	_, err := read(h, h.Array(""), []int64{0}, []int64{16})
	if !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("got %v, want a corrupt-chunk error", err)
	}
}

// Unknown codecs and filters leave only that array out.
func TestUnsupportedArrays(t *testing.T) {
	dir := t.TempDir()
	write := func(p, s string) {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755)
		os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644)
	}
	write(".zgroup", `{"zarr_format":2}`)
	write("ok/.zarray", `{"zarr_format":2,"shape":[4],"chunks":[4],"dtype":"<i4","compressor":null,"fill_value":3,"order":"C","filters":null}`)
	write("delta/.zarray", `{"zarr_format":2,"shape":[4],"chunks":[4],"dtype":"<i4","compressor":null,"fill_value":0,"order":"C","filters":[{"id":"delta","dtype":"<i4"}]}`)
	write("bad/.zarray", `{"zarr_format":2,"shape":[4],`)
	write("ragged/.zarray", `{"zarr_format":2,"shape":[4],"chunks":[4],"dtype":"|O","compressor":null,"fill_value":0,"order":"C","filters":null}`)
	write("snappy/.zarray", `{"zarr_format":2,"shape":[4],"chunks":[4],"dtype":"<i4","compressor":{"id":"blosc","cname":"snappy","clevel":5,"shuffle":1},"fill_value":0,"order":"C","filters":null}`)
	st, err := openPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	h, err := zarr.Open(context.Background(), st, zarr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"bad": "invalid metadata", "delta": "filter", "ragged": "data type", "snappy": "snappy", "ok": ""}
	for p, frag := range want {
		a := h.Array(p)
		if a == nil {
			t.Fatalf("array %s missing", p)
		}
		if frag == "" && a.Unsupported != "" || frag != "" && !strings.Contains(a.Unsupported, frag) {
			t.Errorf("%s: unsupported %q, want it to mention %q", p, a.Unsupported, frag)
		}
	}
	got, err := read(h, h.Array("ok"), []int64{0}, []int64{4})
	if err != nil || binary.LittleEndian.Uint32(got) != 3 {
		t.Fatalf("the supported array did not read its fill value: %v %v", got, err)
	}
}

func TestFloat16(t *testing.T) {
	for _, f := range []float64{0, 1, -2.5, 65504, 1e-7, 6e-8, math.Inf(1), 0.1, 3.14159} {
		h := zarr.Float16Bits(f)
		back := zarr.Float16Value(h)
		if math.Abs(back-f) > math.Abs(f)*1e-3+6e-8 && !math.IsInf(f, 0) {
			t.Errorf("%g -> %#04x -> %g", f, h, back)
		}
	}
	if zarr.Float16Bits(1) != 0x3c00 || zarr.Float16Bits(-2) != 0xc000 || zarr.Float16Bits(65520) != 0x7c00 {
		t.Error("float16 bit patterns wrong")
	}
}

type mapCache struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (c *mapCache) Get(k string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[k]
	return b, ok
}

func (c *mapCache) Put(k string, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[k] = b
}

// The source cache receives bytes only once they decoded, and serves them
// afterwards without touching the store.
func TestSourceCacheKeepsOnlyVerifiedBytes(t *testing.T) {
	files, want := shardedStore(t, false)
	good := files["c/0/0"]
	bad := append([]byte(nil), good...)
	bad[3] ^= 0x55
	bad[9] ^= 0x55
	files["c/0/0"] = bad
	st := newMemStore(files)
	sc := &mapCache{m: map[string][]byte{}}
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1, SourceCache: sc})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := read(h, h.Array(""), []int64{0, 0}, []int64{8, 64}); err == nil {
		t.Fatal("corrupt shard read without error")
	}
	for k := range sc.m {
		if !strings.HasSuffix(k, "-260") { // only the checksummed index may be kept
			t.Fatalf("a corrupt chunk reached the source cache: %q", k)
		}
	}
	st.mu.Lock()
	st.files["c/0/0"] = good
	st.mu.Unlock()
	got, err := read(h, h.Array(""), []int64{0, 0}, []int64{8, 64})
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("good shard: %v", err)
	}
	before := st.ranges.Load() + st.gets.Load()
	got, err = read(h, h.Array(""), []int64{0, 0}, []int64{8, 64})
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("cached read: %v", err)
	}
	if after := st.ranges.Load() + st.gets.Load(); after != before {
		t.Errorf("cached read went to the store %d times", after-before)
	}
}

// Metadata that once crashed or misread: each array is left out with a
// reason (or the entry ignored), nothing panics, the rest still opens.
func TestHostileMetadata(t *testing.T) {
	arr := func(codecs, shape string) string {
		return `{"zarr_format":3,"node_type":"array","shape":` + shape + `,"data_type":"uint8",
		"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2,2]}},"chunk_key_encoding":{"name":"default"},
		"fill_value":0,"codecs":` + codecs + `}`
	}
	shard := `{"name":"sharding_indexed","configuration":{"chunk_shape":[1,1],"codecs":[{"name":"bytes"}]}}`
	cases := map[string]struct{ doc, reason string }{
		"index codecs sharded": {arr(`[{"name":"sharding_indexed","configuration":{"chunk_shape":[1,1],"codecs":[{"name":"bytes"}],
			"index_codecs":[{"name":"sharding_indexed","configuration":{"chunk_shape":[1,1]}}]}}]`, "[4,4]"), "index_codecs"},
		"codec after sharding": {arr(`[`+shard+`,{"name":"crc32c"}]`, "[4,4]"), "after sharding_indexed"},
		"two compressors":      {arr(`[{"name":"bytes"},{"name":"zstd"},{"name":"gzip"}]`, "[4,4]"), "more than one compression"},
		"overflowing shape":    {arr(`[{"name":"bytes"}]`, "[9007199254740992,2048]"), "more than"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			h, _ := openMem(t, map[string][]byte{"zarr.json": []byte(c.doc)})
			if a := h.Array(""); a == nil || !strings.Contains(a.Unsupported, c.reason) {
				t.Fatalf("array: %+v, want unsupported mentioning %q", a, c.reason)
			}
		})
	}
	t.Run("consolidated paths", func(t *testing.T) {
		ok := arr(`[{"name":"bytes"}]`, "[4,4]")
		root := `{"zarr_format":3,"node_type":"group","consolidated_metadata":{"kind":"inline","metadata":{
			"a//b":` + ok + `,"c/../d":` + ok + `,"./e":` + ok + `,"/f":` + ok + `,"g":` + ok + `}}}`
		h, _ := openMem(t, map[string][]byte{"zarr.json": []byte(root)})
		if len(h.Arrays) != 1 || h.Arrays[0].Path != "g" {
			var paths []string
			for _, a := range h.Arrays {
				paths = append(paths, a.Path)
			}
			t.Fatalf("arrays %q, want only g", paths)
		}
	})
}

// lender is a CPU decoder that lends memory (as the GPU decoder does) and
// tracks it, so that a test can see every buffer come back.
type lender struct {
	*codec.CPU
	mu     sync.Mutex
	lent   map[*byte]int
	allocs int
}

func (l *lender) HostAlloc(n int) []byte {
	b := make([]byte, n, n+100) // spare capacity, as the GPU's size classes have
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lent[&b[0]] = n
	l.allocs++
	return b
}

func (l *lender) HostFree(b []byte) {
	if cap(b) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.lent, &b[:1][0])
}

// Retain holds nothing: the tests' reads give each buffer back once.
func (l *lender) Retain([]byte) bool { return false }

// TestLentMemory reads every fixture array with a decoder that lends
// memory: compressed chunks are read into it, every buffer comes back, and
// the values are those read without lending.
func TestLentMemory(t *testing.T) {
	root := fixtures.Tensorstore(t)
	dirs, err := filepath.Glob(filepath.Join(root, "*"))
	if err != nil {
		t.Fatal(err)
	}
	l := &lender{CPU: must(codec.NewCPU(codec.Options{})), lent: map[*byte]int{}}
	defer l.Close()
	arrays := 0
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		plain := openStore(t, dir)
		st, err := objectstore.OpenPosix(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		h, err := zarr.Open(context.Background(), st, zarr.Options{Decoder: l})
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range h.Arrays {
			if a.Unsupported != "" {
				continue
			}
			want, ok := readRegion(t, plain, plain.Arrays[i], make([]int64, len(a.Shape)), a.Shape)
			got, ok2 := readRegion(t, h, a, make([]int64, len(a.Shape)), a.Shape)
			if ok && ok2 && !bytes.Equal(got, want) {
				t.Errorf("%s/%s: values differ when read through lent memory", filepath.Base(dir), a.Path)
			}
			arrays++
		}
	}
	if l.allocs == 0 {
		t.Fatalf("no chunk was read into lent memory (%d arrays)", arrays)
	}
	if len(l.lent) != 0 {
		t.Errorf("%d of %d lent buffers not given back", len(l.lent), l.allocs)
	}
	t.Logf("%d arrays, %d chunks read into lent memory", arrays, l.allocs)
}
