package integration

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// BenchmarkS3ChunkTier decodes every file of an ERA5-like store in MinIO
// on loopback with `zarrfs warm` twice in one run, each into a cache
// without decoded files: from the source (listing, fetch, decode, write)
// and from a chunk tier that `zarrfs warm --compressed` filled first
// (listing, then every chunk read from the cache's disk, decode, write).
// Metrics: the seconds of each (source-s, tier-s) and speedup =
// source-s/tier-s. The store is BenchmarkS3ColdFill's.
func BenchmarkS3ChunkTier(b *testing.B) {
	s := newS3BenchStore(b, zarrtest.Example{Times: 48, Levels: 2, Lat: 721, Lon: 1440, TimeChunk: 1})
	zarrfsBin(b)
	warmInto := func(cacheDir string, args ...string) (time.Duration, string) {
		cmd := exec.Command(zarrfsBin(b), append([]string{"warm", s.url, "--cache", cacheDir, "--s3-endpoint", s.srv.Endpoint}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("zarrfs warm %v: %v\n%s\n%s", args, err, out, stderr.String())
		}
		return time.Since(start), string(out)
	}
	var tSource, tTier time.Duration
	n := 0
	for b.Loop() {
		src, err := os.MkdirTemp(os.Getenv("ZARRFS_BENCH_CACHE"), "zarrfs-bench-cache-")
		if err != nil {
			b.Fatal(err)
		}
		tier, err := os.MkdirTemp(os.Getenv("ZARRFS_BENCH_CACHE"), "zarrfs-bench-cache-")
		if err != nil {
			b.Fatal(err)
		}
		if _, out := warmInto(tier, "--compressed"); !strings.Contains(out, "0 (0 B) already in the cache") {
			b.Fatalf("warm --compressed into a new cache:\n%s", out)
		}
		runs := []func(){
			func() { d, _ := warmInto(src); tSource += d },
			func() {
				d, out := warmInto(tier)
				if !strings.Contains(out, "0 already warm") {
					b.Fatalf("warm over the chunk tier:\n%s", out)
				}
				tTier += d
			},
		}
		for k := range runs {
			syscall.Sync()
			runs[(n+k)%len(runs)]()
		}
		os.RemoveAll(src)
		os.RemoveAll(tier)
		n++
	}
	b.ReportMetric(tSource.Seconds()/float64(n), "source-s")
	b.ReportMetric(tTier.Seconds()/float64(n), "tier-s")
	b.ReportMetric(tSource.Seconds()/tTier.Seconds(), "speedup")
}
