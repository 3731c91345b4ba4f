package fs

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/fs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// recordingBlobs records the paths opened.
type recordingBlobs struct {
	mu     sync.Mutex
	opened []string
}

type nopBacking struct{}

func (nopBacking) File() *os.File { return nil }
func (nopBacking) Close() error   { return nil }

func (r *recordingBlobs) Open(ctx context.Context, key cache.BlobKey, size int64, fill func(context.Context, cache.Writer) error) (Backing, error) {
	r.mu.Lock()
	r.opened = append(r.opened, key.Path)
	r.mu.Unlock()
	return nopBacking{}, nil
}

func (r *recordingBlobs) Path(layoutID, p string) string { return "/cache/" + layoutID + "/" + p }
func (r *recordingBlobs) Keeps(int64) bool               { return true }

func (r *recordingBlobs) seen(p string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.opened {
		if o == p {
			return true
		}
	}
	return false
}

func TestReadaheadOnlyWhenSequential(t *testing.T) {
	h := &zarr.Hierarchy{Arrays: smallArrays(), Groups: map[string]map[string]any{"": {}}}
	l, err := layout.Build(h, layout.Options{Reader: &patternReader{}})
	if err != nil {
		t.Fatal(err)
	}
	inner := &recordingBlobs{}
	ra := WithReadahead(inner, l, 2, nil).(*readahead)
	open := func(p string) {
		if _, err := ra.Open(context.Background(), cache.BlobKey{Layout: l.ID, Path: p}, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(p string) {
		deadline := time.Now().Add(10 * time.Second)
		for !inner.seen(p) {
			if time.Now().After(deadline) {
				t.Fatalf("readahead never opened %s", p)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// A shuffled reader: no readahead at all.
	open("t/07.npy")
	open("t/03.npy")
	open("t/10.npy")
	waitIdle(ra)
	for _, p := range []string{"t/08.npy", "t/04.npy", "t/11.npy"} {
		if inner.seen(p) {
			t.Errorf("%s filled ahead for a shuffled reader", p)
		}
	}
	// A sequential reader: the next two samples, not past the end.
	open("t/03.npy")
	open("t/04.npy")
	waitFor("t/05.npy")
	waitFor("t/06.npy")
	open("t/10.npy")
	open("t/11.npy")
	waitIdle(ra)
	if inner.seen("t/12.npy") {
		t.Error("readahead past the last sample")
	}
}

// waitIdle waits until no readahead fill is running.
func waitIdle(r *readahead) {
	for range 10000 {
		if len(r.sem) == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Parallel readers open samples slightly out of order: the walk goes on,
// and the fills ahead cover the samples past the newest open.
func TestReadaheadParallelReaders(t *testing.T) {
	h := &zarr.Hierarchy{Arrays: smallArrays(), Groups: map[string]map[string]any{"": {}}}
	l, err := layout.Build(h, layout.Options{Reader: &patternReader{}})
	if err != nil {
		t.Fatal(err)
	}
	inner := &recordingBlobs{}
	ra := WithReadahead(inner, l, 3, nil).(*readahead)
	for _, p := range []string{"t/00.npy", "t/02.npy", "t/01.npy", "t/04.npy", "t/03.npy"} {
		if _, err := ra.Open(context.Background(), cache.BlobKey{Layout: l.ID, Path: p}, 1, nil); err != nil {
			t.Fatal(err)
		}
		waitIdle(ra) // readers slower than the fills
	}
	for _, p := range []string{"t/05.npy", "t/06.npy", "t/07.npy"} {
		if !inner.seen(p) {
			t.Errorf("%s not filled ahead of readers at 03-04", p)
		}
	}
	if inner.seen("t/08.npy") {
		t.Error("filled more than 3 ahead of the newest open")
	}
}
