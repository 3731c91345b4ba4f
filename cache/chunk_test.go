package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

func TestChunkTier(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	ctx := context.Background()
	var fetches atomic.Int32
	fetch := func(key string) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) {
			fetches.Add(1)
			return content(key, 3000), nil
		}
	}
	got, err := c.GetChunk(ctx, "s3://b/t/c/0/0", fetch("s3://b/t/c/0/0"))
	if err != nil || !bytes.Equal(got, content("s3://b/t/c/0/0", 3000)) {
		t.Fatalf("miss: %v", err)
	}
	got[0] ^= 1 // the caller's own slice: must not reach the cache
	got, err = c.GetChunk(ctx, "s3://b/t/c/0/0", fetch("s3://b/t/c/0/0"))
	if err != nil || !bytes.Equal(got, content("s3://b/t/c/0/0", 3000)) || fetches.Load() != 1 {
		t.Fatalf("hit: %v, %d fetches", err, fetches.Load())
	}

	t.Run("errors pass through and are not cached", func(t *testing.T) {
		calls := 0
		missing := func(context.Context) ([]byte, error) {
			calls++
			return nil, fmt.Errorf("get t/c/9/9: %w", fs.ErrNotExist)
		}
		for range 2 {
			if _, err := c.GetChunk(ctx, "missing", missing); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("got %v, want a not-found error", err)
			}
		}
		if calls != 2 {
			t.Fatalf("%d fetches, want 2 (errors not cached)", calls)
		}
	})

	t.Run("empty chunk", func(t *testing.T) {
		for range 2 {
			got, err := c.GetChunk(ctx, "empty", func(context.Context) ([]byte, error) { return nil, nil })
			if err != nil || got == nil || len(got) != 0 {
				t.Fatalf("got %v, %v", got, err)
			}
		}
	})

	t.Run("one fetch for concurrent callers, each its own copy", func(t *testing.T) {
		release := make(chan struct{})
		var n atomic.Int32
		var wg sync.WaitGroup
		results := make([][]byte, 16)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], _ = c.GetChunk(ctx, "shared", func(context.Context) ([]byte, error) {
					n.Add(1)
					<-release
					return content("shared", 2000), nil
				})
			}()
		}
		close(release)
		wg.Wait()
		if n.Load() != 1 {
			t.Fatalf("%d fetches, want 1", n.Load())
		}
		for i := range results {
			if !bytes.Equal(results[i], content("shared", 2000)) {
				t.Fatalf("caller %d: wrong bytes", i)
			}
			for j := range i {
				if &results[i][0] == &results[j][0] {
					t.Fatalf("callers %d and %d share a slice", i, j)
				}
			}
		}
	})

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	t.Run("persists across reopen; damage is detected on read", func(t *testing.T) {
		c := mustOpen(t, Options{Dir: dir})
		defer c.Close()
		before := fetches.Load()
		got, err := c.GetChunk(ctx, "s3://b/t/c/0/0", fetch("s3://b/t/c/0/0"))
		if err != nil || !bytes.Equal(got, content("s3://b/t/c/0/0", 3000)) || fetches.Load() != before {
			t.Fatalf("after reopen: %v, %d new fetches", err, fetches.Load()-before)
		}
		p := filepath.Join(dir, chunkRel("s3://b/t/c/0/0"))
		b, _ := os.ReadFile(p)
		b[100] ^= 0xff
		os.WriteFile(p, b, 0o644)
		got, err = c.GetChunk(ctx, "s3://b/t/c/0/0", fetch("s3://b/t/c/0/0"))
		if err != nil || !bytes.Equal(got, content("s3://b/t/c/0/0", 3000)) || fetches.Load() != before+1 {
			t.Fatalf("damaged chunk: %v, %d new fetches (want 1)", err, fetches.Load()-before)
		}
	})
}

// Chunks and blobs share one budget.
func TestChunksAndBlobsShareBudget(t *testing.T) {
	dir := t.TempDir()
	const budget = 32 << 10
	c := mustOpen(t, Options{Dir: dir, Size: budget})
	defer c.Close()
	for i := range 50 {
		k := fmt.Sprint("chunk", i)
		if _, err := c.GetChunk(context.Background(), k, func(context.Context) ([]byte, error) { return content(k, 3000), nil }); err != nil {
			t.Fatal(err)
		}
		getBlob(t, c, key(i))
		if d, _ := diskUsage(t, dir); d > budget+12<<10 {
			t.Fatalf("%d bytes on disk, budget %d", d, budget)
		}
	}
	// A chunk larger than the budget is returned but not stored.
	big, err := c.GetChunk(context.Background(), "big", func(context.Context) ([]byte, error) { return make([]byte, budget+1), nil })
	if err != nil || len(big) != budget+1 {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, chunkRel("big"))); !os.IsNotExist(err) {
		t.Fatal("oversized chunk stored")
	}
}

// ChunkTier as zarr's SourceCache: Get misses until Put, then returns the
// caller's own copy; Put keeps no reference to its argument; a damaged file
// is a miss; the tier survives a reopen.
func TestChunkTierGetPut(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	tier := c.ChunkTier()
	const k = "s3://b/t/c/0/1"
	if b, ok := tier.Get(k); ok {
		t.Fatalf("Get before Put: %d bytes", len(b))
	}
	data := content(k, 5000)
	in := bytes.Clone(data)
	tier.Put(k, in)
	in[0] ^= 0xff // the reader reuses its buffer after Put
	got, ok := tier.Get(k)
	if !ok || !bytes.Equal(got, data) {
		t.Fatalf("Get after Put: %v", ok)
	}
	got[1] ^= 0xff
	if again, _ := tier.Get(k); !bytes.Equal(again, data) {
		t.Fatal("a Get's slice reached the cache")
	}
	tier.Put(k, []byte("other bytes under the same key are ignored"))
	if again, _ := tier.Get(k); !bytes.Equal(again, data) {
		t.Fatal("a second Put replaced the chunk")
	}
	c.Close()
	c = mustOpen(t, Options{Dir: dir})
	if again, ok := c.ChunkTier().Get(k); !ok || !bytes.Equal(again, data) {
		t.Fatal("chunk lost across a reopen")
	}
	// Damage the file: a miss, not wrong bytes.
	filepath.WalkDir(filepath.Join(dir, chunksDir), func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			os.WriteFile(p, bytes.Repeat([]byte{1}, 5000), 0o644)
		}
		return nil
	})
	if b, ok := c.ChunkTier().Get(k); ok {
		t.Fatalf("damaged chunk served (%d bytes)", len(b))
	}
}
