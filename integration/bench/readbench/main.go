// Command readbench measures how fast zarrfs's reader decodes a whole array
// sample by sample: it opens a store with zarr.Open and reads every index
// along the sample dimension with Hierarchy.Read, a batch of N samples per
// call, into buffers reused from batch to batch. It prints one JSON line:
// decoded bytes, seconds, GB/s (10^9 bytes per second), and peak resident
// memory against the bytes in flight (the decoded batch buffers).
//
// Usage: readbench [-array t2m] [-dim time] [-batch 8] [-readers 1] [-steps 0] STORE
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

type result struct {
	Reader      string  `json:"reader"`
	Mode        string  `json:"mode"`
	Store       string  `json:"store"`
	Array       string  `json:"array"`
	Steps       int64   `json:"steps"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
	GBps        float64 `json:"gbps"`
	PeakRSS     int64   `json:"peak_rss_bytes"`
	BaseRSS     int64   `json:"base_rss_bytes"`
	InFlight    int64   `json:"in_flight_bytes"`
	PeakOverIn  float64 `json:"peak_over_in_flight"`
	GrowthOver  float64 `json:"growth_over_in_flight"` // (peak - base) / in flight: memory beyond the buffers
	Step0SHA256 string  `json:"sha256_step0"`
	GOMAXPROCS  int     `json:"gomaxprocs"`
}

func main() {
	array := flag.String("array", "t2m", "array path in the store")
	dim := flag.String("dim", "time", "dimension read one index at a time")
	batch := flag.Int("batch", 8, "samples per Read call")
	readers := flag.Int("readers", 1, "Read calls in flight at once, each with its own buffers")
	steps := flag.Int64("steps", 0, "read only the first N samples (0: all)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the timed reads to this file")
	chunkCache := flag.Int64("chunk-cache", -1, "zarr.Options.ChunkCacheBytes (-1 disables: every sample here uses whole chunks)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: readbench [flags] STORE\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *batch < 1 || *readers < 1 {
		flag.Usage()
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "readbench: %v\n", err)
			os.Exit(1)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "readbench: %v\n", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	res, err := run(flag.Arg(0), *array, *dim, *batch, *readers, *steps, *chunkCache)
	if err != nil {
		fmt.Fprintf(os.Stderr, "readbench: %v\n", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
}

func run(dir, path, dim string, batch, readers int, steps, chunkCache int64) (*result, error) {
	ctx := context.Background()
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// One CPU worker per core, as the mount decodes.
	dec, err := codec.NewCPU(codec.Options{})
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	h, err := zarr.Open(ctx, st, zarr.Options{ChunkCacheBytes: chunkCache, Decoder: dec, Host: memory.NewArena(1 << 30)})
	if err != nil {
		return nil, err
	}
	var a *zarr.Array
	for _, x := range h.Arrays {
		if x.Path == path {
			a = x
		}
	}
	if a == nil {
		return nil, fmt.Errorf("%s: no array %q", dir, path)
	}
	if a.Unsupported != "" {
		return nil, fmt.Errorf("%s: array %q unsupported: %s", dir, path, a.Unsupported)
	}
	td := slices.Index(a.Dims, dim)
	if td < 0 {
		return nil, fmt.Errorf("%s: array %q has no dimension %q (dims %q)", dir, path, dim, a.Dims)
	}
	n := a.Shape[td]
	if steps > 0 && steps < n {
		n = steps
	}
	count := slices.Clone(a.Shape)
	count[td] = 1
	stepBytes := int64(a.DType.Size)
	for _, c := range count {
		stepBytes *= c
	}
	request := func(t int64, dst []byte) zarr.Request {
		start := make([]int64, len(a.Shape))
		start[td] = t
		return zarr.Request{Array: a, Start: start, Count: count, Dst: dst}
	}

	// Step 0 once before timing: checks the values against the peers' and
	// faults in the code paths, so the timed loop measures steady state.
	first := make([]byte, stepBytes)
	if err := h.Read(ctx, nil, []zarr.Request{request(0, first)}); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(first)
	first = nil
	runtime.GC()

	// Buffers: one batch per reader, made resident before the peak is reset
	// so that base_rss holds them and growth is the reader's own overhead.
	bufs := make([][][]byte, readers)
	for r := range bufs {
		bufs[r] = make([][]byte, batch)
		for i := range bufs[r] {
			bufs[r][i] = make([]byte, stepBytes)
			for j := 0; j < len(bufs[r][i]); j += 4096 {
				bufs[r][i][j] = 1
			}
		}
	}
	inFlight := int64(readers*batch) * stepBytes
	resetPeak()
	base := procStatus("VmRSS")

	secs, err := timedReads(ctx, h, n, batch, bufs, request)
	if err != nil {
		return nil, err
	}
	peak := procStatus("VmHWM")
	runtime.KeepAlive(bufs)
	total := n * stepBytes
	res := &result{
		Reader: "zarrfs", Mode: fmt.Sprintf("batch%d", batch), Store: filepath.Base(filepath.Clean(dir)),
		Array: path, Steps: n, Bytes: total, Seconds: round(secs), GBps: round(float64(total) / secs / 1e9),
		PeakRSS: peak, BaseRSS: base, InFlight: inFlight,
		PeakOverIn: round(float64(peak) / float64(inFlight)), GrowthOver: round(float64(peak-base) / float64(inFlight)),
		Step0SHA256: hex.EncodeToString(sum[:]), GOMAXPROCS: runtime.GOMAXPROCS(0),
	}
	if readers > 1 {
		res.Mode += fmt.Sprintf("x%d", readers)
	}
	return res, nil
}

// timedReads reads steps 0..n-1 of the array, batch steps a Read, by one
// goroutine per buffer set of bufs, and returns the seconds it took.
func timedReads(ctx context.Context, h *zarr.Hierarchy, n int64, batch int, bufs [][][]byte, request func(t int64, dst []byte) zarr.Request) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int64)
	errs := make(chan error, len(bufs))
	var wg sync.WaitGroup
	t0 := time.Now()
	for r := range bufs {
		wg.Add(1)
		go func(bs [][]byte) {
			defer wg.Done()
			reqs := make([]zarr.Request, 0, batch)
			for t := range next {
				reqs = reqs[:0]
				for i := int64(0); i < int64(batch) && t+i < n; i++ {
					reqs = append(reqs, request(t+i, bs[i]))
				}
				if err := h.Read(ctx, nil, reqs); err != nil {
					errs <- err
					cancel() // stops the feeder and the other readers
					return
				}
			}
		}(bufs[r])
	}
	go func() {
		defer close(next)
		for t := int64(0); t < n; t += int64(batch) {
			select {
			case next <- t:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	secs := time.Since(t0).Seconds()
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	return secs, nil
}

func round(f float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'f', 4, 64), 64)
	return v
}

// resetPeak resets VmHWM to the current RSS (Linux: "5" to clear_refs), so
// the peak reported covers only the timed reads.
func resetPeak() {
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// procStatus returns a /proc/self/status memory field in bytes (0 if absent).
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok || k != field {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0
		}
		return kb * 1024
	}
	return 0
}
