package fs

import (
	"context"

	"github.com/zarrfs/zarrfs/cache"
)

// CacheBlobs serves blobs from the persistent blob cache: files live at
// c.BlobPath(BlobKey{layoutID, path}), one fill per key at a time.
func CacheBlobs(c *cache.Cache) Blobs { return cacheBlobs{c} }

type cacheBlobs struct{ c *cache.Cache }

func (b cacheBlobs) Open(ctx context.Context, layoutID, path string, size int64, fill func(context.Context, cache.Writer) error) (Backing, error) {
	return b.c.GetBlob(ctx, cache.BlobKey{Layout: layoutID, Path: path}, size, fill)
}

func (b cacheBlobs) Path(layoutID, path string) string {
	return b.c.BlobPath(cache.BlobKey{Layout: layoutID, Path: path})
}
