package fill

import (
	"context"
	"io"
	"path"
	"strings"
	"time"

	"github.com/zarrfs/zarrfs/layout"
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

func (o *observed) Open(ctx context.Context, lay *layout.Layout, b layout.Blob) (Backing, string, error) {
	return o.inner.Open(ctx, lay, observedBlob{b, o.observe})
}

func (o *observed) Path(lay *layout.Layout, p string) string { return o.inner.Path(lay, p) }
func (o *observed) Keeps(size int64) bool                    { return o.inner.Keeps(size) }

// observedBlob reports the fills of the blob it wraps.
type observedBlob struct {
	layout.Blob
	observe func(string, time.Duration, error)
}

func (b observedBlob) Fill(ctx context.Context, w io.WriterAt) error {
	t0 := time.Now()
	err := b.Blob.Fill(ctx, w)
	b.observe(Group(b.Path()), time.Since(t0), err)
	return err
}

// Group names what a mounted file belongs to, for labels of bounded
// cardinality: the sample directory of a sample ("t", "sub/sp", "train"),
// the array of a whole-array file ("lsm" for lsm.npy).
func Group(p string) string {
	if dir := path.Dir(p); dir != "." {
		return dir
	}
	return strings.TrimSuffix(p, ".npy")
}
