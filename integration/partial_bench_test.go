package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore/gcstest"
)

// BenchmarkPartialChunks fills the GraphCast-like view (13 of 37 levels)
// and the U-Net-like one (4 of 37) of the full-size ARCO-ERA5-like replica
// with `zarrfs warm --only VIEW` from fake-gcs-server (in this process,
// objects in memory), reading part of each pressure-level chunk (the
// default) and, as the peer, every chunk whole (--whole-chunks),
// alternating which goes first. Metrics per view: the bytes the server
// sent (its response bodies) and warm's own fill time, partial over whole.
// $ZARRFS_BENCH_REPLICA names a replica make_replica.py already wrote
// (its arco.zarr), to skip writing one.
func BenchmarkPartialChunks(b *testing.B) {
	gcs, _, src := servedReplica(b)
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
				args := []string{"--gcs-endpoint", gcs.URL, "--gcs-anonymous", "--view", spec, "--only", view}
				if whole {
					args = append(args, "--whole-chunks")
				}
				i := map[bool]int{false: 0, true: 1}[whole]
				before := gcs.Counts().Bytes.Load()
				_, f, nf := warmFill(b, src, args...)
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

// servedReplica serves the full-size ARCO-ERA5-like replica
// ($ZARRFS_BENCH_REPLICA, else one written by benchReplicaAll) from
// fake-gcs-server in this process, under era5/arco.zarr of a new bucket,
// and returns the server, the bucket and the store's gs:// URL.
func servedReplica(b *testing.B) (*gcstest.Server, string, string) {
	requireMountTools(b)
	store := os.Getenv("ZARRFS_BENCH_REPLICA")
	if store == "" {
		store, _ = benchReplicaAll(b)
	}
	gcs := gcstest.Start(b)
	bucket := gcs.NewBucket(b)
	gcs.UploadDir(b, bucket, "era5/arco.zarr", store)
	return gcs, bucket, "gs://" + bucket + "/era5/arco.zarr"
}

// benchReplicaAll writes the full-size ARCO-ERA5-like replica with every
// variable the views name (make_replica.py's defaults for --size full).
func benchReplicaAll(b *testing.B) (string, int64) {
	b.Setenv("ZARRFS_BENCH_PRESSURE", "6")
	return benchReplica(b)
}

// BenchmarkPartialPeers reads the GraphCast-like view's samples from the
// full-size ARCO-ERA5-like replica served by fake-gcs-server (in this
// process) three ways, in turn: `zarrfs warm --only graphcast` into a
// fresh cache (reading part of each chunk, the default), zarr-python 3
// through gcsfs and tensorstore through its GCS driver, each reading every
// channel's selection of every time step into memory and stacking it
// (integration/replica/read_view.py). Metrics: samples/s of each, and
// zarrfs's over each peer's. The peers decode whole chunks; zarrfs's rate
// is by warm's own fill time, theirs by the reads alone (after opening).
// $ZARRFS_BENCH_PEERS (comma-separated, default "zarr,tensorstore") picks
// the peers, for a machine that has one of them only.
func BenchmarkPartialPeers(b *testing.B) {
	gcs, bucket, src := servedReplica(b)
	spec := filepath.Join(repoRoot(b), "integration", "replica", "graphcast.yaml")
	zarrfsBin(b)
	readers := []string{"zarrfs", "zarr", "tensorstore"}
	if p := os.Getenv("ZARRFS_BENCH_PEERS"); p != "" {
		readers = append([]string{"zarrfs"}, strings.Split(p, ",")...)
	}
	secs := make([]float64, len(readers))
	samples := make([]int, len(readers))
	n := 0
	for b.Loop() {
		for k := range readers {
			i := (k + n) % len(readers)
			if readers[i] == "zarrfs" {
				_, f, nf := warmFill(b, src, "--gcs-endpoint", gcs.URL, "--gcs-anonymous", "--view", spec, "--only", "graphcast")
				secs[i] += f.Seconds()
				samples[i] += nf
				continue
			}
			cmd := exec.Command("python3", filepath.Join(repoRoot(b), "integration", "replica", "read_view.py"),
				"--reader", readers[i], "--bucket", bucket, "--path", "era5/arco.zarr", "--endpoint", gcs.URL, "--view", spec)
			cmd.Env = append(os.Environ(), "TENSORSTORE_GCS_HTTP_URL="+gcs.URL, "GCE_METADATA_HOST=127.0.0.1:1", "NO_GCE_CHECK=True")
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("read_view.py --reader %s: %v\n%s", readers[i], err, exitStderr(err))
			}
			var r struct {
				Samples int     `json:"samples"`
				Seconds float64 `json:"seconds"`
			}
			if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
				b.Fatalf("read_view.py --reader %s printed %q: %v", readers[i], out, err)
			}
			secs[i] += r.Seconds
			samples[i] += r.Samples
		}
		n++
	}
	rate := make([]float64, len(readers))
	for i, r := range readers {
		rate[i] = float64(samples[i]) / secs[i]
		b.ReportMetric(rate[i], r+"-samples/s")
		b.Logf("%s: %d samples in %.2f s over %d rounds", r, samples[i], secs[i], n)
	}
	for i := 1; i < len(readers); i++ {
		if samples[i] != samples[0] {
			b.Fatalf("samples read: %v by %v", samples, readers)
		}
		b.ReportMetric(rate[0]/rate[i], "vs-"+readers[i])
	}
}

// exitStderr is what a failed command wrote to its standard error.
func exitStderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}
