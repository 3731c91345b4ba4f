package zarr

import (
	"sync"

	"github.com/dgraph-io/ristretto/v2"
)

// chunkCache keeps decoded chunks (and shard indexes) that a Read used only
// in part, bounded in bytes. A nil *chunkCache caches nothing.
type chunkCache struct {
	c *ristretto.Cache[string, []byte]
}

func newChunkCache(maxBytes int64) *chunkCache {
	if maxBytes < 0 {
		return nil
	}
	if maxBytes == 0 {
		maxBytes = 256 << 20
	}
	c, err := ristretto.NewCache(&ristretto.Config[string, []byte]{
		NumCounters: 1 << 16,
		MaxCost:     maxBytes,
		BufferItems: 64,
	})
	if err != nil {
		return nil
	}
	return &chunkCache{c: c}
}

func (c *chunkCache) get(key string) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	return c.c.Get(key)
}

func (c *chunkCache) put(key string, b []byte) {
	if c == nil {
		return
	}
	c.c.Set(key, b, int64(len(b))+64)
	// Make the entry visible to the next sample's fill, which usually
	// follows at once.
	c.c.Wait()
}

// Buffers for decoded chunks come from per-size pools: an array's chunks
// share one size, so reuse is near perfect.
var pools sync.Map // int -> *sync.Pool

func getBuf(n int) []byte {
	p, _ := pools.LoadOrStore(n, &sync.Pool{})
	if b, ok := p.(*sync.Pool).Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, n)
}

func putBuf(b []byte) {
	if cap(b) == 0 {
		return
	}
	b = b[:cap(b)]
	if p, ok := pools.Load(len(b)); ok {
		p.(*sync.Pool).Put(&b)
	}
}
