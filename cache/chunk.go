package cache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// chunkRel maps an opaque key to chunks/<2 hex>/<32 hex>: 128 bits of
// SHA-256, so distinct keys never share a file in practice, spread over 256
// directories so none grows huge.
func chunkRel(key string) string {
	h := sha256.Sum256([]byte(key))
	s := hex.EncodeToString(h[:16])
	return chunksDir + "/" + s[:2] + "/" + s
}

// GetChunk returns the bytes cached under key, calling fetch once when they
// are absent and storing what it returns. key is opaque: callers include
// everything that identifies the bytes (source identity, object key, byte
// range); the bytes under a key must never change. Concurrent calls for one
// key share one fetch. A fetch error is returned unchanged (errors.Is
// keeps working, e.g. for a not-found error that means "fill value") and is
// not cached. The returned slice is the caller's own.
//
// Chunks are checked against their recorded size and checksum on every read,
// so they are written without fsync: a damaged one is dropped and fetched
// again. Failing to store a chunk (disk full) is logged, not returned.
func (c *Cache) GetChunk(ctx context.Context, key string, fetch func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	rel := chunkRel(key)
	for {
		data, err := c.getChunk(ctx, rel, key, fetch)
		if !errors.Is(err, errRetry) {
			return data, err
		}
	}
}

func (c *Cache) getChunk(ctx context.Context, rel, key string, fetch func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if data, err := c.readChunk(rel); data != nil || err != nil {
		if data != nil {
			c.counts.chunkHits.Add(1)
		}
		return data, err
	}
	c.counts.chunkMisses.Add(1)
	return join(c, c.chunkFlights, rel, ctx,
		func() bool { return c.idx[rel] != nil },
		func(ctx context.Context) ([]byte, error) {
			data, err := fetch(ctx)
			if err != nil {
				return nil, err
			}
			if data == nil {
				data = []byte{}
			}
			c.storeChunk(rel, key, data)
			return data, nil
		},
		func(v []byte, shared bool) ([]byte, error) {
			if shared {
				return bytes.Clone(v), nil
			}
			return v, nil
		},
		nil,
	)
}

func (c *Cache) readChunk(rel string) ([]byte, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	e := c.lookupLocked(rel)
	if e == nil {
		c.mu.Unlock()
		return nil, nil
	}
	c.lru.MoveToFront(e.elem)
	size, sum := e.size, e.sum
	c.mu.Unlock()

	data, err := os.ReadFile(filepath.Join(c.dir, rel))
	if err == nil && int64(len(data)) == size && sumOf(data, sum.tree) == sum {
		if data == nil {
			data = []byte{}
		}
		return data, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(err, fs.ErrNotExist) {
		c.removeLocked(e)
	} else if c.idx[rel] == e {
		c.log.Warn("cache chunk damaged; fetching again", "key", rel, "err", err)
		c.evictOneLocked(e)
		c.removeLocked(e)
	}
	return nil, nil
}

func (c *Cache) storeChunk(rel, key string, data []byte) {
	size := int64(len(data))
	if b := c.Budget(); b > 0 && c.charge(size) > b {
		return
	}
	unreserve := c.reserve(size)
	committed := false
	defer func() {
		if !committed {
			unreserve()
		}
	}()
	if err := c.whileFull(c.base, rel, size, func() error { return c.writeChunk(rel, data) }); err != nil {
		c.log.Warn("cache chunk not stored", "key", key, "err", err)
		return
	}
	committed = true
}

// writeChunk writes data to a temp file and publishes it as rel.
func (c *Cache) writeChunk(rel string, data []byte) error {
	tmp, err := os.CreateTemp(c.inst.dir, "chunk-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = c.publish(rel, tmp.Name(), int64(len(data)), sumOf(data, c.treeSums.Load()), "")
	}
	return err
}

// ChunkTier is the chunk tier as a plain keyed store of compressed source
// bytes (what zarr.Options.SourceCache wants), with the guarantees of
// GetChunk: every read is checked against the recorded size and checksum, and
// the bytes under a key never change.
type ChunkTier struct{ c *Cache }

// ChunkTier returns the chunk tier of c.
func (c *Cache) ChunkTier() ChunkTier { return ChunkTier{c} }

// Get returns a copy of the bytes stored under key, if the tier holds them
// intact.
func (t ChunkTier) Get(key string) ([]byte, bool) {
	data, err := t.c.readChunk(chunkRel(key))
	if err == nil && data != nil {
		t.c.counts.chunkHits.Add(1)
		return data, true
	}
	t.c.counts.chunkMisses.Add(1)
	return nil, false
}

// Put stores b under key, unless the tier already holds it. It does not
// keep b. Failing to store (disk full) is logged, not returned.
func (t ChunkTier) Put(key string, b []byte) {
	rel := chunkRel(key)
	t.c.mu.Lock()
	if t.c.closed {
		t.c.mu.Unlock()
		return
	}
	present := t.c.lookupLocked(rel) != nil
	t.c.mu.Unlock()
	if !present {
		t.c.storeChunk(rel, key, b)
	}
}
