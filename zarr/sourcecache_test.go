package zarr_test

import (
	"bytes"
	"context"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/fixtures"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// intoCache is a SourceCacheInto in memory that records whether each hit
// landed in lent memory.
type intoCache struct {
	mapCache
	l              *lender
	mu             sync.Mutex
	hits, intoLent int
}

func (c *intoCache) GetInto(k string, alloc func(int) []byte) ([]byte, bool) {
	b, ok := c.Get(k)
	if !ok {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hits++
	var buf []byte
	if alloc != nil && len(b) > 0 {
		buf = alloc(len(b))
	}
	if cap(buf) < len(b) {
		return bytes.Clone(b), true
	}
	if len(b) > 0 {
		c.l.mu.Lock()
		_, lent := c.l.lent[&buf[:1][0]]
		c.l.mu.Unlock()
		if lent {
			c.intoLent++
		}
	}
	return append(buf[:0], b...), true
}

// countingStore counts the chunks read whole from a store (not the
// metadata, nor chunks found missing, which are asked each time).
type countingStore struct {
	objectstore.Store
	mu   sync.Mutex
	gets int
	keys []string
}

func (s *countingStore) Get(ctx context.Context, key string) ([]byte, error) {
	b, err := s.Store.Get(ctx, key)
	base := path.Base(key)
	if !objectstore.IsNotFound(err) && base != "zarr.json" && !strings.HasPrefix(base, ".z") { // chunks present
		s.mu.Lock()
		s.gets++
		s.keys = append(s.keys, key)
		s.mu.Unlock()
	}
	return b, err
}

// A source cache that reads into the caller's buffer gets, for every whole
// compressed chunk, the decoder's lent memory (what a GPU copies from), and
// the store is not read: a chunk kept compressed on disk lands in pinned
// memory in one read. Every lent buffer comes back, and the values are
// those read from the store.
func TestSourceCacheReadsIntoLentMemory(t *testing.T) {
	root := fixtures.Tensorstore(t)
	dirs, err := filepath.Glob(filepath.Join(root, "*"))
	if err != nil {
		t.Fatal(err)
	}
	l := &lender{CPU: must(codec.NewCPU(codec.Options{})), lent: map[*byte]int{}}
	defer l.Close()
	sc := &intoCache{mapCache: mapCache{m: map[string][]byte{}}, l: l}
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		plain := openStore(t, dir)
		open := func() (*zarr.Hierarchy, *countingStore) {
			st, err := objectstore.OpenPosix(dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			cs := &countingStore{Store: st}
			h, err := zarr.Open(context.Background(), cs, zarr.Options{Decoder: l, SourceCache: sc, ChunkCacheBytes: -1})
			if err != nil {
				t.Fatal(err)
			}
			return h, cs
		}
		first, _ := open()
		for _, a := range first.Arrays {
			if a.Unsupported == "" {
				readRegion(t, first, a, make([]int64, len(a.Shape)), a.Shape)
			}
		}
		h, cs := open()
		for i, a := range h.Arrays {
			if a.Unsupported != "" {
				continue
			}
			want, ok := readRegion(t, plain, plain.Arrays[i], make([]int64, len(a.Shape)), a.Shape)
			got, ok2 := readRegion(t, h, a, make([]int64, len(a.Shape)), a.Shape)
			if ok && ok2 && !bytes.Equal(got, want) {
				t.Errorf("%s/%s: values differ when read from the source cache", filepath.Base(dir), a.Path)
			}
		}
		if cs.gets != 0 {
			t.Errorf("%s: %d objects read from the store with every chunk in the source cache: %q", filepath.Base(dir), cs.gets, cs.keys)
		}
	}
	if sc.intoLent == 0 {
		t.Fatalf("no cached chunk was read into lent memory (%d hits)", sc.hits)
	}
	if len(l.lent) != 0 {
		t.Errorf("%d of %d lent buffers not given back", len(l.lent), l.allocs)
	}
	t.Logf("%d hits, %d into lent memory", sc.hits, sc.intoLent)
}
