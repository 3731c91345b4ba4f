package objectstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/zarrfs/zarrfs/integration/miniotest"
	"github.com/zarrfs/zarrfs/objectstore"
)

// BenchmarkS3ColdFetch fetches the same set of 1-4 MB objects from a local
// MinIO through the S3 store (Get, MaxInFlight workers) and through plain
// parallel minio-go GetObject calls, alternating which goes first, each with
// a fresh client (cold connections, no cache). It reports both throughputs
// and their ratio (store / minio-go; the target is >= 0.8).
//
// ZARRFS_BENCH_S3_OBJECTS sets the object count (default 256).
func BenchmarkS3ColdFetch(b *testing.B) {
	n := 256
	if v, err := strconv.Atoi(os.Getenv("ZARRFS_BENCH_S3_OBJECTS")); err == nil && v > 0 {
		n = v
	}
	srv := miniotest.Start(b)
	bucket := srv.NewBucket(b)
	rng := rand.New(rand.NewPCG(5, 6))
	files := make(map[string][]byte, n)
	keys := make([]string, 0, n)
	var total int64
	for i := range n {
		size := 1<<20 + rng.IntN(3<<20)
		data := make([]byte, size)
		for j := 0; j+8 <= size; j += 8 {
			binary.LittleEndian.PutUint64(data[j:], rng.Uint64())
		}
		k := fmt.Sprintf("t/c/%d/0", i)
		files[k] = data
		keys = append(keys, k)
		total += int64(size)
	}
	srv.UploadFiles(b, bucket, "bench.zarr", files)
	files = nil
	const workers = objectstore.DefaultS3MaxInFlight
	ctx := context.Background()

	// fetchAll runs get over every key with the given parallelism.
	fetchAll := func(get func(k string) (int, error)) (time.Duration, error) {
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
					m, err := get(k)
					mu.Lock()
					got += int64(m)
					if err != nil && first == nil {
						first = err
					}
					mu.Unlock()
				}
			}()
		}
		for _, k := range keys {
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
		s, err := objectstore.OpenS3(ctx, "s3://"+bucket+"/bench.zarr", objectstore.S3Options{
			Endpoint: srv.Endpoint, Region: "us-east-1", Credentials: staticCreds(srv)})
		if err != nil {
			return 0, err
		}
		st := must(objectstore.WithRetry(s, objectstore.RetryOptions{}))
		return fetchAll(func(k string) (int, error) {
			buf, err := st.Get(ctx, k)
			return len(buf), err
		})
	}
	plain := func() (time.Duration, error) {
		c, err := minio.New(srv.Host, &minio.Options{Creds: staticCreds(srv), Region: "us-east-1"})
		if err != nil {
			return 0, err
		}
		return fetchAll(func(k string) (int, error) {
			obj, err := c.GetObject(ctx, bucket, "bench.zarr/"+k, minio.GetObjectOptions{})
			if err != nil {
				return 0, err
			}
			defer obj.Close()
			// Size the buffer from the response, as the store does, so the
			// comparison is of fetching and not of buffer growth.
			info, err := obj.Stat()
			if err != nil {
				return 0, err
			}
			buf := make([]byte, info.Size)
			m, err := io.ReadFull(obj, buf)
			return m, err
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
	b.ReportMetric(mbps(tPlain), "minio-go-MB/s")
	b.ReportMetric(tPlain.Seconds()/tOurs.Seconds(), "ratio")
}
