package zarr_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// lendCounter is a codec.HostMemory that counts what it lends and takes
// back, refusing buffers it did not lend.
type lendCounter struct {
	mu      sync.Mutex
	lent    map[*byte]int // holds
	n, back int
	foreign int
	sizes   []int // of each buffer lent
}

func (m *lendCounter) HostAlloc(n int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := make([]byte, n)
	if m.lent == nil {
		m.lent = map[*byte]int{}
	}
	m.lent[&b[0]] = 1
	m.n++
	m.sizes = append(m.sizes, n)
	return b
}

func (m *lendCounter) HostFree(b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cap(b) == 0 || m.lent[&b[:1][0]] == 0 {
		m.foreign++
		return
	}
	if m.lent[&b[:1][0]]--; m.lent[&b[:1][0]] == 0 {
		delete(m.lent, &b[:1][0])
		m.back++
	}
}

func (m *lendCounter) Retain(b []byte) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cap(b) == 0 || m.lent[&b[:1][0]] == 0 {
		return false
	}
	m.lent[&b[:1][0]]++
	return true
}

// lendingDecoder decodes inline and lends memory: a GPU's decoder, as a
// ring's fill brings it.
type lendingDecoder struct {
	codec.Inline
	*lendCounter
}

// A Read through Decoding(d) reads its compressed chunks into d's memory
// when d lends some, not the Hierarchy's, and gives every buffer back to
// it: a ring's fill reads into its GPU's pinned memory whatever the mount
// lends its other fills. A decoder that lends nothing reads into the
// Hierarchy's, as Read does.
func TestDecodingReadsIntoTheDecodersMemory(t *testing.T) {
	st := levelStoreOnDisk(t)
	own, ring := &lendCounter{}, &lendCounter{}
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1, Memory: own})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	read := func(r zarr.Reader) { readLevels(t, r, h.Arrays[0]) }
	read(h.Decoding(lendingDecoder{lendCounter: ring}))
	if ring.n != 2 || ring.back != 2 || ring.foreign != 0 || own.n != 0 || own.foreign != 0 {
		t.Fatalf("through a lending decoder: it lent %d and took back %d (%d not its own); the Hierarchy's lent %d (%d foreign)",
			ring.n, ring.back, ring.foreign, own.n, own.foreign)
	}
	read(h.Decoding(codec.Inline{}))
	read(h)
	if own.n != 4 || own.back != 4 || own.foreign != 0 || ring.n != 2 {
		t.Fatalf("through a decoder that lends nothing, and Read: the Hierarchy's lent %d and took back %d (%d foreign); the other's lent %d",
			own.n, own.back, own.foreign, ring.n)
	}
}

// plainInto is a SourceCacheInto in memory: what a chunk tier on disk
// does, a hit read into the caller's buffer when it has the room.
type plainInto struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (c *plainInto) Get(k string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[k]
	return bytes.Clone(b), ok
}

func (c *plainInto) Put(k string, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[k] = bytes.Clone(b)
}

func (c *plainInto) GetInto(k string, alloc func(int) []byte) ([]byte, bool) {
	b, ok := c.Get(k)
	if !ok || alloc == nil || len(b) == 0 {
		return b, ok
	}
	buf := alloc(len(b))
	if cap(buf) < len(b) {
		return b, ok
	}
	return append(buf[:0], b...), true
}

// Chunks a Read through Decoding(d) finds in the source cache are read
// into d's memory too, and given back to it: a ring's fill from the
// compressed tier reads into its GPU's pinned memory, and leaves nothing
// lent in the mount's (the hit was lent by one and given back to the
// other, which ignored it).
func TestDecodingReadsCacheHitsIntoTheDecodersMemory(t *testing.T) {
	st := levelStoreOnDisk(t)
	own, ring := &lendCounter{}, &lendCounter{}
	sc := &plainInto{m: map[string][]byte{}}
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1, Memory: own, SourceCache: sc})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	read := func(r zarr.Reader) { readLevels(t, r, h.Arrays[0]) }
	read(h) // fills the source cache
	if len(sc.m) == 0 {
		t.Fatal("the source cache holds no chunk after a read")
	}
	n0, back0 := own.n, own.back
	read(h.Decoding(lendingDecoder{lendCounter: ring}))
	if ring.n == 0 || ring.n != ring.back || ring.foreign != 0 {
		t.Errorf("hits through a lending decoder: it lent %d and took back %d (%d not its own)", ring.n, ring.back, ring.foreign)
	}
	if own.n-n0 != own.back-back0 || own.foreign != 0 {
		t.Errorf("hits through a lending decoder: the Hierarchy's lent %d and took back %d (%d foreign)", own.n-n0, own.back-back0, own.foreign)
	}
}

// levelStoreOnDisk writes levelStore's little-endian store to a directory
// and opens it.
// readLevels reads the whole of levelStoreOnDisk's array a through r.
func readLevels(t *testing.T, r zarr.Reader, a *zarr.Array) {
	t.Helper()
	buf := make([]byte, 2*4*3*5*2)
	if err := r.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: []int64{0, 0, 0, 0}, Count: []int64{2, 4, 3, 5}, Dst: buf}}); err != nil {
		t.Fatal(err)
	}
}

func levelStoreOnDisk(t *testing.T) objectstore.Store {
	t.Helper()
	dir := t.TempDir()
	for k, b := range levelStore(t, "little") {
		p := filepath.Join(dir, filepath.FromSlash(k))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// trimCounter is a lendCounter that takes tails back (memory.Trimmer),
// recording each trim as the buffer's length and what it kept.
type trimCounter struct {
	*lendCounter
	trims [][2]int
}

func (m *trimCounter) HostTrim(b []byte, n int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.trims = append(m.trims, [2]int{len(b), n})
	return b[:n:n]
}

// trimmingDecoder is a lendingDecoder whose memory takes tails back.
type trimmingDecoder struct {
	codec.Inline
	*trimCounter
}

// A chunk read whole into the decoder's memory from the store is read
// into room for its decoded size; a lender that takes tails back gets all
// of it past the compressed bytes at once, and the bytes decode as without
// it. One the source cache holds is lent exactly its bytes, and a miss
// there lends nothing before the store's read does.
func TestDecodingTrimsChunksToTheirBytes(t *testing.T) {
	st := levelStoreOnDisk(t)
	sc := &plainInto{m: map[string][]byte{}}
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1, SourceCache: sc})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a := h.Arrays[0]
	read := func(r zarr.Reader) []byte {
		buf := make([]byte, 2*4*3*5*2)
		if err := r.Read(context.Background(), nil, []zarr.Request{{Array: a, Start: []int64{0, 0, 0, 0}, Count: []int64{2, 4, 3, 5}, Dst: buf}}); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	want := read(h) // fills the source cache too
	for _, from := range []string{"the source cache", "the store"} {
		if from == "the store" {
			clear(sc.m)
		}
		m := &trimCounter{lendCounter: &lendCounter{}}
		if got := read(h.Decoding(trimmingDecoder{trimCounter: m})); !bytes.Equal(got, want) {
			t.Fatalf("from %s: the trimmed chunks decode to other bytes", from)
		}
		if m.n != 2 || m.back != m.n {
			t.Fatalf("from %s: %d buffers lent for 2 chunks, %d back", from, m.n, m.back)
		}
		if from == "the source cache" {
			var held []int
			for _, b := range sc.m {
				held = append(held, len(b))
			}
			slices.Sort(held)
			slices.Sort(m.sizes)
			if len(m.trims) != 0 || !slices.Equal(m.sizes, held) {
				t.Fatalf("from %s: buffers of %v bytes lent (%d trimmed) for chunks of %v", from, m.sizes, len(m.trims), held)
			}
			continue
		}
		if len(m.trims) != 2 {
			t.Fatalf("from %s: %d trims of 2 chunks", from, len(m.trims))
		}
		for _, tr := range m.trims {
			if tr[1] <= 0 || tr[1] >= tr[0] {
				t.Fatalf("from %s: a buffer of %d bytes trimmed to %d: want its compressed bytes, fewer", from, tr[0], tr[1])
			}
		}
	}
}
