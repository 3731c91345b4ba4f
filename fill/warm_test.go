package fill

import (
	"context"
	"testing"

	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// Samples that read the same chunks (t's chunks hold 5 time steps) go to
// one worker together, in order; a sample of other chunks starts a batch.
func TestBatchesFollowChunks(t *testing.T) {
	h := &zarr.Hierarchy{Arrays: smallArrays(), Groups: map[string]map[string]any{"": {}}}
	l, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var blobs []layout.Blob
	for _, p := range []string{"t/00.npy", "t/01.npy", "t/04.npy", "t/05.npy", "t/09.npy", "t/10.npy", "lat.npy", "t/02.npy"} {
		blobs = append(blobs, blobAt(t, l, p))
	}
	var got [][]string
	for _, b := range Batches(blobs) {
		var names []string
		for _, x := range b {
			names = append(names, x.Path())
		}
		got = append(got, names)
	}
	want := [][]string{{"t/00.npy", "t/01.npy", "t/04.npy"}, {"t/05.npy", "t/09.npy"}, {"t/10.npy"}, {"lat.npy"}, {"t/02.npy"}}
	if len(got) != len(want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("batches %v, want %v", got, want)
		}
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Fatalf("batches %v, want %v", got, want)
			}
		}
	}
}

func TestWarmRefusesNegativeJobs(t *testing.T) {
	if _, err := Warm(context.Background(), nil, nil, nil, WarmOptions{Jobs: -1}); err == nil {
		t.Fatal("Warm accepted -1 jobs")
	}
}
