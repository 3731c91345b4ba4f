package zarr

import (
	"container/list"
	"sync"

	"github.com/zarrfs/zarrfs/internal/memory"
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
//
// A chunk's buffer may be memory a lender lent (mem: the Read decoded into
// it), which concurrent Reads use while another evicts it: the cache holds
// it (memory.Lender.Retain) while it keeps it, and get gives each reader a
// hold of its own, which the reader gives back (mem.HostFree) when done.
// So a buffer goes back to the lender only once neither the cache nor any
// reader holds it, never while one still reads it.
type chunkCache struct {
	mem  memory.Lender // lent the buffers the cache may hold; nil: none
	mu   sync.Mutex
	max  int64
	used int64
	ll   *list.List // front: most recent
	m    map[string]*list.Element
	// ghosts are the keys of chunks used in part that a decoder placed
	// itself (codec.Job.Place: their bytes went to device memory), which
	// the cache could not keep, with their sizes, within max bytes, most
	// recent first: a chunk read again while its ghost stays would still
	// be here had it been kept (a walk over samples in order), and the
	// Read that meets it then decodes it where the cache can keep it
	// (haunted).
	ghosts    *list.List
	ghostKeys map[string]*list.Element
	ghostUsed int64
}

type ghost struct {
	key string
	n   int64
}

type cached struct {
	key       string
	b         []byte
	remaining int64 // elements not read since it was cached; -1: never used up
	held      bool  // the cache holds b, memory mem lent
}

func newChunkCache(maxBytes int64, mem memory.Lender) *chunkCache {
	if maxBytes < 0 {
		return nil
	}
	if maxBytes == 0 {
		maxBytes = 256 << 20
	}
	return &chunkCache{mem: mem, max: maxBytes, ll: list.New(), m: map[string]*list.Element{},
		ghosts: list.New(), ghostKeys: map[string]*list.Element{}}
}

// get returns the chunk kept under key; held reports that the caller got
// a hold on b, to give back (mem.HostFree) once it is done reading b.
func (c *chunkCache) get(key string) (b []byte, held, ok bool) {
	if c == nil {
		return nil, false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok {
		return nil, false, false
	}
	c.ll.MoveToFront(e)
	v := e.Value.(*cached)
	return v.b, v.held && c.mem.Retain(v.b), true
}

// put keeps b under key, with a hold of the cache's own when a lender lent
// b (the caller keeps its own), and reports whether it did (not when the
// cache is off or b larger than it); remaining is how many of its
// elements are still to be read (-1: keep until evicted).
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
	held := c.mem != nil && c.mem.Retain(b)
	c.m[key] = c.ll.PushFront(&cached{key: key, b: b, remaining: remaining, held: held})
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

// placed records the ghost of a chunk of n bytes used in part whose
// bytes its decoder placed itself, so never kept here.
func (c *chunkCache) placed(key string, n int64) {
	if c == nil || n > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.ghostKeys[key]; ok {
		c.ghostUsed -= c.ghosts.Remove(e).(ghost).n
	}
	c.ghostKeys[key] = c.ghosts.PushFront(ghost{key, n})
	c.ghostUsed += n
	for c.ghostUsed > c.max {
		g := c.ghosts.Remove(c.ghosts.Back()).(ghost)
		delete(c.ghostKeys, g.key)
		c.ghostUsed -= g.n
	}
}

// haunted reports whether the chunk under key has a ghost (placed), and
// lays it: the chunk is read again soon enough that the cache would have
// served it, so this Read decodes it where the cache can keep it.
func (c *chunkCache) haunted(key string) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.ghostKeys[key]
	if ok {
		c.ghostUsed -= c.ghosts.Remove(e).(ghost).n
		delete(c.ghostKeys, key)
	}
	return ok
}

// reset drops every chunk.
func (c *chunkCache) reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.ll.Len() > 0 {
		c.remove(c.ll.Back())
	}
}

// remove drops a chunk, giving back the cache's hold on it: its buffer
// goes back to the lender unless a reader still holds it.
func (c *chunkCache) remove(e *list.Element) {
	v := c.ll.Remove(e).(*cached)
	delete(c.m, v.key)
	c.used -= int64(len(v.b))
	if v.held {
		c.mem.HostFree(v.b)
	}
}
