package integration

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore/gcstest"
)

// BenchmarkPartialChunks fills the GraphCast-like view (13 of 37 levels)
// and the U-Net-like one (4 of 37) of the full-size ARCO-ERA5-like replica
// with `zarrfs warm --only VIEW` from fake-gcs-server (in this process,
// objects in memory), reading part of each pressure-level chunk (the
// default) and, as the peer, every chunk whole (ZARRFS_WHOLE_CHUNKS=1),
// alternating which goes first. Metrics per view: the bytes the server
// sent (its response bodies) and warm's own fill time, partial over whole.
// $ZARRFS_BENCH_REPLICA names a replica make_replica.py already wrote
// (its arco.zarr), to skip writing one.
func BenchmarkPartialChunks(b *testing.B) {
	requireMountTools(b)
	store := os.Getenv("ZARRFS_BENCH_REPLICA")
	if store == "" {
		store, _ = benchReplicaAll(b)
	}
	gcs := gcstest.Start(b)
	bucket := gcs.NewBucket(b)
	gcs.UploadDir(b, bucket, "era5/arco.zarr", store)
	src := "gs://" + bucket + "/era5/arco.zarr"
	zarrfsBin(b)
	views := []string{"graphcast", "unet"}
	type result struct {
		bytes [2]int64 // partial, whole
		fill  [2]time.Duration
		files [2]int
	}
	res := make([]result, len(views))
	n := 0
	for b.Loop() {
		for v, view := range views {
			spec := filepath.Join(repoRoot(b), "integration", "replica", view+".yaml")
			for k := range 2 {
				whole := (n+k)%2 == 1
				if whole {
					b.Setenv("ZARRFS_WHOLE_CHUNKS", "1")
				} else {
					b.Setenv("ZARRFS_WHOLE_CHUNKS", "")
				}
				i := map[bool]int{false: 0, true: 1}[whole]
				before := gcs.Counts().Bytes.Load()
				_, f, nf := warmFill(b, src, "--gcs-endpoint", gcs.URL, "--gcs-anonymous", "--view", spec, "--only", view)
				res[v].bytes[i] += gcs.Counts().Bytes.Load() - before
				res[v].fill[i] += f
				res[v].files[i] = nf
			}
		}
		n++
	}
	for v, view := range views {
		r := res[v]
		if r.files[0] == 0 || r.files[0] != r.files[1] {
			b.Fatalf("%s: %d files partial, %d whole", view, r.files[0], r.files[1])
		}
		b.ReportMetric(float64(r.bytes[0])/float64(r.bytes[1]), view+"-bytes-ratio")
		b.ReportMetric(r.fill[0].Seconds()/r.fill[1].Seconds(), view+"-fill-ratio")
		b.Logf("%s: %d files; over %d rounds partial %.0f MB in %v, whole %.0f MB in %v",
			view, r.files[0], n, mb(r.bytes[0]), r.fill[0], mb(r.bytes[1]), r.fill[1])
	}
}

// benchReplicaAll writes the full-size ARCO-ERA5-like replica with every
// variable the views name (make_replica.py's defaults for --size full).
func benchReplicaAll(b *testing.B) (string, int64) {
	b.Setenv("ZARRFS_BENCH_PRESSURE", "6")
	return benchReplica(b)
}
