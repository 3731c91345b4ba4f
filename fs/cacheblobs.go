package fs

import (
	"context"

	"github.com/zarrfs/zarrfs/cache"
)

// CacheBlobs serves blobs from the persistent blob cache: files live at
// c.BlobPath(BlobKey{Layout: layoutID, Path: path}), one fill per key at a
// time, replaced when its identity changes.
func CacheBlobs(c *cache.Cache) Blobs { return cacheBlobs{c} }

type cacheBlobs struct{ c *cache.Cache }

func (b cacheBlobs) Open(ctx context.Context, key cache.BlobKey, size int64, fill func(context.Context, cache.Writer) error) (Backing, error) {
	return b.c.GetBlob(ctx, key, size, fill)
}

func (b cacheBlobs) Keeps(size int64) bool { return b.c.Keeps(size) }

func (b cacheBlobs) Path(layoutID, path string) string {
	return b.c.BlobPath(cache.BlobKey{Layout: layoutID, Path: path})
}
