package cache

import (
	"strings"
	"sync/atomic"
)

// Stats counts what one Cache did since Open (not other instances sharing
// the directory), for metrics and `zarrfs status`.
type Stats struct {
	// BlobHits counts GetBlob calls answered by a complete blob already in
	// the cache; BlobMisses those that filled it (or waited for a fill).
	BlobHits, BlobMisses int64
	// ChunkHits and ChunkMisses count lookups of the chunk tier.
	ChunkHits, ChunkMisses int64
	// ChunkStores counts chunks this instance stored, ChunkStoredBytes
	// their bytes; ChunkDamaged chunks found damaged on a read (dropped,
	// and fetched again by the caller); ChunkEvictions the evictions
	// (counted in Evictions too) that were chunks.
	ChunkStores, ChunkStoredBytes, ChunkDamaged, ChunkEvictions int64
	// Evictions counts files evicted to keep the budget, EvictedBytes
	// their size.
	Evictions, EvictedBytes int64
	// Filling is the number of blob fills running now.
	Filling int64
}

type counters struct {
	blobHits, blobMisses, chunkHits, chunkMisses, evictions, evictedBytes, filling atomic.Int64
	chunkStores, chunkStoredBytes, chunkDamaged, chunkEvictions                    atomic.Int64
}

// Stats returns the counts so far. Safe for concurrent use.
func (c *Cache) Stats() Stats {
	n := &c.counts
	return Stats{BlobHits: n.blobHits.Load(), BlobMisses: n.blobMisses.Load(), ChunkHits: n.chunkHits.Load(),
		ChunkMisses: n.chunkMisses.Load(), Evictions: n.evictions.Load(), EvictedBytes: n.evictedBytes.Load(),
		Filling: n.filling.Load(), ChunkStores: n.chunkStores.Load(), ChunkStoredBytes: n.chunkStoredBytes.Load(),
		ChunkDamaged: n.chunkDamaged.Load(), ChunkEvictions: n.chunkEvictions.Load()}
}

// Dir is the cache directory (absolute).
func (c *Cache) Dir() string { return c.dir }

// TierUsage is what each tier of a cache holds.
type TierUsage struct {
	BlobBytes, ChunkBytes int64
	Blobs, Chunks         int
}

// TierUsage reports the bytes and complete files of each tier as this
// instance knows them (Usage split by tier).
func (c *Cache) TierUsage() TierUsage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.tailLocked()
	}
	return TierUsage{BlobBytes: c.bytes - c.chunkBytes, ChunkBytes: c.chunkBytes, Blobs: len(c.idx) - c.chunks, Chunks: c.chunks}
}

// isChunk reports whether an index key names a file of the chunk tier.
func isChunk(key string) bool { return strings.HasPrefix(key, chunksDir+"/") }
