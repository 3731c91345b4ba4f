package zarr_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// grownPosix is a store growStore wrote, of n steps in chunks of chunk,
// opened as a Posix store closed with the test, and its folder.
func grownPosix(t testing.TB, n, chunk int) (string, *objectstore.Posix) {
	t.Helper()
	dir := t.TempDir()
	growStore(t, dir, n, chunk, 0)
	px, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	return dir, px
}

// growStore writes a v3 uint32 array t of shape (n, 2) in chunks of
// (chunk, 2), element [i, j] = base + 2*i + j, raw little-endian bytes.
func growStore(t testing.TB, dir string, n, chunk int, base uint32) {
	t.Helper()
	doc := `{"zarr_format":3,"node_type":"array","shape":[` + itoa(n) + `,2],"data_type":"uint32",
 "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[` + itoa(chunk) + `,2]}},
 "chunk_key_encoding":{"name":"default"},"fill_value":7,
 "codecs":[{"name":"bytes","configuration":{"endian":"little"}}],"dimension_names":["time","x"]}`
	os.MkdirAll(filepath.Join(dir, "t", "c"), 0o755)
	os.WriteFile(filepath.Join(dir, "zarr.json"), []byte(`{"zarr_format":3,"node_type":"group"}`), 0o644)
	os.WriteFile(filepath.Join(dir, "t", "zarr.json"), []byte(doc), 0o644)
	for c := 0; c*chunk < n; c++ {
		b := make([]byte, chunk*2*4)
		for i := range chunk {
			for j := range 2 {
				binary.LittleEndian.PutUint32(b[(i*2+j)*4:], base+uint32(2*(c*chunk+i)+j))
			}
		}
		p := filepath.Join(dir, "t", "c", itoa(c), "0")
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// countingTier is a SourceCache in memory that counts its hits.
type countingTier struct {
	mu   sync.Mutex
	m    map[string][]byte
	hits int
}

func (c *countingTier) Get(k string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[k]
	if ok {
		c.hits++
	}
	return append([]byte(nil), b...), ok
}

func (c *countingTier) Put(k string, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[k] = append([]byte(nil), b...)
}

func readSample(t testing.TB, h *zarr.Hierarchy, k int64) ([]uint32, error) {
	a := h.Array("t")
	dst := make([]byte, 8)
	err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: []int64{k, 0}, Count: []int64{1, 2}, Dst: dst}})
	return []uint32{binary.LittleEndian.Uint32(dst), binary.LittleEndian.Uint32(dst[4:])}, err
}

// Once an array is listed, its reads agree with the listing: a chunk
// rewritten in place fails with ErrChanged until the array is listed again,
// a chunk written after the listing reads as missing without a request,
// and compressed bytes of a listed version come from the source cache
// without one. The store is a local one that, as S3, can list versions
// but not ask one (see TestLazyListing for the local kind).
// listsOnly is a store that tells versions by listing only, as S3 does.
type listsOnly struct {
	objectstore.Store
	objectstore.Versioned
}

func TestReadsFollowTheListing(t *testing.T) {
	dir := t.TempDir()
	growStore(t, dir, 4, 2, 0)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(dir, "t", "c", "0", "0"), old, old)
	posix, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer posix.Close()
	st := must(objectstore.WithRetry(listsOnly{posix, posix}, objectstore.RetryOptions{}))
	tier := &countingTier{m: map[string][]byte{}}
	openWith := func(sc zarr.SourceCache) *zarr.Hierarchy {
		o := zarr.Options{ChunkCacheBytes: -1}
		if sc != nil {
			o.SourceCache = sc
		}
		h, err := zarr.Open(context.Background(), st, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	open := func() *zarr.Hierarchy { return openWith(tier) }
	// Without a source cache, every read goes to the store.
	h := openWith(nil)
	a := h.Array("t")
	l1, err := h.List(context.Background(), a, time.Time{})
	if err != nil || l1 == nil || l1.Len() != 3 {
		t.Fatalf("listing: %v %v", l1, err)
	}
	if got, err := readSample(t, h, 1); err != nil || got[0] != 2 {
		t.Fatalf("sample 1: %v %v", got, err)
	}
	// Rewritten in place, same size.
	growStore(t, dir, 4, 2, 100)
	_, err = readSample(t, h, 1)
	if !errors.Is(err, zarr.ErrChanged) {
		t.Fatalf("read after a rewrite: %v, want ErrChanged", err)
	}
	if ce := (*zarr.ChunkError)(nil); !errors.As(err, &ce) || ce.Key != "t/c/0/0" {
		t.Errorf("error does not name the chunk: %v", err)
	}
	l2, err := h.List(context.Background(), a, l1.At)
	if err != nil || l2 == l1 {
		t.Fatalf("relisting: %v", err)
	}
	if got, err := readSample(t, h, 1); err != nil || got[0] != 102 {
		t.Fatalf("sample 1 after relisting: %v %v", got, err)
	}
	// The same listing asked for again is not listed again.
	if l, _ := h.List(context.Background(), a, time.Time{}); l != l2 {
		t.Error("listed again without need")
	}

	// Read once through the source cache; then a new hierarchy over the
	// unchanged store, listed: every chunk comes from the source cache.
	h1 := open()
	h1.List(context.Background(), h1.Array("t"), time.Time{})
	for k := range int64(4) {
		readSample(t, h1, k)
	}
	h2 := open()
	if _, err := h2.List(context.Background(), h2.Array("t"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	hits := tier.hits
	for k := range int64(4) {
		if _, err := readSample(t, h2, k); err != nil {
			t.Fatal(err)
		}
	}
	if n := h2.Stats().Requests.Load(); n != 0 || tier.hits-hits != 4 {
		t.Errorf("%d requests, %d cache hits for 4 samples of listed, cached chunks", n, tier.hits-hits)
	}

	// A chunk that appears after the listing (the store grew, the
	// metadata read before): fill value, no request.
	os.WriteFile(filepath.Join(dir, "t", "c", "1", "0"), []byte("garbage!garbage!"), 0o644)
	h3 := open()
	os.Remove(filepath.Join(dir, "t", "c", "1", "0"))
	h3.List(context.Background(), h3.Array("t"), time.Time{})
	os.WriteFile(filepath.Join(dir, "t", "c", "1", "0"), make([]byte, 16), 0o644)
	if got, err := readSample(t, h3, 2); err != nil || got[0] != 7 || h3.Stats().Requests.Load() != 0 {
		t.Errorf("chunk absent from the listing: %v %v, %d requests", got, err, h3.Stats().Requests.Load())
	}
}

func TestRegionChunks(t *testing.T) {
	_, st := grownPosix(t, 30, 24)
	h, err := zarr.Open(context.Background(), st, zarr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a := h.Array("t")
	for _, tt := range []struct {
		start, count []int64
		want         string
	}{
		{[]int64{3, 0}, []int64{1, 2}, "t/c/0/0"},
		{[]int64{25, 0}, []int64{1, 2}, "t/c/1/0"},
		{[]int64{0, 0}, []int64{30, 2}, "t/c/0/0 t/c/1/0"},
	} {
		got := a.RegionChunks(tt.start, tt.count)
		if s := strings.Join(got, " "); s != tt.want {
			t.Errorf("RegionChunks(%v, %v) = %q, want %q", tt.start, tt.count, s, tt.want)
		}
	}
}

// A sharded array read under a listing: the index and the inner chunks are
// ranges of one object, each checked against the listed version, and the
// result is the same as without a listing.
func TestShardedReadListed(t *testing.T) {
	files, want := shardedStore(t, false)
	dir := t.TempDir()
	for k, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(k))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, b, 0o644)
	}
	st, _ := objectstore.OpenPosix(dir)
	defer st.Close()
	h, err := zarr.Open(context.Background(), st, zarr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a := h.Arrays[0]
	if _, err := h.List(context.Background(), a, time.Time{}); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(want))
	if err := h.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: []int64{0, 0}, Count: []int64{8, 64}, Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	if string(dst) != string(want) {
		t.Error("sharded read under a listing differs")
	}
	if n := h.Stats().Requests.Load(); n < 2 {
		t.Errorf("%d requests: index and inner chunks not read", n)
	}
}

// A local store is listed lazily: the first version asked of a key stands
// for the listing's life, so a chunk rewritten after it was first read
// fails with ErrChanged, one written after the listing began but before it
// was first needed is read, and nothing is walked.
func TestLazyListing(t *testing.T) {
	dir := t.TempDir()
	growStore(t, dir, 4, 2, 0)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(dir, "t", "c", "0", "0"), old, old)
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.List(context.Background(), h.Array("t"), time.Time{})
	if err != nil || l.Len() != 0 {
		t.Fatalf("lazy listing: %v, %d keys asked", err, l.Len())
	}
	if got, err := readSample(t, h, 1); err != nil || got[0] != 2 || l.Len() != 1 {
		t.Fatalf("sample 1: %v %v, %d keys asked", got, err, l.Len())
	}
	growStore(t, dir, 4, 2, 100)
	if _, err := readSample(t, h, 1); !errors.Is(err, zarr.ErrChanged) {
		t.Errorf("read after a rewrite: %v, want ErrChanged", err)
	}
	if got, err := readSample(t, h, 3); err != nil || got[0] != 106 {
		t.Errorf("sample 3, first asked after the rewrite: %v %v", got, err)
	}
	v, ok, err := l.Version("t/c/9/0")
	if err != nil || ok || v != "" {
		t.Errorf("absent key: %q %v %v", v, ok, err)
	}
}

// gatedLister counts the listings in flight and fails the one of a named
// prefix.
type gatedLister struct {
	objectstore.Store
	objectstore.Versioned
	cur, peak, calls atomic.Int64
	fail             string
}

func (g *gatedLister) ListVersions(ctx context.Context, prefix string, fn func(k, v string)) error {
	n := g.cur.Add(1)
	defer g.cur.Add(-1)
	g.calls.Add(1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	time.Sleep(5 * time.Millisecond) // long enough for listings to overlap if nothing bounds them
	if strings.TrimSuffix(prefix, "/") == g.fail {
		return errors.New("listing refused")
	}
	return g.Versioned.ListVersions(ctx, prefix, fn)
}

// ListAll lists every array once, never more than par at a time, and
// returns the error of the listing that failed.
func TestListAll(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "zarr.json"), []byte(`{"zarr_format":3,"node_type":"group"}`), 0o644)
	for i := range 7 {
		growStore(t, filepath.Join(dir, "g"+itoa(i)), 4, 2, 0) // a group g<i> holding array t
	}
	posix, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer posix.Close()
	for _, fail := range []string{"", "g4/t"} {
		st := &gatedLister{Store: posix, Versioned: posix, fail: fail}
		h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Arrays) != 7 {
			t.Fatalf("%d arrays", len(h.Arrays))
		}
		err = h.ListAll(context.Background(), h.Arrays, 3)
		if fail == "" && err != nil || fail != "" && (err == nil || !strings.Contains(err.Error(), `array "g4/t": listing chunks: listing refused`)) {
			t.Errorf("fail %q: ListAll: %v", fail, err)
		}
		if got := st.calls.Load(); got != 7 {
			t.Errorf("fail %q: %d listings, want 7", fail, got)
		}
		if p := st.peak.Load(); p > 3 {
			t.Errorf("fail %q: %d listings at once, want 3 at most", fail, p)
		}
		for _, a := range h.Arrays {
			if (a.Listing() == nil) != (a.Path == fail) {
				t.Errorf("fail %q: %s listed: %v", fail, a.Path, a.Listing() != nil)
			}
		}
		// Listed arrays are not listed again.
		if err := h.ListAll(context.Background(), h.Arrays, 3); fail == "" && (err != nil || st.calls.Load() != 7) {
			t.Errorf("second ListAll: %v, %d listings", err, st.calls.Load())
		}
		h.Close()
	}
}

// A lazy listing keeps at most Options.LazyVersions answers; past them it
// asks the store each time, so a chunk rewritten is read anew by a Read
// under no pin, and refused (ErrChanged) by a Read under the Pin of the
// versions asked before the rewrite: the pin, not the listing's memory,
// keeps a fill to the versions its identity named.
func TestLazyListingKeepsFewAndPinHolds(t *testing.T) {
	dir, st := grownPosix(t, 4, 1)
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1, LazyVersions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a := h.Array("t")
	l, err := h.List(context.Background(), a, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	pin := &zarr.Pin{}
	var keys []string
	err = pin.Region(l, a, []int64{0, 0}, []int64{4, 2}, func(k, v string, ok bool) {
		if !ok || v == "" {
			t.Errorf("%s: version %q listed %v", k, v, ok)
		}
		keys = append(keys, k)
	})
	if err != nil || strings.Join(keys, " ") != "t/c/0/0 t/c/1/0 t/c/2/0 t/c/3/0" || l.Len() != 2 {
		t.Fatalf("pinned %v (%v), %d versions kept, want 4 pinned and 2 kept", keys, err, l.Len())
	}
	old := time.Now().Add(-time.Hour)
	for c := range 4 {
		os.Chtimes(filepath.Join(dir, "t", "c", itoa(c), "0"), old, old)
	}
	growStore(t, dir, 4, 1, 100) // every chunk rewritten
	if got, err := readSample(t, h, 3); err != nil || got[0] != 106 {
		t.Errorf("sample 3 under no pin, past what the listing keeps: %v %v, want the new bytes", got, err)
	}
	if _, err := readSample(t, h, 0); !errors.Is(err, zarr.ErrChanged) {
		t.Errorf("sample 0, whose version the listing kept: %v, want ErrChanged", err)
	}
	for k := range int64(4) {
		dst := make([]byte, 8)
		err := h.Read(context.Background(), pin, []zarr.Request{{Array: a, Start: []int64{k, 0}, Count: []int64{1, 2}, Dst: dst}})
		if !errors.Is(err, zarr.ErrChanged) {
			t.Errorf("sample %d under the pin: %v, want ErrChanged", k, err)
		}
	}
	if pin.Sum(a, []int64{0, 0}, []int64{4, 2}) == 0 {
		t.Error("no sum of the pinned versions")
	}
	// What the hierarchy's listings keep is counted in all: the listing
	// that replaces this one keeps as many again.
	l2, err := h.List(context.Background(), a, time.Now())
	if err != nil || l2 == l {
		t.Fatalf("listing again: %v", err)
	}
	for k := range int64(4) {
		if got, err := readSample(t, h, k); err != nil || got[0] != 100+2*uint32(k) {
			t.Errorf("sample %d under the new listing: %v %v", k, got, err)
		}
	}
	if l2.Len() != 2 {
		t.Errorf("the new listing keeps %d versions, want 2", l2.Len())
	}
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
