package objectstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/gcstest"
)

// BenchmarkGCSColdFetch fetches the same set of 1-4 MB objects from
// fake-gcs-server (in this process, in memory) through the GCS store (Get
// and, for the second half of each object, GetRange; MaxInFlight workers)
// and through plain parallel net/http GETs of the JSON API's media
// downloads, alternating which goes first, each with a fresh client (cold
// connections, no cache). It reports both throughputs and their ratio
// (store / plain): what the client library and the store cost over the
// bare protocol.
//
// ZARRFS_BENCH_GCS_OBJECTS sets the object count (default 128).
func BenchmarkGCSColdFetch(b *testing.B) {
	n := 128
	if v, err := strconv.Atoi(os.Getenv("ZARRFS_BENCH_GCS_OBJECTS")); err == nil && v > 0 {
		n = v
	}
	srv := gcstest.Start(b)
	bucket := srv.NewBucket(b)
	rng := rand.New(rand.NewPCG(7, 8))
	sizes := make(map[string]int, n)
	var total int64
	for i := range n {
		size := 1<<20 + rng.IntN(3<<20)
		data := make([]byte, size)
		for j := 0; j+8 <= size; j += 8 {
			binary.LittleEndian.PutUint64(data[j:], rng.Uint64())
		}
		k := fmt.Sprintf("t/c/%d/0", i)
		srv.Put(bucket, "bench.zarr/"+k, data)
		sizes[k] = size
		total += int64(size + size/2)
	}
	const workers = objectstore.DefaultGCSMaxInFlight
	ctx := context.Background()

	// fetchAll runs get (whole object, then its second half) over every
	// key with the given parallelism.
	fetchAll := func(get func(k string, off, length int64) (int, error)) (time.Duration, error) {
		start := time.Now()
		ch := make(chan string)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		var got int64
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range ch {
					size := int64(sizes[k])
					m, err := get(k, 0, 0)
					if err == nil {
						var r int
						r, err = get(k, size-size/2, size/2)
						m += r
					}
					mu.Lock()
					got += int64(m)
					if err != nil && first == nil {
						first = err
					}
					mu.Unlock()
				}
			}()
		}
		for k := range sizes {
			ch <- k
		}
		close(ch)
		wg.Wait()
		if first == nil && got != total {
			first = fmt.Errorf("fetched %d bytes, want %d", got, total)
		}
		return time.Since(start), first
	}

	ours := func() (time.Duration, error) {
		g, err := objectstore.OpenGCS(ctx, "gs://"+bucket+"/bench.zarr", objectstore.GCSOptions{Endpoint: srv.URL, Anonymous: true})
		if err != nil {
			return 0, err
		}
		defer g.Close()
		st, err := objectstore.WithRetry(g, objectstore.RetryOptions{})
		if err != nil {
			return 0, err
		}
		return fetchAll(func(k string, off, length int64) (int, error) {
			var buf []byte
			var err error
			if length == 0 {
				buf, err = st.Get(ctx, k)
			} else {
				buf, err = st.GetRange(ctx, k, off, length)
			}
			return len(buf), err
		})
	}
	plain := func() (time.Duration, error) {
		tr := &http.Transport{MaxIdleConnsPerHost: workers, DisableCompression: true}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr}
		return fetchAll(func(k string, off, length int64) (int, error) {
			u := srv.URL + "/storage/v1/b/" + bucket + "/o/" + url.PathEscape("bench.zarr/"+k) + "?alt=media"
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if err != nil {
				return 0, err
			}
			if length > 0 {
				req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+length-1))
			}
			resp, err := c.Do(req)
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			// Size the buffer from the response, as the store does.
			buf := make([]byte, resp.ContentLength)
			return io.ReadFull(resp.Body, buf)
		})
	}

	var tOurs, tPlain time.Duration
	b.SetBytes(2 * total)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		order := []func() (time.Duration, error){ours, plain}
		sums := []*time.Duration{&tOurs, &tPlain}
		if i%2 == 1 {
			order[0], order[1] = order[1], order[0]
			sums[0], sums[1] = sums[1], sums[0]
		}
		for j, f := range order {
			d, err := f()
			if err != nil {
				b.Fatal(err)
			}
			*sums[j] += d
		}
	}
	b.StopTimer()
	mbps := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(tOurs), "store-MB/s")
	b.ReportMetric(mbps(tPlain), "http-MB/s")
	b.ReportMetric(tPlain.Seconds()/tOurs.Seconds(), "ratio")
}
