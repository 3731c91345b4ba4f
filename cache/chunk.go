package cache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
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
			c.storeChunk(rel, key, "", data)
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

func (c *Cache) readChunk(rel string) ([]byte, error) { return c.readChunkInto(rel, nil) }

// readChunkInto reads the chunk at rel into memory from alloc (nil: its
// own; preadWhole) and checks its size and checksum: nil, nil for a chunk the
// index lacks, or one found damaged or gone, which it forgets (and evicts,
// when damaged) so that the caller fetches it again.
func (c *Cache) readChunkInto(rel string, alloc func(n int) []byte) ([]byte, error) {
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

	data, err := preadWhole(filepath.Join(c.dir, rel), size, alloc)
	if err == nil && sumOf(data, sum.tree) == sum {
		return data, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(err, fs.ErrNotExist) {
		c.removeLocked(e)
	} else if c.idx[rel] == e {
		if err == nil {
			err = errors.New("checksum mismatch")
		}
		c.log.Warn("cache chunk damaged; fetching again", "key", rel, "err", err)
		c.counts.chunkDamaged.Add(1)
		c.evictOneLocked(e)
		c.removeLocked(e)
	}
	return nil, nil
}

// preadWhole reads the file at p, which must hold exactly size bytes, into
// memory from alloc (nil, or too short: a new slice), called once the
// file is found to hold size bytes: one pread, straight into the
// caller's memory.
func preadWhole(p string, size int64, alloc func(n int) []byte) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() != size {
		return nil, fmt.Errorf("size %d, recorded %d", fi.Size(), size)
	}
	if size == 0 {
		return []byte{}, nil
	}
	var buf []byte
	if alloc != nil {
		buf = alloc(int(size))
	}
	if int64(cap(buf)) < size {
		buf = make([]byte, size)
	}
	data := buf[:size]
	if n, err := f.ReadAt(data, 0); n != len(data) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return data, nil
}

// storeChunk keeps data under rel, recorded as a chunk of the store
// tagged tag ("" for none).
func (c *Cache) storeChunk(rel, key, tag string, data []byte) {
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
	if err := c.whileFull(c.base, rel, size, func() error { return c.writeChunk(rel, tag, data) }); err != nil {
		c.log.Warn("cache chunk not stored", "key", key, "err", err)
		return
	}
	committed = true
	c.counts.chunkStores.Add(1)
	c.counts.chunkStoredBytes.Add(size)
}

// writeChunk writes data to a temp file and publishes it as rel, recorded
// under the store tag tag.
func (c *Cache) writeChunk(rel, tag string, data []byte) error {
	tmp, err := os.CreateTemp(c.inst.dir, "chunk-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		// Read-only, as blobs are: nothing writes a chunk once published.
		err = tmp.Chmod(chunkFile)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = c.publish(rel, tmp.Name(), int64(len(data)), sumOf(data, c.treeSums.Load()), tag)
	}
	return err
}

// ChunkTier is the chunk tier as a plain keyed store of compressed source
// bytes (what zarr.Options.SourceCache wants), with the guarantees of
// GetChunk: every read is checked against the recorded size and checksum, and
// the bytes under a key never change.
type ChunkTier struct {
	c        *Cache
	readOnly bool
	store    string // storeTag of the store Of names; "" for none
}

// ChunkTier returns the chunk tier of c.
func (c *Cache) ChunkTier() ChunkTier { return ChunkTier{c: c} }

// ReadOnly is t serving what it holds and storing nothing: Put does
// nothing. A mount of a local store reads through it, so that chunks
// `zarrfs warm --compressed` kept are read from the cache, without
// copying every chunk it reads from the store onto the cache's disk.
func (t ChunkTier) ReadOnly() ChunkTier { t.readOnly = true; return t }

// Of is t keeping the chunks of one store, whose identity
// (objectstore.Identity) is store: each chunk it stores is recorded, in
// its journal line, as that store's, so that HoldsStore can tell whether
// the tier holds any chunk of it, across restarts and instances, for as
// long as one is there. The keys stay the caller's: they must name the
// store too, since Of only records.
func (t ChunkTier) Of(store string) ChunkTier { t.store = storeTag(store); return t }

// storeTag is the journal's name of a store: a hash of its identity
// (a valid identity field, of fixed length).
func storeTag(store string) string {
	h := sha256.Sum256([]byte(store))
	return "s" + hex.EncodeToString(h[:8])
}

// HoldsStore reports whether the cache holds any chunk of the store t is
// Of (false without one): what another instance stored included, and
// whatever the LRU evicted meanwhile excluded, since the count is the
// index's own. A reader whose chunks' versions are not known before it
// reads them (zarr's lazy listings of HTTP and large GCS arrays) asks
// them first while this holds, so that the chunks are read from here.
func (t ChunkTier) HoldsStore() bool {
	if t.store == "" {
		return false
	}
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.c.closed {
		return false
	}
	t.c.tailLocked()
	return t.c.chunksOf[t.store] > 0
}

// Get returns a copy of the bytes stored under key, if the tier holds them
// intact.
func (t ChunkTier) Get(key string) ([]byte, bool) { return t.GetInto(key, nil) }

// GetInto is Get that reads the bytes into memory from alloc (nil: its
// own), called only when the tier holds the chunk, with its size: one
// pread into the caller's memory, pinned memory included, with no copy
// after it, and a miss lends nothing. The bytes are checked against their
// recorded size and checksum; a damaged file is a miss (and is dropped),
// never bytes. What alloc returned is the caller's to give back where the
// result does not lie in it (a miss; memory shorter than the chunk).
func (t ChunkTier) GetInto(key string, alloc func(n int) []byte) ([]byte, bool) {
	data, err := t.c.readChunkInto(chunkRel(key), alloc)
	if err == nil && data != nil {
		t.c.counts.chunkHits.Add(1)
		return data, true
	}
	t.c.counts.chunkMisses.Add(1)
	return nil, false
}

// Put stores b under key, unless the tier already holds it: then the
// chunk, just read again from the source, becomes the most recently used,
// and one kept before stores were recorded is recorded as t's store's. It
// does not keep b. Failing to store (disk full) is logged, not returned.
func (t ChunkTier) Put(key string, b []byte) {
	if t.readOnly {
		return
	}
	rel := chunkRel(key)
	t.c.mu.Lock()
	if t.c.closed {
		t.c.mu.Unlock()
		return
	}
	e := t.c.lookupLocked(rel)
	if e != nil {
		t.c.lru.MoveToFront(e.elem)
		if e.ident != t.store && t.store != "" {
			t.c.retagLocked(e, t.store)
		}
	}
	t.c.mu.Unlock()
	if e == nil {
		t.c.storeChunk(rel, key, t.store, b)
	}
}

// retagLocked records the chunk e as one of the store tagged tag: an add
// record of the same file, size and checksum. A file gone meanwhile (a
// deletion not read yet) is left to the read that finds it gone.
func (c *Cache) retagLocked(e *entry, tag string) {
	if _, err := os.Lstat(filepath.Join(c.dir, e.key)); err != nil {
		return
	}
	r := record{op: opAdd, size: e.size, sum: e.sum, ident: tag, key: e.key}
	if err := c.appendLocked(r); err != nil {
		c.log.Warn("cache chunk's store not recorded", "key", e.key, "err", err)
		return
	}
	r.writer = c.inst.id
	c.insertLocked(r, e.trusted)
}

// Holds reports whether the index holds a chunk under key, without reading
// it (its bytes are checked when read).
func (t ChunkTier) Holds(key string) bool {
	rel := chunkRel(key)
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return !t.c.closed && t.c.lookupLocked(rel) != nil
}
