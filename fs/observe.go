package fs

import (
	"context"
	"path"
	"strings"
	"time"

	"github.com/zarrfs/zarrfs/cache"
)

// WithFillObserver returns Blobs that report every fill they run (the
// reader's and readahead's): the array or view it belongs to (Group), how
// long it took and how it ended. Hits run no fill and report nothing.
func WithFillObserver(inner Blobs, observe func(group string, took time.Duration, err error)) Blobs {
	return &observed{inner, observe}
}

type observed struct {
	inner   Blobs
	observe func(string, time.Duration, error)
}

func (o *observed) Open(ctx context.Context, key cache.BlobKey, size int64, fill func(context.Context, cache.Writer) error) (Backing, error) {
	return o.inner.Open(ctx, key, size, func(ctx context.Context, w cache.Writer) error {
		t0 := time.Now()
		err := fill(ctx, w)
		o.observe(Group(key.Path), time.Since(t0), err)
		return err
	})
}

func (o *observed) Path(layoutID, p string) string { return o.inner.Path(layoutID, p) }
func (o *observed) Keeps(size int64) bool          { return o.inner.Keeps(size) }

// Group names what a mounted file belongs to, for labels of bounded
// cardinality: the sample directory of a sample ("t", "sub/sp", "train"),
// the array of a whole-array file ("lsm" for lsm.npy).
func Group(p string) string {
	if dir := path.Dir(p); dir != "." {
		return dir
	}
	return strings.TrimSuffix(p, ".npy")
}
