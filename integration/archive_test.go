package integration

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore/gcstest"
)

// The archive: ARCO-ERA5's 744,000 hourly steps declared by consolidated
// metadata, of which the first objects/2 steps of two variables hold chunk
// objects (the rest read as fill values), raw little-endian float32.
const (
	archiveSteps  = 744_000
	archiveLevels = 37
	archiveLat    = 4
	archiveLon    = 8
)

func archiveT(t, i int) float32 { return float32(float64(t)*1000 + float64(i)) }
func archiveS(t, i int) float32 { return float32(-float64(t)*10 - float64(i)) }

func f32s(n int, f func(i int) float32) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f(i)))
	}
	return b
}

// archiveObjects is how many chunk objects the archive holds: 20,000 in
// tests, $ZARRFS_ARCHIVE_OBJECTS (200,000 for BENCHMARKS.md) when set.
func archiveObjects(t *testing.T) int {
	if v := os.Getenv("ZARRFS_ARCHIVE_OBJECTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 || n > 2*archiveSteps {
			t.Fatalf("ZARRFS_ARCHIVE_OBJECTS=%q: want 2 to %d", v, 2*archiveSteps)
		}
		return n
	}
	return 20_000
}

// archiveMetadata is the archive's metadata documents, consolidated
// (.zmetadata) and not.
func archiveMetadata() map[string][]byte {
	arr := func(shape, chunks []int, dims []string) map[string]any {
		return map[string]any{".zarray": map[string]any{"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": "<f4",
			"compressor": nil, "filters": nil, "fill_value": "NaN", "order": "C", "dimension_separator": "."},
			".zattrs": map[string]any{"_ARRAY_DIMENSIONS": dims, "units": "K"}}
	}
	md := map[string]any{".zgroup": map[string]any{"zarr_format": 2}, ".zattrs": map[string]any{"title": "archive"}}
	add := func(name string, a map[string]any) {
		md[name+"/.zarray"], md[name+"/.zattrs"] = a[".zarray"], a[".zattrs"]
	}
	add("temperature", arr([]int{archiveSteps, archiveLevels, archiveLat, archiveLon}, []int{1, archiveLevels, archiveLat, archiveLon},
		[]string{"time", "level", "latitude", "longitude"}))
	add("2m_temperature", arr([]int{archiveSteps, archiveLat, archiveLon}, []int{1, archiveLat, archiveLon},
		[]string{"time", "latitude", "longitude"}))
	zm, _ := json.Marshal(map[string]any{"zarr_consolidated_format": 1, "metadata": md})
	files := map[string][]byte{".zmetadata": zm}
	for k, v := range md {
		b, _ := json.Marshal(v)
		files[k] = b
	}
	return files
}

// writeArchive uploads the archive below prefix and returns the number of
// steps that hold chunks.
func writeArchive(t testing.TB, srv *gcstest.Server, bucket, prefix string, objects int) int {
	srv.UploadFiles(t, bucket, prefix, archiveMetadata())
	steps := objects / 2
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := w; s < steps; s += 4 {
				srv.Put(bucket, fmt.Sprintf("%s/temperature/%d.0.0.0", prefix, s), f32s(archiveLevels*archiveLat*archiveLon, func(i int) float32 { return archiveT(s, i) }))
				srv.Put(bucket, fmt.Sprintf("%s/2m_temperature/%d.0.0", prefix, s), f32s(archiveLat*archiveLon, func(i int) float32 { return archiveS(s, i) }))
			}
		}()
	}
	wg.Wait()
	t.Logf("%d chunk objects uploaded in %v", 2*steps, time.Since(start).Round(time.Millisecond))
	return steps
}

// requestLog records the emulator's requests by kind: list, stat, read (of
// a chunk) and meta (a read of a metadata document). Reads are media
// downloads of the JSON API (alt=media) or GETs of the XML API.
type requestLog struct {
	mu   sync.Mutex
	reqs []string // "KIND PATH"
}

func (l *requestLog) hook(r *http.Request) {
	p := r.URL.Path
	jsonAPI := strings.HasPrefix(p, "/storage/v1/b/")
	kind := "read"
	switch {
	case jsonAPI && (strings.HasSuffix(p, "/o") || strings.HasSuffix(p, "/o/")),
		r.URL.Query().Has("prefix"):
		kind = "list"
	case jsonAPI && r.URL.Query().Get("alt") != "media":
		kind = "stat"
	case strings.Contains(p, "/.z") || strings.HasSuffix(p, "/zarr.json"):
		kind = "meta" // metadata, re-read every --metadata-ttl
	}
	l.mu.Lock()
	l.reqs = append(l.reqs, kind+" "+p)
	l.mu.Unlock()
}

// since returns the requests made after the first n, counted by kind.
func (l *requestLog) since(n int) (counts map[string]int, all []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	counts = map[string]int{}
	for _, r := range l.reqs[n:] {
		kind, _, _ := strings.Cut(r, " ")
		counts[kind]++
		all = append(all, r)
	}
	return counts, all
}

func (l *requestLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reqs)
}

// An archive of 744,000 steps in a bucket of many objects: the mount is
// live from the consolidated metadata alone (no listing), the first read
// of a sample reads its chunks and nothing else (their generations come
// with them), a missing step costs one request and reads as NaN, after
// --metadata-ttl revalidating a cached sample asks its chunks'
// generations and reads nothing, and a chunk rewritten in place is read
// anew. With --chunk-versions metadata revalidation costs nothing (and a
// rewrite is not noticed).
func TestArchiveScale(t *testing.T) {
	requireMountTools(t)
	root := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		// The emulator's file backend syncs every object it writes: on
		// tmpfs that costs nothing.
		if d, err := os.MkdirTemp("/dev/shm", "zarrfs-gcs-"); err == nil {
			root = d
			t.Cleanup(func() { os.RemoveAll(d) })
		}
	}
	if root == "" {
		root = t.TempDir()
	}
	srv := gcstest.StartIn(t, root)
	log := &requestLog{}
	srv.OnRequest(log.hook)
	bucket := srv.NewBucket(t)
	objects := archiveObjects(t)
	steps := writeArchive(t, srv, bucket, "ar/era5.zarr", objects)
	view := filepath.Join(t.TempDir(), "view.yaml")
	os.WriteFile(view, []byte("views:\n  - name: both\n    channels:\n      - var: temperature\n        select: {level: [0, 36]}\n      - var: 2m_temperature\n"), 0o644)

	zarrfsBin(t) // built before the clock starts
	for _, mode := range []string{"object", "metadata"} {
		t.Run("versions="+mode, func(t *testing.T) {
			n0 := log.len()
			start := time.Now()
			d := mountAt(t, "gs://"+bucket+"/ar/era5.zarr", t.TempDir(), t.TempDir(), "--gcs-endpoint", srv.URL, "--gcs-anonymous",
				"--view", view, "--metadata-ttl", "2s", "--chunk-versions", mode)
			live := time.Since(start)
			c, reqs := log.since(n0)
			t.Logf("live in %v after %d requests %v; daemon RSS %d MiB", live.Round(time.Millisecond), len(reqs), reqs, rssBytes(d.cmd.Process.Pid)>>20)
			if c["list"] != 0 || c["read"] != 0 || c["meta"] > 2 {
				t.Fatalf("mounting made %v requests: %v", c, reqs)
			}
			perChunk := 1 // the chunk's read, whatever the mode

			read := func(f string) []byte {
				t.Helper()
				b, err := os.ReadFile(filepath.Join(d.mnt, f))
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				return b[4096:]
			}
			sample := func(k int) string { return fmt.Sprintf("%06d.npy", k) }
			k := steps / 3
			n0 = log.len()
			got := read("temperature/" + sample(k))
			c, reqs = log.since(n0)
			if want := f32s(archiveLevels*archiveLat*archiveLon, func(i int) float32 { return archiveT(k, i) }); string(got) != string(want) {
				t.Fatalf("temperature/%s: wrong values", sample(k))
			}
			t.Logf("first read of one sample of one chunk: %v", reqs)
			if c["list"] != 0 || c["read"]+c["stat"] != perChunk || c["read"] != 1 {
				t.Errorf("first read of a sample of one chunk made %v, want %d requests, no listing", reqs, perChunk)
			}

			n0 = log.len()
			got = read("both/" + sample(k+1))
			c, reqs = log.since(n0)
			t.Logf("first read of a view sample of two chunks: %v", reqs)
			if c["list"] != 0 || c["read"]+c["stat"] != 2*perChunk || c["read"] != 2 {
				t.Errorf("first read of a view sample of two chunks made %v, want %d requests, no listing", reqs, 2*perChunk)
			}
			want := append(f32s(archiveLat*archiveLon, func(i int) float32 { return archiveT(k+1, i) }),
				f32s(archiveLat*archiveLon, func(i int) float32 { return archiveT(k+1, 36*archiveLat*archiveLon+i) })...)
			want = append(want, f32s(archiveLat*archiveLon, func(i int) float32 { return archiveS(k+1, i) })...)
			if string(got) != string(want) {
				t.Fatalf("both/%s: wrong values", sample(k+1))
			}

			n0 = log.len()
			got = read("2m_temperature/" + sample(archiveSteps-1))
			c, reqs = log.since(n0)
			if f := math.Float32frombits(binary.LittleEndian.Uint32(got)); !math.IsNaN(float64(f)) {
				t.Errorf("a step without a chunk reads %v, want NaN", f)
			}
			if c["read"]+c["stat"] != 1 || c["list"] != 0 {
				t.Errorf("a step without a chunk made %v, want one request", reqs)
			}

			// Past --metadata-ttl the mount re-reads the metadata; reading a
			// cached sample again revalidates its chunk and reads nothing.
			time.Sleep(4500 * time.Millisecond)
			n0 = log.len()
			read("temperature/" + sample(k))
			c, reqs = log.since(n0)
			t.Logf("a cached sample read again after --metadata-ttl: %v", reqs)
			asks := map[string]int{"object": 1, "metadata": 0}[mode]
			if c["list"] != 0 || c["read"] != 0 || c["stat"] != asks {
				t.Errorf("revalidating a cached sample of one chunk made %v, want %d metadata requests and no read", reqs, asks)
			}
			if mode != "object" {
				return
			}

			// The chunk rewritten in place: past --metadata-ttl the sample
			// is read anew, never served stale.
			obj := fmt.Sprintf("ar/era5.zarr/temperature/%d.0.0.0", k)
			srv.Put(bucket, obj, f32s(archiveLevels*archiveLat*archiveLon, func(i int) float32 { return archiveT(k, i) + 0.5 }))
			defer srv.Put(bucket, obj, f32s(archiveLevels*archiveLat*archiveLon, func(i int) float32 { return archiveT(k, i) }))
			time.Sleep(4500 * time.Millisecond)
			n0 = log.len()
			got = read("temperature/" + sample(k))
			c, reqs = log.since(n0)
			t.Logf("the sample read again after its chunk was rewritten: %v", reqs)
			if want := f32s(archiveLevels*archiveLat*archiveLon, func(i int) float32 { return archiveT(k, i) + 0.5 }); string(got) != string(want) {
				t.Fatalf("temperature/%s after its chunk was rewritten: stale values", sample(k))
			}
			if c["list"] != 0 || c["read"] != 1 || c["stat"] != 1 {
				t.Errorf("reading a rewritten chunk made %v, want its generation and its read", reqs)
			}
		})
	}
}
