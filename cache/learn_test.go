package cache

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A blob GetBlob fills with learn is recorded under the identity learn
// names once the fill has run, across a restart; one whose identity fails
// (or is no identity) publishes nothing.
func TestGetBlobRecordsWhatTheFillLearnt(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	data := content("learnt", 6000)
	k := BlobKey{Layout: "L", Path: "t/0.npy"}
	learnt := ""
	h, id, err := c.GetBlob(context.Background(), k, int64(len(data)),
		func(ctx context.Context, f Writer) error {
			learnt = "v1" // what the fill's reads found
			return writeFill(data)(ctx, f)
		},
		func() (string, error) { return learnt, nil })
	if err != nil {
		t.Fatal(err)
	}
	if id != "v1" || !bytes.Equal(readAll(t, h), data) {
		t.Fatalf("identity %q (want v1), or wrong bytes", id)
	}
	h.Close()
	if !c.Holds(k) || !c.HasBlob(BlobKey{Layout: "L", Path: "t/0.npy", Identity: "v1"}) || c.HasBlob(k) {
		t.Fatal("not indexed under the identity learnt")
	}
	c.Close()
	c = mustOpen(t, Options{Dir: dir})
	defer c.Close()
	if !c.HasBlob(BlobKey{Layout: "L", Path: "t/0.npy", Identity: "v1"}) {
		t.Fatal("the identity learnt is not in the journal")
	}

	changed := errors.New("changed during the fill")
	for _, tc := range []struct {
		ident string
		err   error
		want  error
	}{{"", changed, changed}, {"not an identity", nil, ErrInvalidKey}} {
		k := BlobKey{Layout: "L", Path: "t/1.npy"}
		_, _, err := c.GetBlob(context.Background(), k, 100, writeFill(content("x", 100)),
			func() (string, error) { return tc.ident, tc.err })
		if !errors.Is(err, tc.want) {
			t.Errorf("identity %q, %v: got %v, want %v", tc.ident, tc.err, err, tc.want)
		}
		if c.Holds(k) {
			t.Errorf("identity %q, %v: published", tc.ident, tc.err)
		}
	}
}

// GetBlob of a path whose fill is learning its identity waits for it, and
// is served by it when it learnt the identity asked, without a fill of its
// own: a reader reaching a sample that readahead is filling costs nothing
// more.
func TestGetBlobWaitsForALearningFill(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir()})
	defer c.Close()
	data := content("shared", 5000)
	k := BlobKey{Layout: "L", Path: "t/7.npy"}
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		h, _, err := c.GetBlob(context.Background(), k, int64(len(data)),
			func(ctx context.Context, f Writer) error {
				close(started)
				<-release
				return writeFill(data)(ctx, f)
			},
			func() (string, error) { return "v1", nil })
		if err == nil {
			h.Close()
		}
		done <- err
	}()
	<-started
	var fills atomic.Int64
	got := make(chan *Handle, 1)
	go func() {
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "t/7.npy", Identity: "v1"}, int64(len(data)),
			func(ctx context.Context, f Writer) error {
				fills.Add(1)
				return writeFill(content("other", 5000))(ctx, f)
			}, nil)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	time.Sleep(50 * time.Millisecond) // GetBlob is waiting by now
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h := <-got
	if h == nil {
		return
	}
	defer h.Close()
	if fills.Load() != 0 || !bytes.Equal(readAll(t, h), data) {
		t.Fatalf("%d fills of its own; served the learning fill's bytes: %v", fills.Load(), bytes.Equal(readAll(t, h), data))
	}
}
