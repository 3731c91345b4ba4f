package zarr_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
	"github.com/zarrfs/zarrfs/zarr"
)

// A pressure-level array as ERA5 stores keep it, small: (time 2, level 37,
// 64, 128) float32 in chunks of one time step, every level in one chunk of
// 1.2 MB, each level 32 KiB.
const (
	plLevels = 37
	plY, plX = 64, 128
	plLevel  = plY * plX * 4
	plChunk  = plLevels * plLevel
)

// bloscRaw frames data as c-blosc does with byte shuffle and blocks of
// blocksize, every stream stored raw (its size equal to its decoded size),
// split in typesize streams per block unless noSplit: the offsets are
// then known exactly.
func bloscRaw(data []byte, typesize, blocksize int, noSplit bool) []byte {
	n := len(data)
	nblocks := (n + blocksize - 1) / blocksize
	flags := byte(0x01) // byte shuffle
	if noSplit {
		flags |= 0x10
	}
	hdr := make([]byte, 16+4*nblocks)
	hdr[0], hdr[1], hdr[2], hdr[3] = 2, 1, flags, byte(typesize)
	binary.LittleEndian.PutUint32(hdr[4:], uint32(n))
	binary.LittleEndian.PutUint32(hdr[8:], uint32(blocksize))
	var body []byte
	for i := range nblocks {
		blk := data[i*blocksize : min(n, (i+1)*blocksize)]
		sh := make([]byte, len(blk))
		m := len(blk) / typesize
		for e := range m {
			for b := range typesize {
				sh[b*m+e] = blk[e*typesize+b]
			}
		}
		copy(sh[m*typesize:], blk[m*typesize:])
		binary.LittleEndian.PutUint32(hdr[16+4*i:], uint32(len(hdr)+len(body)))
		ns := 1
		if !noSplit && len(blk) == blocksize && m >= 128 {
			ns = typesize
		}
		ne := len(blk) / ns
		for j := range ns {
			body = binary.LittleEndian.AppendUint32(body, uint32(ne))
			body = append(body, sh[j*ne:(j+1)*ne]...)
		}
	}
	out := append(hdr, body...)
	binary.LittleEndian.PutUint32(out[12:], uint32(len(out)))
	return out
}

// plValues is chunk t's decoded bytes.
func plValues(t int) []byte {
	b := make([]byte, plChunk)
	for i := range plChunk / 4 {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(t*1e7+i)))
	}
	return b
}

// plStore is the array as v2 files (consolidated, for HTTP too), its
// chunks blosc framed (or raw when compressor is "null").
func plStore(compressor string, frame func([]byte) []byte) map[string][]byte {
	zarray := `{"zarr_format":2,"shape":[2,37,64,128],"chunks":[1,37,64,128],"dtype":"<f4","compressor":` + compressor +
		`,"filters":null,"fill_value":0,"order":"C"}`
	zattrs := `{"_ARRAY_DIMENSIONS":["time","level","y","x"]}`
	files := map[string][]byte{
		".zgroup": []byte(`{"zarr_format":2}`), "pl/.zarray": []byte(zarray), "pl/.zattrs": []byte(zattrs),
		".zmetadata": []byte(`{"zarr_consolidated_format":1,"metadata":{".zgroup":{"zarr_format":2},"pl/.zarray":` + zarray + `,"pl/.zattrs":` + zattrs + `}}`),
	}
	for t := range 2 {
		files["pl/"+itoa(t)+".0.0.0"] = frame(plValues(t))
	}
	return files
}

const bloscMeta = `{"id":"blosc","cname":"lz4","clevel":5,"shuffle":1,"blocksize":0}`

func bloscPL() map[string][]byte {
	return plStore(bloscMeta, func(b []byte) []byte { return bloscRaw(b, 4, 65536, false) })
}

// levels is one request per run of adjacent levels of time step t.
func levels(a *zarr.Array, t int64, lv ...int64) []zarr.Request {
	var reqs []zarr.Request
	for i := 0; i < len(lv); {
		j := i + 1
		for j < len(lv) && lv[j] == lv[j-1]+1 {
			j++
		}
		n := int64(j - i)
		reqs = append(reqs, zarr.Request{Array: a, Start: []int64{t, lv[i], 0, 0}, Count: []int64{1, n, plY, plX}, Dst: make([]byte, n*plLevel)})
		i = j
	}
	return reqs
}

func wantLevels(t int, lv ...int64) []byte {
	all := plValues(t)
	var out []byte
	for _, l := range lv {
		out = append(out, all[l*plLevel:(l+1)*plLevel]...)
	}
	return out
}

func gotLevels(reqs []zarr.Request) []byte {
	var out []byte
	for _, r := range reqs {
		out = append(out, r.Dst...)
	}
	return out
}

func openWith(t *testing.T, st objectstore.Store, opts zarr.Options) *zarr.Hierarchy {
	t.Helper()
	opts.Stats = &zarr.Stats{}
	h, err := zarr.Open(context.Background(), st, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// A few levels of a remote blosc chunk cost its index and the blocks that
// hold them; reading whole is the switch's other side, and both give the
// chunk's values.
func TestPartialReadFetchesItsBlocks(t *testing.T) {
	ctx := context.Background()
	files := bloscPL()
	whole := int64(len(files["pl/1.0.0.0"]))
	for _, tc := range []struct {
		name     string
		lv       []int64
		partial  bool
		requests int64
		most     float64 // of the chunk's stored bytes
	}{
		{"two adjacent levels", []int64{3, 4}, true, 2, 0.12},
		{"first level", []int64{0}, true, 2, 0.06},
		{"last level, the short last block", []int64{36}, true, 2, 0.06},
		{"scattered levels", []int64{0, 18, 36}, true, 4, 0.17},
		{"thirteen of 37", []int64{1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 36}, true, 0, 0.75},
		{"most levels: read whole", []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30}, false, 1, 1.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newMemStore(files)
			h := openWith(t, st, zarr.Options{ChunkCacheBytes: -1})
			reqs := levels(h.Array("pl"), 1, tc.lv...)
			if err := h.Read(ctx, nil, reqs); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotLevels(reqs), wantLevels(1, tc.lv...)) {
				t.Fatal("values differ from the chunk's")
			}
			s := h.Stats()
			if got := s.ChunksPartial.Load() == 1; got != tc.partial {
				t.Fatalf("read in part: %v, want %v", got, tc.partial)
			}
			if n := s.Requests.Load(); tc.requests > 0 && n != tc.requests {
				t.Errorf("%d requests, want %d", n, tc.requests)
			}
			if f := float64(s.BytesFetched.Load()) / float64(whole); f > tc.most {
				t.Errorf("fetched %.3f of the chunk, want at most %.2f", f, tc.most)
			}
			// The peer: every chunk whole.
			hw := openWith(t, newMemStore(files), zarr.Options{ChunkCacheBytes: -1, Partial: zarr.PartialNever})
			wr := levels(hw.Array("pl"), 1, tc.lv...)
			if err := hw.Read(ctx, nil, wr); err != nil {
				t.Fatal(err)
			}
			if hw.Stats().ChunksPartial.Load() != 0 || hw.Stats().BytesFetched.Load() != whole {
				t.Errorf("PartialNever: %d partial, %d bytes of %d", hw.Stats().ChunksPartial.Load(), hw.Stats().BytesFetched.Load(), whole)
			}
			if !bytes.Equal(gotLevels(wr), gotLevels(reqs)) {
				t.Error("whole and partial reads differ")
			}
		})
	}
}

// Blocks unsplit, and chunks stored without compression (big endian too,
// swapped after their ranges are read).
func TestPartialReadOtherLayouts(t *testing.T) {
	ctx := context.Background()
	for name, files := range map[string]map[string][]byte{
		"unsplit blocks": plStore(bloscMeta, func(b []byte) []byte { return bloscRaw(b, 4, 40000, true) }),
		"raw":            plStore("null", func(b []byte) []byte { return b }),
		"big endian raw": func() map[string][]byte {
			f := plStore("null", func(b []byte) []byte {
				c := bytes.Clone(b)
				for i := 0; i < len(c); i += 4 {
					binary.BigEndian.PutUint32(c[i:], binary.LittleEndian.Uint32(c[i:]))
				}
				return c
			})
			f["pl/.zarray"] = bytes.Replace(f["pl/.zarray"], []byte(`"<f4"`), []byte(`">f4"`), 1)
			f[".zmetadata"] = bytes.Replace(f[".zmetadata"], []byte(`"<f4"`), []byte(`">f4"`), 1)
			return f
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			h := openWith(t, newMemStore(files), zarr.Options{ChunkCacheBytes: -1})
			lv := []int64{0, 5, 6, 36}
			reqs := levels(h.Array("pl"), 0, lv...)
			if err := h.Read(ctx, nil, reqs); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotLevels(reqs), wantLevels(0, lv...)) {
				t.Fatal("values differ from the chunk's")
			}
			if h.Stats().ChunksPartial.Load() != 1 || h.Stats().BytesFetched.Load() > int64(plChunk)/4 {
				t.Fatalf("%d chunks in part, %d bytes fetched", h.Stats().ChunksPartial.Load(), h.Stats().BytesFetched.Load())
			}
		})
	}
}

// On a local store a whole read is cheap: only a selection of at most half
// the chunk is read in part.
func TestPartialLocalRule(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pl.zarr")
	webtest.WriteFiles(t, dir, bloscPL())
	px, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	for _, tc := range []struct {
		n       int64
		partial bool
	}{{10, true}, {18, true}, {20, false}} {
		h := openWith(t, px, zarr.Options{ChunkCacheBytes: -1})
		var lv []int64
		for i := range tc.n {
			lv = append(lv, i)
		}
		reqs := levels(h.Array("pl"), 0, lv...)
		if err := h.Read(context.Background(), nil, reqs); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gotLevels(reqs), wantLevels(0, lv...)) {
			t.Fatal("values differ")
		}
		if got := h.Stats().ChunksPartial.Load() == 1; got != tc.partial {
			t.Errorf("%d of 37 levels from disk: in part %v, want %v", tc.n, got, tc.partial)
		}
	}
}

// What partial reads fetch is kept in the source cache under the chunk's
// ranges, read back without a request, and never stands in for the whole
// chunk.
func TestPartialSourceCache(t *testing.T) {
	ctx := context.Background()
	files := bloscPL()
	cache := &mapCache{m: map[string][]byte{}}
	h := openWith(t, newMemStore(files), zarr.Options{ChunkCacheBytes: -1, SourceCache: cache})
	if err := h.Read(ctx, nil, levels(h.Array("pl"), 1, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if len(cache.m) != 2 {
		t.Fatalf("%d cache entries, want the index and one range", len(cache.m))
	}
	h2 := openWith(t, newMemStore(files), zarr.Options{ChunkCacheBytes: -1, SourceCache: cache})
	reqs := levels(h2.Array("pl"), 1, 3, 4)
	if err := h2.Read(ctx, nil, reqs); err != nil {
		t.Fatal(err)
	}
	if n := h2.Stats().Requests.Load(); n != 0 || !bytes.Equal(gotLevels(reqs), wantLevels(1, 3, 4)) {
		t.Fatalf("again from the cache: %d requests", n)
	}
	h3 := openWith(t, newMemStore(files), zarr.Options{ChunkCacheBytes: -1, SourceCache: cache, Partial: zarr.PartialNever})
	all := levels(h3.Array("pl"), 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36)
	if err := h3.Read(ctx, nil, all); err != nil {
		t.Fatal(err)
	}
	if n := h3.Stats().Requests.Load(); n != 1 || !bytes.Equal(gotLevels(all), plValues(1)) {
		t.Fatalf("the whole chunk: %d requests", n)
	}
	// Now the whole chunk is cached: a partial selection reads it from there.
	h4 := openWith(t, newMemStore(files), zarr.Options{ChunkCacheBytes: -1, SourceCache: cache})
	r4 := levels(h4.Array("pl"), 1, 20)
	if err := h4.Read(ctx, nil, r4); err != nil || h4.Stats().Requests.Load() != 0 || h4.Stats().ChunksPartial.Load() != 0 {
		t.Fatalf("%v: %d requests, %d partial", err, h4.Stats().Requests.Load(), h4.Stats().ChunksPartial.Load())
	}
	if !bytes.Equal(gotLevels(r4), wantLevels(1, 20)) {
		t.Fatal("values differ")
	}
}

// A header that points outside the object, a block table past its end, a
// short response: the chunk fails with an error naming it, the other
// chunk still reads, and nothing is cached.
func TestPartialHostile(t *testing.T) {
	ctx := context.Background()
	good := bloscPL()["pl/1.0.0.0"]
	put := func(off int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	nblocks := (plChunk + 65535) / 65536
	for _, tc := range []struct {
		name  string
		chunk []byte
		lv    []int64
	}{
		{"truncated object", good[:len(good)-70000], []int64{36}},
		{"block offset past the object", put(16+4*3, uint32(len(good)+10)), []int64{3}},
		{"block offset into the table", put(16+4*3, 20), []int64{3}},
		{"frame size beyond its data", put(12, uint32(plChunk*2)), []int64{3}},
		{"block table past the object", good[:16+4*nblocks-8], []int64{3}},
		{"other decoded size", put(4, plChunk-4), []int64{3}},
		{"stream size past its block", put(int(binary.LittleEndian.Uint32(good[16+4*1:])), 1<<20), []int64{3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := bloscPL()
			files["pl/1.0.0.0"] = tc.chunk
			cache := &mapCache{m: map[string][]byte{}}
			h := openWith(t, newMemStore(files), zarr.Options{ChunkCacheBytes: -1, SourceCache: cache})
			a := h.Array("pl")
			err := h.Read(ctx, nil, levels(a, 1, tc.lv...))
			var ce *zarr.ChunkError
			if !errors.As(err, &ce) || ce.Key != "pl/1.0.0.0" || !(errors.Is(err, codec.ErrCorrupt) || errors.Is(err, codec.ErrCorrupt)) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %v; want one line, a corrupt chunk naming pl/1.0.0.0", err)
			}
			if len(cache.m) != 0 {
				t.Fatalf("%d entries cached from a failed read", len(cache.m))
			}
			reqs := levels(a, 0, tc.lv...)
			if err := h.Read(ctx, nil, reqs); err != nil || !bytes.Equal(gotLevels(reqs), wantLevels(0, tc.lv...)) {
				t.Fatalf("the other chunk: %v", err)
			}
		})
	}
}

// Over HTTP: a server that ignores Range (200, the whole object) still
// serves the right bytes; one that cuts ranged responses short fails the
// chunk, and nothing of it is cached.
func TestPartialOverHTTP(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	webtest.WriteFiles(t, dir, bloscPL())
	srv := webtest.Start(t, dir)
	st, err := objectstore.OpenHTTP(ctx, srv.URL, objectstore.HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lv := []int64{2, 17, 30}
	for _, mode := range []string{"ranges", "range ignored", "short ranges"} {
		t.Run(mode, func(t *testing.T) {
			srv.IgnoreRange.Store(mode == "range ignored")
			srv.ShortRanges.Store(mode == "short ranges")
			cache := &mapCache{m: map[string][]byte{}}
			h := openWith(t, st, zarr.Options{ChunkCacheBytes: -1, SourceCache: cache})
			ranged := srv.Ranged()
			reqs := levels(h.Array("pl"), 1, lv...)
			err := h.Read(ctx, nil, reqs)
			if mode == "short ranges" {
				var ce *zarr.ChunkError
				if !errors.As(err, &ce) || ce.Key != "pl/1.0.0.0" {
					t.Fatalf("err = %v; want an error naming pl/1.0.0.0", err)
				}
				if len(cache.m) != 0 {
					t.Fatalf("%d entries cached from short responses", len(cache.m))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotLevels(reqs), wantLevels(1, lv...)) {
				t.Fatal("values differ")
			}
			if h.Stats().ChunksPartial.Load() != 1 || srv.Ranged()-ranged < 4 {
				t.Fatalf("%d partial, %d ranged requests", h.Stats().ChunksPartial.Load(), srv.Ranged()-ranged)
			}
		})
	}
}

// Concurrent Reads of different selections of one chunk share nothing
// they should not.
func TestPartialConcurrent(t *testing.T) {
	files := bloscPL()
	h := openWith(t, newMemStore(files), zarr.Options{})
	var wg sync.WaitGroup
	for i := range int64(8) {
		wg.Go(func() {
			lv := []int64{i, i + 9, 36 - i}
			reqs := levels(h.Array("pl"), i%2, lv...)
			if err := h.Read(context.Background(), nil, reqs); err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(gotLevels(reqs), wantLevels(int(i%2), lv...)) {
				t.Errorf("levels %v differ", lv)
			}
		})
	}
	wg.Wait()
}

// A zstd chunk without checksums is fetched whole and decoded up to the
// selection's last byte when that is at most 3/4 of the chunk and the read
// takes the chunk's whole first dimension; otherwise it is decoded whole,
// and so is one with a frame checksum, and gzip and zlib (always
// checksummed). All give the chunk's values.
func TestPartialStream(t *testing.T) {
	zs, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(false))
	if err != nil {
		t.Fatal(err)
	}
	zsum, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		meta   string
		frame  func([]byte) []byte
		stream bool
	}{
		{`{"id":"zstd","level":3}`, func(b []byte) []byte { return zs.EncodeAll(b, nil) }, true},
		{`{"id":"zstd","level":3,"checksum":true}`, func(b []byte) []byte { return zsum.EncodeAll(b, nil) }, false},
		{`{"id":"gzip","level":1}`, gzipBytes, false},
		{`{"id":"zlib","level":1}`, zlibBytes, false},
	} {
		dir := filepath.Join(t.TempDir(), "pl.zarr")
		webtest.WriteFiles(t, dir, plStore(c.meta, c.frame))
		px, err := objectstore.OpenPosix(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			lv      []int64
			partial bool
		}{
			{[]int64{0, 1, 2, 3}, true},
			{[]int64{5, 9, 20, 26}, true},
			{[]int64{0, 30}, false}, // ends past 3/4 of the chunk
		} {
			h := openWith(t, px, zarr.Options{ChunkCacheBytes: -1})
			reqs := levels(h.Array("pl"), 1, tc.lv...)
			if err := h.Read(context.Background(), nil, reqs); err != nil {
				t.Fatalf("%s, levels %v: %v", c.meta, tc.lv, err)
			}
			if !bytes.Equal(gotLevels(reqs), wantLevels(1, tc.lv...)) {
				t.Fatalf("%s, levels %v: values differ", c.meta, tc.lv)
			}
			if got, want := h.Stats().ChunksPartial.Load() == 1, tc.partial && c.stream; got != want {
				t.Errorf("%s, levels %v: in part %v, want %v", c.meta, tc.lv, got, want)
			}
		}
		px.Close()
	}

	// Chunks of two time steps: a read of one step leaves the next
	// sample's half, so the chunk is decoded whole (and kept for it).
	both := append(plValues(0), plValues(1)...)
	zarray := `{"zarr_format":2,"shape":[2,37,64,128],"chunks":[2,37,64,128],"dtype":"<f4","compressor":{"id":"zstd","level":3},"filters":null,"fill_value":0,"order":"C"}`
	dir := filepath.Join(t.TempDir(), "two.zarr")
	webtest.WriteFiles(t, dir, map[string][]byte{".zgroup": []byte(`{"zarr_format":2}`), "pl/.zarray": []byte(zarray), "pl/0.0.0.0": zs.EncodeAll(both, nil)})
	px, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	h := openWith(t, px, zarr.Options{})
	reqs := levels(h.Array("pl"), 0, 0, 1)
	if err := h.Read(context.Background(), nil, reqs); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotLevels(reqs), wantLevels(0, 0, 1)) {
		t.Fatal("two-step chunk: values differ")
	}
	if n := h.Stats().ChunksPartial.Load(); n != 0 {
		t.Errorf("two-step chunk, one step read: %d chunks in part, want 0", n)
	}
}

// BenchmarkPartialStream reads the first 13 of 37 levels of zstd chunks
// from disk, decoding up to the selection's end (auto) or every chunk
// whole (never, the peer).
func BenchmarkPartialStream(b *testing.B) {
	zs, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(false))
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(b.TempDir(), "pl.zarr")
	webtest.WriteFiles(b, dir, plStore(`{"id":"zstd","level":3}`, func(v []byte) []byte { return zs.EncodeAll(v, nil) }))
	px, err := objectstore.OpenPosix(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer px.Close()
	lv := []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	for _, m := range []struct {
		name string
		mode zarr.PartialMode
	}{{"auto", zarr.PartialAuto}, {"whole", zarr.PartialNever}} {
		b.Run(m.name, func(b *testing.B) {
			h, err := zarr.Open(context.Background(), px, zarr.Options{ChunkCacheBytes: -1, Partial: m.mode})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			b.SetBytes(int64(len(lv)) * plLevel)
			for i := 0; b.Loop(); i++ {
				if err := h.Read(context.Background(), nil, levels(h.Array("pl"), int64(i%2), lv...)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
