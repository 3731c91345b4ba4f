package zarr

import (
	"container/list"
	"sync"
)

// chunkCache keeps decoded chunks that a Read used only in part (and shard
// indexes), bounded in bytes, so the next samples out of the same chunk do
// not decode it again. A chunk leaves as soon as every element of it has
// been read once more (a walk over samples uses each chunk up and frees
// it), or when it is the least recently used one and room is needed.
//
// Plain LRU rather than ristretto: ristretto's frequency-based admission
// refuses the new chunks of a sequential walk once it is full (it keeps the
// often-hit chunks of the previous time block), which made a 20-channel view
// decode each chunk four times over. A nil *chunkCache caches nothing.
type chunkCache struct {
	mu   sync.Mutex
	max  int64
	used int64
	ll   *list.List // front: most recent
	m    map[string]*list.Element
}

type cached struct {
	key       string
	b         []byte
	remaining int64 // elements not read since it was cached; -1: never used up
}

func newChunkCache(maxBytes int64) *chunkCache {
	if maxBytes < 0 {
		return nil
	}
	if maxBytes == 0 {
		maxBytes = 256 << 20
	}
	return &chunkCache{max: maxBytes, ll: list.New(), m: map[string]*list.Element{}}
}

func (c *chunkCache) get(key string) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok {
		return nil, false
	}
	c.ll.MoveToFront(e)
	return e.Value.(*cached).b, true
}

// put keeps b under key, and reports whether it did (not when the cache
// is off or b larger than it); remaining is how many of its elements are
// still to be read (-1: keep until evicted).
func (c *chunkCache) put(key string, b []byte, remaining int64) bool {
	if c == nil || int64(len(b)) > c.max {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok {
		c.remove(e)
	}
	for c.used+int64(len(b)) > c.max && c.ll.Len() > 0 {
		c.remove(c.ll.Back())
	}
	c.m[key] = c.ll.PushFront(&cached{key: key, b: b, remaining: remaining})
	c.used += int64(len(b))
	return true
}

// consume records that n more elements of the chunk were read, and drops
// it once all have been.
func (c *chunkCache) consume(key string, n int64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok {
		return
	}
	v := e.Value.(*cached)
	if v.remaining < 0 {
		return
	}
	if v.remaining -= n; v.remaining <= 0 {
		c.remove(e)
	}
}

// reset drops every chunk.
func (c *chunkCache) reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ll.Init()
	clear(c.m)
	c.used = 0
}

func (c *chunkCache) remove(e *list.Element) {
	v := c.ll.Remove(e).(*cached)
	delete(c.m, v.key)
	c.used -= int64(len(v.b))
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
