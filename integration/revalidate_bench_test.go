package integration

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/integration/miniotest"
)

// requestCounter classifies the requests a proxy forwards.
type requestCounter struct {
	meta, chunks, lists, other atomic.Int64
}

func (c *requestCounter) rule(req *http.Request, _ int64) faultproxy.Fault {
	q := req.URL.Query()
	switch {
	case req.Method == http.MethodGet && (q.Has("list-type") || q.Has("prefix") || q.Has("delimiter")):
		c.lists.Add(1)
	case req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "zarr.json"):
		c.meta.Add(1)
	case req.Method == http.MethodGet:
		c.chunks.Add(1)
	default:
		c.other.Add(1)
	}
	return faultproxy.Fault{Kind: faultproxy.Pass}
}

func (c *requestCounter) reset() {
	c.meta.Store(0)
	c.chunks.Store(0)
	c.lists.Store(0)
	c.other.Store(0)
}

func (c *requestCounter) String() string {
	return fmt.Sprintf("%d metadata GETs, %d chunk GETs, %d listings, %d other", c.meta.Load(), c.chunks.Load(), c.lists.Load(), c.other.Load())
}

// Revalidating a warm mount of 100,000 samples on S3 after the TTL costs
// the metadata (one GET per array) and the listings, and no chunk request:
// every sample read after the refresh is served from the cache, checked
// against the new listing. make test checks that on 500 samples with a
// short TTL; the measure in BENCHMARKS.md uploads 100,000 objects:
// ZARRFS_BENCH_REVALIDATE=1 go test -run TestRevalidationRequests -v
// ./integration/ (ZARRFS_BENCH_REVALIDATE=N: N samples).
func TestRevalidationRequests(t *testing.T) {
	requireMountTools(t)
	n := 500
	// The TTL leaves room to read every sample between two refreshes.
	ttl := 3 * time.Second
	if env := os.Getenv("ZARRFS_BENCH_REVALIDATE"); env != "" {
		n, ttl = 100_000, 30*time.Second
		if v, err := strconv.Atoi(env); err == nil && v > 1 {
			n = v
		}
	}
	srv := miniotest.Start(t)
	bucket := srv.NewBucket(t)
	s3Env(t, srv)
	files := map[string][]byte{
		"zarr.json": []byte(`{"zarr_format":3,"node_type":"group"}`),
		"t/zarr.json": []byte(fmt.Sprintf(`{"zarr_format":3,"node_type":"array","shape":[%d,4,8],"data_type":"uint8",
 "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,4,8]}},"chunk_key_encoding":{"name":"default"},
 "fill_value":0,"codecs":[{"name":"bytes"}],"dimension_names":["time","y","x"]}`, n)),
	}
	for k := range n {
		b := make([]byte, 32)
		for i := range b {
			b[i] = byte(k + i)
		}
		files[fmt.Sprintf("t/c/%d/0/0", k)] = b
	}
	start := time.Now()
	srv.UploadFiles(t, bucket, "s", files)
	t.Logf("uploaded %d objects in %v", len(files), time.Since(start).Round(time.Second))

	p, err := faultproxy.New(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var c requestCounter
	p.SetRule(c.rule)
	src := "s3://" + bucket + "/s"
	cacheDir := t.TempDir()
	start = time.Now()
	warm(t, src, cacheDir, "--s3-endpoint", p.URL)
	t.Logf("warm: %v; %s", time.Since(start).Round(time.Second), &c)

	d := mountAt(t, src, t.TempDir(), cacheDir, "--s3-endpoint", p.URL, "--metadata-ttl", ttl.String(),
		"--readahead", "0", "--log-level", "debug")
	readAll := func() time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		work := make(chan int)
		var failed atomic.Int64
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range work {
					if _, err := os.ReadFile(filepath.Join(d.mnt, "t", fmt.Sprintf("%0*d.npy", len(strconv.Itoa(n-1)), k))); err != nil {
						failed.Add(1)
					}
				}
			}()
		}
		for k := range n {
			work <- k
		}
		close(work)
		wg.Wait()
		if failed.Load() > 0 {
			t.Fatalf("%d reads failed", failed.Load())
		}
		return time.Since(start)
	}
	refreshes := func() int { return strings.Count(d.stderr.String(), `msg="metadata refreshed"`) }
	waitRefresh := func() {
		before := refreshes()
		for refreshes() == before {
			time.Sleep(20 * time.Millisecond)
		}
	}
	c.reset()
	el := readAll()
	t.Logf("first read of every sample through the mount (%v): %s", el.Round(time.Millisecond), &c)

	// One whole refresh, counted alone.
	waitRefresh()
	c.reset()
	waitRefresh()
	t.Logf("one refresh: %s", &c)
	if c.chunks.Load() != 0 {
		t.Errorf("the refresh read %d chunks", c.chunks.Load())
	}
	// Then every sample read under the new listing.
	c.reset()
	r0 := refreshes()
	el = readAll()
	t.Logf("read of every sample after the refresh (%v, %d refreshes meanwhile): %s", el.Round(time.Millisecond), refreshes()-r0, &c)
	if c.chunks.Load() != 0 {
		t.Errorf("%d chunk requests after the TTL: warm blobs are checked by listing, not by reading", c.chunks.Load())
	}
	sc := bufio.NewScanner(strings.NewReader(d.stderr.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "metadata refreshed") {
			t.Log(sc.Text())
		}
	}
}
