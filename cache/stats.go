package cache

import "sync/atomic"

// Stats counts what one Cache did since Open (not other instances sharing
// the directory), for metrics and `zarrfs status`.
type Stats struct {
	// BlobHits counts GetBlob calls answered by a complete blob already in
	// the cache; BlobMisses those that filled it (or waited for a fill).
	BlobHits, BlobMisses int64
	// ChunkHits and ChunkMisses count lookups of the chunk tier.
	ChunkHits, ChunkMisses int64
	// Evictions counts files evicted to keep the budget, EvictedBytes
	// their size.
	Evictions, EvictedBytes int64
	// Filling is the number of blob fills running now.
	Filling int64
}

type counters struct {
	blobHits, blobMisses, chunkHits, chunkMisses, evictions, evictedBytes, filling atomic.Int64
}

// Stats returns the counts so far. Safe for concurrent use.
func (c *Cache) Stats() Stats {
	n := &c.counts
	return Stats{BlobHits: n.blobHits.Load(), BlobMisses: n.blobMisses.Load(), ChunkHits: n.chunkHits.Load(),
		ChunkMisses: n.chunkMisses.Load(), Evictions: n.evictions.Load(), EvictedBytes: n.evictedBytes.Load(),
		Filling: n.filling.Load()}
}

// Dir is the cache directory (absolute).
func (c *Cache) Dir() string { return c.dir }
