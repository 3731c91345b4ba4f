package fill

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/layout"
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

func (r *recordingBlobs) Open(ctx context.Context, lay *layout.Layout, b layout.Blob) (Backing, string, error) {
	r.mu.Lock()
	r.opened = append(r.opened, b.Path())
	r.mu.Unlock()
	return nopBacking{}, "", nil
}

func (r *recordingBlobs) Path(lay *layout.Layout, p string) string {
	return "/cache/" + lay.ID + "/" + p
}
func (r *recordingBlobs) Keeps(int64) bool { return true }

// count is how many times p was opened.
func (r *recordingBlobs) count(p string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, o := range r.opened {
		if o == p {
			n++
		}
	}
	return n
}

func (r *recordingBlobs) seen(p string) bool { return r.count(p) > 0 }

func TestReadaheadOnlyWhenSequential(t *testing.T) {
	l := smallLayout(t)
	inner := &recordingBlobs{}
	ra := WithReadahead(inner, func() *layout.Layout { return l }, 2, nil).(*readahead)
	open := func(p string) {
		if _, _, err := ra.Open(context.Background(), l, blobAt(t, l, p)); err != nil {
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
	l := smallLayout(t)
	inner := &recordingBlobs{}
	ra := WithReadahead(inner, func() *layout.Layout { return l }, 3, nil).(*readahead)
	for _, p := range []string{"t/00.npy", "t/02.npy", "t/01.npy", "t/04.npy", "t/03.npy"} {
		if _, _, err := ra.Open(context.Background(), l, blobAt(t, l, p)); err != nil {
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

// A reader that reads each sample in pieces opens it once per piece (the
// Loader's threads): the walk goes on, and no sample is filled ahead twice.
func TestReadaheadPiecesOfOneSample(t *testing.T) {
	l := smallLayout(t)
	inner := &recordingBlobs{}
	ra := WithReadahead(inner, func() *layout.Layout { return l }, 2, nil).(*readahead)
	for _, p := range []string{"t/00.npy", "t/00.npy", "t/01.npy", "t/01.npy", "t/01.npy", "t/02.npy", "t/02.npy", "t/03.npy"} {
		if _, _, err := ra.Open(context.Background(), l, blobAt(t, l, p)); err != nil {
			t.Fatal(err)
		}
		waitIdle(ra)
	}
	// The reader opened 00-03 itself (00 twice, 01 three times, ...);
	// the fills ahead opened 02-05 once each.
	for p, want := range map[string]int{"t/02.npy": 3, "t/03.npy": 2, "t/04.npy": 1, "t/05.npy": 1, "t/06.npy": 0} {
		if got := inner.count(p); got != want {
			t.Errorf("%s opened %d times, want %d", p, got, want)
		}
	}
}

// smallLayout is the layout of smallArrays: t's 12 samples and lat.
func smallLayout(t testing.TB) *layout.Layout {
	t.Helper()
	h := &zarr.Hierarchy{Arrays: smallArrays(), Groups: map[string]map[string]any{"": {}}}
	l, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// blobAt is the blob at mount path p of l.
func blobAt(t testing.TB, l *layout.Layout, p string) layout.Blob {
	t.Helper()
	e, ok := l.Lookup(p)
	if !ok || e.Kind != layout.KindBlob {
		t.Fatalf("%s: no blob in the layout", p)
	}
	return e.Blob
}

// patternReader fills every region with a pattern (readahead tests count
// opens, not bytes).
type patternReader struct{}

func (patternReader) Read(ctx context.Context, _ *zarr.Pin, reqs []zarr.Request) error {
	for _, q := range reqs {
		for i := range q.Dst {
			q.Dst[i] = byte(i)
		}
	}
	return nil
}

func smallArrays() []*zarr.Array {
	return []*zarr.Array{
		{Path: "t", Shape: []int64{12, 4, 8}, Chunks: []int64{5, 4, 8}, DType: f32, Dims: []string{"time", "y", "x"}, MetaHash: "t"},
		{Path: "lat", Shape: []int64{8}, Chunks: []int64{8}, DType: f32, Dims: []string{"y"}, MetaHash: "l"},
	}
}

// stuckBlobs fills the samples a reader opens at once and those filled
// ahead never, until their context ends.
type stuckBlobs struct {
	recordingBlobs
	read  map[string]bool
	ended chan error
}

func (s *stuckBlobs) Open(ctx context.Context, lay *layout.Layout, b layout.Blob) (Backing, string, error) {
	s.recordingBlobs.Open(ctx, lay, b)
	if s.read[b.Path()] {
		return nopBacking{}, "", nil
	}
	<-ctx.Done()
	s.ended <- ctx.Err()
	return nil, "", ctx.Err()
}

// Fills ahead run under the context of the open that scheduled them: a
// mount's, which its unmount ends; they do not outlive it.
func TestReadaheadEndsWithItsContext(t *testing.T) {
	l := smallLayout(t)
	inner := &stuckBlobs{read: map[string]bool{"t/00.npy": true, "t/01.npy": true}, ended: make(chan error, 2)}
	ra := WithReadahead(inner, func() *layout.Layout { return l }, 2, nil).(*readahead)
	life, end := context.WithCancel(context.Background())
	for _, p := range []string{"t/00.npy", "t/01.npy"} {
		if _, _, err := ra.Open(life, l, blobAt(t, l, p)); err != nil {
			t.Fatal(err)
		}
	}
	end()
	for range 2 {
		select {
		case err := <-inner.ended:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("a fill ahead ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the fills ahead outlived the context of the opens that scheduled them")
		}
	}
	if !inner.seen("t/02.npy") || !inner.seen("t/03.npy") {
		t.Error("t/02 and t/03 were not filled ahead")
	}
}
