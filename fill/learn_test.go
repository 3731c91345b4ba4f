package fill

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
	"github.com/zarrfs/zarrfs/zarr"
)

// countingStore counts what a store is asked: versions (stat) and reads.
// It reads files, but is not seen as local (objectstore.IsLocal: it does
// not unwrap to its Posix), so its lazy listings keep every answer and a
// first fill learns its versions, as over a remote store whose versions
// are asked one by one (GCS arrays of many chunks); localStore is the
// local one.
type countingStore struct {
	*objectstore.Posix
	stats, reads atomic.Int64
	// afterRead, when set, runs after every whole read, before it answers.
	afterRead func(key string)
}

func (c *countingStore) StatVersion(ctx context.Context, key string) (string, error) {
	c.stats.Add(1)
	return c.Posix.StatVersion(ctx, key)
}

func (c *countingStore) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	c.reads.Add(1)
	b, v, err := c.Posix.GetVersion(ctx, key, buf, limit)
	if c.afterRead != nil {
		c.afterRead(key)
	}
	return b, v, err
}

func (c *countingStore) GetRangeVersion(ctx context.Context, key string, off, n int64) ([]byte, string, error) {
	c.reads.Add(1)
	return c.Posix.GetRangeVersion(ctx, key, off, n)
}

func (c *countingStore) take() (stats, reads int64) { return c.stats.Swap(0), c.reads.Swap(0) }

// localStore is a countingStore seen as local, as the Posix store it reads
// through is: its lazy listings are Bounded.
type localStore struct{ *countingStore }

func (l localStore) Unwrap() objectstore.Store { return l.Posix }

// writeChunk writes chunk (k, j) of array t, shaped (8, 4) in chunks of
// (1, 2): element [k, 2j+i] = base + 4k + 2j + i, raw little-endian.
func writeChunk(t *testing.T, dir string, k, j int, base uint32) {
	t.Helper()
	b := make([]byte, 8)
	for i := range 2 {
		binary.LittleEndian.PutUint32(b[4*i:], base+uint32(4*k+2*j+i))
	}
	p := filepath.Join(dir, "t", "c", strconv.Itoa(k), strconv.Itoa(j))
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// A rewrite within the clock's resolution would keep the version.
	at := time.Now().Add(time.Duration(base) * time.Second)
	os.Chtimes(p, at, at)
}

// growTo writes array t's metadata for n steps, and the chunks of the
// steps from `from` on.
func growTo(t *testing.T, dir string, from, n int) {
	t.Helper()
	doc := `{"zarr_format":3,"node_type":"array","shape":[` + strconv.Itoa(n) + `,4],"data_type":"uint32",
 "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,2]}},
 "chunk_key_encoding":{"name":"default"},"fill_value":0,
 "codecs":[{"name":"bytes","configuration":{"endian":"little"}}],"dimension_names":["time","x"]}`
	for k := from; k < n; k++ {
		for j := range 2 {
			writeChunk(t, dir, k, j, 0)
		}
	}
	os.WriteFile(filepath.Join(dir, "zarr.json"), []byte(`{"zarr_format":3,"node_type":"group"}`), 0o644)
	if err := os.WriteFile(filepath.Join(dir, "t", "zarr.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}

// learnStore is a local store of array t, 8 steps of 2 chunks (see
// writeChunk), read through a countingStore, and a cache.
func learnStore(t *testing.T) (string, *countingStore, *layout.Source, *cache.Cache) {
	dir := t.TempDir()
	growTo(t, dir, 0, 8)
	posix, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { posix.Close() })
	dec := must(codec.NewCPU(codec.Options{}))
	t.Cleanup(func() { dec.Close() })
	st := &countingStore{Posix: posix}
	c, err := cache.Open(cache.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return dir, st, &layout.Source{Store: st, Zarr: zarr.Options{Decoder: dec}}, c
}

// storeGives fails the test unless a layout opened afresh on src names
// blob p by identity id: what the store's versions give now.
func storeGives(t *testing.T, src *layout.Source, p, id string) {
	t.Helper()
	fresh := openLayout(t, src)
	if want, err := fresh.Identity(context.Background(), blobOf(t, fresh, p)); err != nil || want != id {
		t.Fatalf("%s recorded as %q, the store's versions give %q (%v)", p, id, want, err)
	}
}

func openLayout(t *testing.T, src *layout.Source) *layout.Layout {
	t.Helper()
	lay, err := src.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lay.Close() })
	return lay
}

func blobOf(t *testing.T, lay *layout.Layout, p string) layout.Blob {
	t.Helper()
	e, ok := lay.Find(p)
	if !ok || e.Kind != layout.KindBlob {
		t.Fatalf("%s: no such file", p)
	}
	return e.Blob
}

// openValues opens a blob through a Filler on c and returns its first
// value and the identity it opened.
func openValues(t *testing.T, c *cache.Cache, lay *layout.Layout, b layout.Blob) (uint32, string) {
	t.Helper()
	h, id, err := newFiller(t, Options{Cache: c}).Open(context.Background(), lay, b)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	buf := make([]byte, 4)
	if _, err := h.File().ReadAt(buf, lay.Align()); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint32(buf), id
}

// recordedAs checks that blob b, opened as identity id, has the identity
// the store gives and is recorded under it.
func recordedAs(t *testing.T, c *cache.Cache, lay *layout.Layout, b layout.Blob, id string) {
	t.Helper()
	if want, err := lay.Identity(context.Background(), b); err != nil || want != id || !c.HasBlob(Key(lay, b, id)) {
		t.Fatalf("opened as %q, identity %q (%v), recorded: %v", id, want, err, c.HasBlob(Key(lay, b, id)))
	}
}

// revalidatedThenRefilled checks what becomes of t/3.npy, filled as
// identity id: after a new listing (the next --metadata-ttl) it is
// revalidated by its two chunks' stats and not read; after one of its
// chunks is rewritten in place, the next listing fills it anew, under the
// new identity it returns.
func revalidatedThenRefilled(t *testing.T, dir string, st interface{ take() (int64, int64) }, src *layout.Source, c *cache.Cache, id string) string {
	t.Helper()
	lay2 := openLayout(t, src)
	st.take()
	if v2, id2 := openValues(t, c, lay2, blobOf(t, lay2, "t/3.npy")); v2 != 12 || id2 != id {
		t.Fatalf("reopened: value %d identity %q, want 12 %q", v2, id2, id)
	}
	if stats, reads := st.take(); stats != 2 || reads != 0 {
		t.Fatalf("revalidating: %d stats, %d reads; want 2 stats, no read", stats, reads)
	}
	writeChunk(t, dir, 3, 0, 100)
	lay3 := openLayout(t, src)
	v3, id3 := openValues(t, c, lay3, blobOf(t, lay3, "t/3.npy"))
	if v3 != 112 || id3 == id {
		t.Fatalf("after a rewrite: value %d identity changed %v; want 112, a new identity", v3, id3 != id)
	}
	return id3
}

// A blob of a (remote) store the cache never held is filled without
// asking any version first:
// its chunks' reads are its only requests, and it is recorded under the
// identity the versions they carried name, the one Identity gives. Held,
// it is revalidated after a new listing by asking its chunks' versions
// (and read nothing), and a chunk rewritten in place is filled anew, never
// served stale.
func TestFirstFillAsksNoVersion(t *testing.T) {
	dir, st, src, c := learnStore(t)
	lay := openLayout(t, src)
	b := blobOf(t, lay, "t/3.npy")
	st.take()
	v, id := openValues(t, c, lay, b)
	if stats, reads := st.take(); stats != 0 || reads != 2 || v != 12 {
		t.Fatalf("first open: %d stats, %d reads, value %d; want 0 stats, 2 reads (the chunks), 12", stats, reads, v)
	}
	recordedAs(t, c, lay, b, id)
	if stats, reads := st.take(); stats != 0 || reads != 0 {
		t.Fatalf("the identity of what the fill read cost %d stats, %d reads", stats, reads)
	}
	// Warm checks cost nothing for a blob never held, nor for one held
	// whose versions this listing learnt.
	other := blobOf(t, lay, "t/5.npy")
	if has, err := Has(context.Background(), c, lay, other); err != nil || has {
		t.Fatalf("Has of a blob never filled: %v %v", has, err)
	}
	if has, err := Has(context.Background(), c, lay, b); err != nil || !has {
		t.Fatalf("Has of the blob filled: %v %v", has, err)
	}
	// Holds (the device path's test for a warm sample) asks nothing.
	if f := newFiller(t, Options{Cache: c}); !f.Holds(lay, b) || f.Holds(lay, other) {
		t.Fatalf("Holds: %v of the blob filled, %v of one never filled", f.Holds(lay, b), f.Holds(lay, other))
	}
	if stats, reads := st.take(); stats != 0 || reads != 0 {
		t.Fatalf("Has and Holds cost %d stats, %d reads", stats, reads)
	}

	revalidatedThenRefilled(t, dir, st, src, c, id)
}

// A blob of a local store the cache never held has its identity taken
// first (a stat per chunk, microseconds) and is filled under the pin of
// those versions, never learnt from the fill: its listing keeps a bounded
// number of answers, and asking again after the fill could record a chunk
// rewritten in between under its new version with its old bytes. Held, it
// is revalidated after a new listing by its stats alone; a chunk rewritten
// in place is filled anew.
func TestFirstFillOfALocalStore(t *testing.T) {
	dir, counting, src, c := learnStore(t)
	st := localStore{counting}
	src.Store = st
	if !objectstore.IsLocal(st) {
		t.Fatal("the local counting store is not seen as local")
	}
	lay := openLayout(t, src)
	b := blobOf(t, lay, "t/3.npy")
	st.take()
	p, err := plan(context.Background(), lay, b, true)
	if err != nil {
		t.Fatal(err)
	}
	if p.Learn != nil || p.Ident == "" || p.Pin == nil {
		t.Errorf("a local store's blob left to learn from its fill (identity %q)", p.Ident)
	}
	if stats, reads := st.take(); stats != 2 || reads != 0 {
		t.Fatalf("the identity first: %d stats, %d reads; want the 2 chunks' stats", stats, reads)
	}
	lay = openLayout(t, src)
	b = blobOf(t, lay, "t/3.npy")
	st.take()
	v, id := openValues(t, c, lay, b)
	if stats, reads := st.take(); stats > 2 || reads != 2 || v != 12 {
		t.Fatalf("first open: %d stats, %d reads, value %d; want at most 2 stats, 2 reads (the chunks), 12", stats, reads, v)
	}
	recordedAs(t, c, lay, b, id)
	storeGives(t, src, "t/3.npy", revalidatedThenRefilled(t, dir, st, src, c, id))
}

// A chunk found rewritten by the fill that learns a blob's identity (its
// listing learnt another version of it before) fails the fill with
// ErrChanged, which lists again and fills once more: the blob holds the
// new bytes and is recorded under their versions, never the old ones.
func TestLearningFillFollowsARewrite(t *testing.T) {
	dir, st, src, c := learnStore(t)
	lay := openLayout(t, src)
	b := blobOf(t, lay, "t/5.npy")
	a := lay.Hierarchy().Array("t")
	lst, err := lay.Hierarchy().List(context.Background(), a, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// The listing learns chunk (5, 0) now; (5, 1) is left to the fill, so
	// the identity is not known and the fill learns it.
	if _, ok, err := lst.Version("t/c/5/0"); !ok || err != nil {
		t.Fatal("chunk 5/0 not found", err)
	}
	writeChunk(t, dir, 5, 0, 100)
	st.take()
	v, id := openValues(t, c, lay, b)
	if v != 120 {
		t.Fatalf("value %d, want the rewritten chunk's 120", v)
	}
	if a.Listing() == lst {
		t.Fatal("the array was not listed again after the rewrite")
	}
	storeGives(t, src, "t/5.npy", id)
}

// learn fails with ErrChanged when an array the blob reads was listed
// again while it filled: the reads may have followed the new listing, the
// identity the old one.
func TestLearnRefusesANewListing(t *testing.T) {
	_, _, src, _ := learnStore(t)
	lay := openLayout(t, src)
	b := blobOf(t, lay, "t/2.npy")
	a := lay.Hierarchy().Array("t")
	p, err := plan(context.Background(), lay, b, true)
	if err != nil {
		t.Fatal(err)
	}
	if p.Learn == nil {
		t.Fatalf("identity %q known before any read", p.Ident)
	}
	if _, err := lay.Hierarchy().List(context.Background(), a, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Learn(); !errors.Is(err, zarr.ErrChanged) {
		t.Fatalf("learn after a new listing: %v, want ErrChanged", err)
	}
}

// The same when the listing learns the new version while the fill's read
// of the old one is answering (another reader asked it): the read's answer
// is not the one that stands, so the fill fails with ErrChanged rather
// than record the old bytes under the new version.
func TestLearningFillLosesToAnAnswerBeforeIt(t *testing.T) {
	dir, st, src, c := learnStore(t)
	lay := openLayout(t, src)
	b := blobOf(t, lay, "t/5.npy")
	a := lay.Hierarchy().Array("t")
	lst, err := lay.Hierarchy().List(context.Background(), a, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var once atomic.Bool
	st.afterRead = func(key string) {
		if key == "t/c/5/0" && once.CompareAndSwap(false, true) {
			writeChunk(t, dir, 5, 0, 100)
			if _, ok, err := lst.Version(key); !ok || err != nil {
				t.Error("chunk 5/0 not found", err)
			}
		}
	}
	v, id := openValues(t, c, lay, b)
	if v != 120 || !once.Load() {
		t.Fatalf("value %d, want the rewritten chunk's 120", v)
	}
	storeGives(t, src, "t/5.npy", id)
}

// A sample cached under a narrower name (the store grew past ten steps:
// 3.npy is now 03.npy) is revalidated and linked, not filled again.
func TestWidenedNameIsLinkedNotFilled(t *testing.T) {
	dir, st, src, c := learnStore(t)
	lay := openLayout(t, src)
	if v, _ := openValues(t, c, lay, blobOf(t, lay, "t/3.npy")); v != 12 {
		t.Fatalf("t/3.npy: %d, want 12", v)
	}
	growTo(t, dir, 8, 12)
	grown := openLayout(t, src)
	b := blobOf(t, grown, "t/03.npy")
	if !held(c, grown, b) {
		t.Fatal("t/03.npy not seen as held under its narrower name")
	}
	st.take()
	if v, _ := openValues(t, c, grown, b); v != 12 {
		t.Fatalf("t/03.npy: %d, want 12", v)
	}
	if stats, reads := st.take(); stats != 2 || reads != 0 {
		t.Fatalf("t/03.npy: %d stats, %d reads; want its 2 versions asked and no read (a link)", stats, reads)
	}
}

// The same over HTTP, where a version is an ETag: a first read is its
// chunks' GETs and no HEAD; a cached sample after a new listing is one
// HEAD per chunk and no GET of a chunk.
func TestFirstFillAsksNoVersionHTTP(t *testing.T) {
	dir, _, _, c := learnStore(t)
	// A web server cannot list: the group's metadata is consolidated.
	arr, err := os.ReadFile(filepath.Join(dir, "t", "zarr.json"))
	if err != nil {
		t.Fatal(err)
	}
	root := `{"zarr_format":3,"node_type":"group","consolidated_metadata":{"kind":"inline","must_understand":false,"metadata":{"t":` + string(arr) + `}}}`
	os.WriteFile(filepath.Join(dir, "zarr.json"), []byte(root), 0o644)
	srv := webtest.Start(t, dir)
	srv.ETags.Store(true)
	web, err := objectstore.OpenHTTP(context.Background(), srv.URL, objectstore.HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer web.Close()
	dec := must(codec.NewCPU(codec.Options{}))
	defer dec.Close()
	src := &layout.Source{Store: web, Zarr: zarr.Options{Decoder: dec}}
	count := func() (heads, gets int64) {
		h := srv.Heads()
		return h, srv.Requests() - h
	}
	lay := openLayout(t, src)
	h0, g0 := count()
	if v, _ := openValues(t, c, lay, blobOf(t, lay, "t/3.npy")); v != 12 {
		t.Fatalf("t/3.npy: %d, want 12", v)
	}
	if h, g := count(); h-h0 != 0 || g-g0 != 2 {
		t.Fatalf("first read: %d HEAD, %d GET; want 0 and the 2 chunks", h-h0, g-g0)
	}
	lay2 := openLayout(t, src)
	h0, g0 = count()
	if v, _ := openValues(t, c, lay2, blobOf(t, lay2, "t/3.npy")); v != 12 {
		t.Fatalf("t/3.npy again: %d, want 12", v)
	}
	if h, g := count(); h-h0 != 2 || g-g0 != 0 {
		t.Fatalf("revalidating: %d HEAD, %d GET; want 2 and none", h-h0, g-g0)
	}
}
