package integration

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/miniotest"
	"github.com/zarrfs/zarrfs/objectstore/gcstest"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
)

// benchReplica writes the full-size ARCO-ERA5-like replica
// (make_replica.py --size full): $ZARRFS_BENCH_TIMES steps (default 2) of
// $ZARRFS_BENCH_PRESSURE pressure-level variables (default 2, each chunk
// 37 x 721 x 1440 float32, 154 MB) and 2 single-level ones, Blosc LZ4.
// It returns the store's directory and its chunk bytes (compressed).
func benchReplica(b *testing.B) (string, int64) {
	b.Helper()
	requirePython(b)
	env := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	dir := b.TempDir()
	start := time.Now()
	out, err := exec.Command("python3", filepath.Join(repoRoot(b), "integration", "replica", "make_replica.py"), dir,
		"--kind", "arco", "--size", "full", "--times", env("ZARRFS_BENCH_TIMES", "2"),
		"--pressure-vars", env("ZARRFS_BENCH_PRESSURE", "2"), "--surface-vars", "2").CombinedOutput()
	if err != nil {
		b.Fatalf("make_replica.py: %v\n%s", err, out)
	}
	store := filepath.Join(dir, "arco.zarr")
	var chunks int64
	filepath.WalkDir(store, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".z") {
			if fi, err := e.Info(); err == nil {
				chunks += fi.Size()
			}
		}
		return nil
	})
	b.Logf("replica: %.0f MB of chunks, written in %v", mb(chunks), time.Since(start).Round(time.Millisecond))
	return store, chunks
}

// warmFill runs `zarrfs warm` of src into a fresh cache and returns its
// wall time, its own fill time and the files it filled (from its summary
// line).
func warmFill(b *testing.B, src string, args ...string) (wall, fill time.Duration, files int) {
	cacheDir, err := os.MkdirTemp(os.Getenv("ZARRFS_BENCH_CACHE"), "zarrfs-bench-cache-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(cacheDir)
	cmd := exec.Command(zarrfsBin(b), append([]string{"warm", src, "--cache", cacheDir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	wall = time.Since(start)
	if err != nil {
		b.Fatalf("zarrfs warm %s: %v\n%s\n%s", src, err, out, stderr.String())
	}
	m := warmedRE.FindSubmatch(out)
	if m == nil {
		b.Fatalf("zarrfs warm %s: no summary line of a cold fill:\n%s", src, out)
	}
	if fill, err = time.ParseDuration(string(m[2])); err != nil {
		b.Fatal(err)
	}
	files, _ = strconv.Atoi(string(m[1]))
	return wall, fill, files
}

// BenchmarkRemoteColdFill fills a cold cache with `zarrfs warm` (the real
// binary: metadata, fetch, Blosc LZ4 decode, cache writes) from the
// full-size ARCO-ERA5-like replica served three ways in the same run: by
// MinIO (s3://, the peer), by fake-gcs-server (gs://, in this process,
// objects in memory) and by Go's file server (http://, strong ETags),
// rotating which goes first. Metrics: MB/s of compressed chunk bytes by
// warm's own fill time for each, and gcs-ratio, http-ratio: that rate over
// MinIO's (BENCHMARKS.md's bar: >= 0.9). All servers share the machine's cores
// with zarrfs.
func BenchmarkRemoteColdFill(b *testing.B) {
	requireMountTools(b)
	store, chunks := benchReplica(b)
	minio := miniotest.Start(b)
	s3bucket := minio.NewBucket(b)
	minio.UploadDir(b, s3bucket, "era5/arco.zarr", store)
	b.Setenv("AWS_ACCESS_KEY_ID", minio.AccessKey)
	b.Setenv("AWS_SECRET_ACCESS_KEY", minio.SecretKey)
	b.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	b.Setenv("AWS_REGION", "us-east-1")
	gcs := gcstest.Start(b)
	gbucket := gcs.NewBucket(b)
	gcs.UploadDir(b, gbucket, "era5/arco.zarr", store)
	web := webtest.Start(b, filepath.Dir(store))
	web.ETags.Store(true)
	zarrfsBin(b)
	srcs := []struct {
		name string
		src  string
		args []string
	}{
		{"minio", "s3://" + s3bucket + "/era5/arco.zarr", []string{"--s3-endpoint", minio.Endpoint}},
		{"gcs", "gs://" + gbucket + "/era5/arco.zarr", []string{"--gcs-endpoint", gcs.URL, "--gcs-anonymous"}},
		{"http", web.Join("arco.zarr"), nil},
	}
	fill := make([]time.Duration, len(srcs))
	files := make([]int, len(srcs))
	n := 0
	b.SetBytes(int64(len(srcs)) * chunks)
	for b.Loop() {
		for k := range srcs {
			s := srcs[(n+k)%len(srcs)]
			syscall.Sync()
			_, f, nf := warmFill(b, s.src, s.args...)
			fill[(n+k)%len(srcs)] += f
			files[(n+k)%len(srcs)] = nf
		}
		n++
	}
	if files[0] == 0 || files[1] != files[0] || files[2] != files[0] {
		b.Fatalf("files warmed: minio %d, gcs %d, http %d: the sources did not fill the same files", files[0], files[1], files[2])
	}
	rate := func(d time.Duration) float64 { return mb(chunks) * float64(n) / d.Seconds() }
	for i, s := range srcs {
		b.ReportMetric(rate(fill[i]), s.name+"-MB/s")
	}
	b.ReportMetric(fill[0].Seconds()/fill[1].Seconds(), "gcs-ratio")
	b.ReportMetric(fill[0].Seconds()/fill[2].Seconds(), "http-ratio")
	b.Logf("%d files each; fill times over %d rounds: minio %v, gcs %v, http %v", files[0], n, fill[0], fill[1], fill[2])
}

// BenchmarkArchiveLive mounts the archive of TestArchiveScale (744,000
// steps; $ZARRFS_ARCHIVE_OBJECTS chunk objects, 20,000 by default) from
// fake-gcs-server, and from a local directory holding the same metadata
// (the peer: no request at all), and reports the time from starting the
// daemon to its "mounted" line for each (gcs-live-ms, local-live-ms) and
// the daemon's RSS once live.
func BenchmarkArchiveLive(b *testing.B) {
	requireMountTools(b)
	root, err := os.MkdirTemp(shmOrTemp(), "zarrfs-gcs-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	srv := gcstest.StartIn(b, root)
	bucket := srv.NewBucket(b)
	objects := 20_000
	if v := os.Getenv("ZARRFS_ARCHIVE_OBJECTS"); v != "" {
		if objects, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	writeArchive(b, srv, bucket, "ar/era5.zarr", objects)
	local := b.TempDir()
	webtest.WriteFiles(b, local, archiveMetadata())
	zarrfsBin(b)
	var gcsLive, localLive time.Duration
	var rss int64
	n := 0
	for b.Loop() {
		start := time.Now()
		d := mount(b, "gs://"+bucket+"/ar/era5.zarr", "--gcs-endpoint", srv.URL, "--gcs-anonymous")
		gcsLive += time.Since(start)
		rss = max(rss, rssBytes(d.cmd.Process.Pid))
		d.stop(b)
		start = time.Now()
		d = mount(b, local)
		localLive += time.Since(start)
		d.stop(b)
		n++
	}
	b.ReportMetric(float64(gcsLive.Milliseconds())/float64(n), "gcs-live-ms")
	b.ReportMetric(float64(localLive.Milliseconds())/float64(n), "local-live-ms")
	b.ReportMetric(float64(rss>>20), "rss-MiB")
	b.Logf("%d chunk objects in the bucket", objects)
}

func shmOrTemp() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return ""
}
