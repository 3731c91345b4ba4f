package integration

import (
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/internal/testenv"
)

// writeFillStore writes a Zarr v3 store holding one float32 array t of the
// given shape with no chunks written: every sample reads as the fill value,
// so a mount of it measures the mount and the cache, not a decoder.
func writeFillStore(t testing.TB, shape []int64, chunk []int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "fill.zarr")
	os.MkdirAll(filepath.Join(dir, "t"), 0o755)
	os.WriteFile(filepath.Join(dir, "zarr.json"), []byte(`{"zarr_format":3,"node_type":"group","attributes":{}}`), 0o644)
	js := func(s []int64) string {
		var p []string
		for _, v := range s {
			p = append(p, strconv.FormatInt(v, 10))
		}
		return "[" + strings.Join(p, ",") + "]"
	}
	meta := fmt.Sprintf(`{"zarr_format":3,"node_type":"array","shape":%s,"data_type":"float32",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":%s}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},"fill_value":1.5,
"codecs":[{"name":"bytes","configuration":{"endian":"little"}}],"dimension_names":["time","lat","lon"],"attributes":{}}`, js(shape), js(chunk))
	os.WriteFile(filepath.Join(dir, "t", "zarr.json"), []byte(meta), 0o644)
	return dir
}

// readAll reads every file with n goroutines (each takes files round robin)
// in 1 MiB preads, and returns the bytes read.
func readAll(tb testing.TB, files []string, n int) int64 {
	var total int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			var got int64
			for i := g; i < len(files); i += n {
				f, err := os.Open(files[i])
				if err != nil {
					tb.Error(err)
					return
				}
				for off := int64(0); ; {
					k, err := f.ReadAt(buf, off)
					off += int64(k)
					got += int64(k)
					if err == io.EOF {
						break
					}
					if err != nil {
						tb.Error(err)
						break
					}
				}
				f.Close()
			}
			mu.Lock()
			total += got
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total
}

// BenchmarkWarmRead compares reading warm samples through the mount with
// reading the same backing cache files directly, in one run. The ratio
// mount/direct is the number that matters (target >= 0.95).
func BenchmarkWarmRead(b *testing.B) {
	requireMountTools(b)
	const n = 32
	d := mount(b, writeFillStore(b, []int64{n, 721, 1440}, []int64{1, 721, 1440}))
	var viaMount []string
	for i := range n {
		viaMount = append(viaMount, filepath.Join(d.mnt, "t", fmt.Sprintf("%02d.npy", i)))
	}
	readAll(b, viaMount, 4) // fill the cache
	var direct []string
	filepath.WalkDir(filepath.Join(d.cache, "blobs"), func(p string, e os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".npy") {
			direct = append(direct, p)
		}
		return nil
	})
	if len(direct) != n {
		b.Fatalf("%d backing files, want %d", len(direct), n)
	}
	size := readAll(b, direct, 1)
	for _, threads := range []int{1, 8} {
		for _, src := range []struct {
			name  string
			files []string
		}{{"direct", direct}, {"mount", viaMount}} {
			b.Run(fmt.Sprintf("%s/threads=%d", src.name, threads), func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					readAll(b, src.files, threads)
				}
			})
		}
	}
}

// BenchmarkLsLong100k times `ls -l` of a 100,000-sample directory through
// the mount; nothing is filled.
func BenchmarkLsLong100k(b *testing.B) {
	requireMountTools(b)
	d := mount(b, writeFillStore(b, []int64{100000, 721, 1440}, []int64{10, 721, 1440}))
	dir := filepath.Join(d.mnt, "t")
	for i := 0; b.Loop(); i++ {
		if i == 0 {
			start := time.Now()
			if err := exec.Command("ls", "-l", dir).Run(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(time.Since(start).Seconds(), "cold-s")
			continue
		}
		if err := exec.Command("ls", "-l", dir).Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// peerSeconds parses the seconds a peer script printed: one positive
// number. A broken peer must stop the benchmark, not report 0 ms.
func peerSeconds(out string) (float64, error) {
	s, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil {
		return 0, fmt.Errorf("output %q is not a number of seconds: %w", out, err)
	}
	if !(s > 0) || math.IsInf(s, 0) {
		return 0, fmt.Errorf("output %q: %v seconds", out, s)
	}
	return s, nil
}

// BenchmarkColdOpen measures open-to-first-byte of samples that need a chunk
// not yet decoded: t is (60, 721, 1440) float32 in zstd chunks of 10 time
// steps written by zarr-python, and each open is the first sample of a fresh
// chunk. zarr-python reading the same samples runs in the same benchmark.
func BenchmarkColdOpen(b *testing.B) {
	requirePython(b)
	if err := exec.Command("python3", "-c", "import zarr").Run(); err != nil {
		testenv.Missing(b, "zarr-python is needed (make pydeps)")
	}
	dir := filepath.Join(b.TempDir(), "era.zarr")
	python(b, `
import sys, numpy as np, zarr
from zarr.codecs import ZstdCodec
g = zarr.open_group(sys.argv[1], mode='w')
a = g.create_array('t', shape=(60, 721, 1440), chunks=(10, 721, 1440), dtype='float32',
                   compressors=[ZstdCodec(level=3)], dimension_names=['time', 'lat', 'lon'], fill_value=0)
y = np.linspace(-1, 1, 721, dtype=np.float32)[:, None]
x = np.linspace(0, 6.28, 1440, dtype=np.float32)[None, :]
rng = np.random.default_rng(0)
for c in range(6):
    a[c*10:(c+1)*10] = np.stack([np.sin(x + t) * np.cos(3*y) * 30 + 270 + rng.normal(0, 0.5, (721, 1440)).astype(np.float32) for t in range(10)])
`, dir)
	pyOut := python(b, `
import sys, time, zarr
a = zarr.open_array(sys.argv[1] + '/t', mode='r')
ts = []
for c in range(6):
    t0 = time.perf_counter(); v = a[c*10]; ts.append(time.perf_counter() - t0)
print(sum(ts) / len(ts))
`, dir)
	pySec, err := peerSeconds(pyOut)
	if err != nil {
		b.Fatalf("zarr-python's timing: %v", err)
	}
	var total time.Duration
	var opens int
	for b.Loop() {
		b.StopTimer()
		d := mount(b, dir)
		b.StartTimer()
		for c := range 6 {
			start := time.Now()
			f, err := os.Open(filepath.Join(d.mnt, "t", fmt.Sprintf("%02d.npy", c*10)))
			if err != nil {
				b.Fatal(err)
			}
			var one [1]byte
			if _, err := f.Read(one[:]); err != nil {
				b.Fatal(err)
			}
			total += time.Since(start)
			opens++
			f.Close()
		}
		b.StopTimer()
		d.stop(b)
		b.StartTimer()
	}
	b.ReportMetric(total.Seconds()/float64(opens)*1e3, "ms/cold-open")
	b.ReportMetric(pySec*1e3, "ms/zarr-python-read")
}

func TestPeerSeconds(t *testing.T) {
	if s, err := peerSeconds("0.0125\n"); err != nil || s != 0.0125 {
		t.Errorf("peerSeconds(0.0125) = %v, %v", s, err)
	}
	for _, bad := range []string{"", "Traceback (most recent call last):\n", "0", "-1", "nan", "inf", "0.1 0.2"} {
		if s, err := peerSeconds(bad); err == nil {
			t.Errorf("peerSeconds(%q) = %v, want an error", bad, s)
		}
	}
}
