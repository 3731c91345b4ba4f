// Command viewbench measures the cold fill of a stacked training view
// against the plain xarray + zarr-python loader in the same run.
//
// It opens the store, binds the view file, builds the layout and fills the
// first N samples of the view, each a (C, H, W) .npy blob, twice on fresh
// hierarchy (so the decoded-chunk cache starts empty), sample by sample
// with fill.Filler.Fill, as a mount serves opens. Then it runs baseline.py, which assembles
// the same samples with xarray (ds[vars].isel(time=k).to_array() per
// sample), and prints the ratio, the zarr decode counter against the number
// of distinct source chunks the samples need, and whether sample 0 of every
// zarrfs run is byte-identical to the baseline's. The bytes reported are
// the data bytes the fills wrote, counted as they are written; a run that
// wrote fewer than its blobs hold, or a disagreement with the baseline,
// fails the command.
//
// Usage (from the repository root): viewbench [-n 20] [-write DIR] [-python python3] STOREDIR
// where STOREDIR holds era5_views.zarr, train.yaml and channels.json
// (make_store.py writes them).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/codec"
	zfill "github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

type result struct {
	Reader        string  `json:"reader"`
	Mode          string  `json:"mode"`
	Samples       int     `json:"samples"`
	Channels      int     `json:"channels"`
	Bytes         int64   `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	GBps          float64 `json:"gbps"`
	ChunksDecoded int64   `json:"chunks_decoded"`
	SourceChunks  int     `json:"source_chunks"`
	CacheHits     int64   `json:"chunk_cache_hits"`
	GOMAXPROCS    int     `json:"gomaxprocs"`
}

func main() {
	n := flag.Int("n", 20, "samples to fill (the first N of the view)")
	write := flag.String("write", "", "write the blobs as files under DIR (default: discard them, as the baseline keeps arrays in memory)")
	py := flag.String("python", "python3", "python with xarray and zarr for the baseline (empty: skip it)")
	baseline := flag.String("baseline", "integration/bench/views/baseline.py", "the baseline script (the default is relative to the repository root)")
	chunkCache := flag.Int64("chunk-cache", 0, "zarr.Options.ChunkCacheBytes (0: 2.25 x the view's working set, at least 256 MiB)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: viewbench [flags] STOREDIR\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *n < 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *n, *write, *py, *baseline, *chunkCache); err != nil {
		fmt.Fprintf(os.Stderr, "viewbench: %v\n", err)
		os.Exit(1)
	}
}

// setup opens the store and builds the layout with the view. By default the
// decoded-chunk cache holds two generations of the view's working set (the
// chunks one sample touches) plus a quarter: the cache's admission policy
// (TinyLFU) keeps the often-hit chunks of the previous time chunk and
// refuses new ones once full, so one generation is not enough.
func setup(ctx context.Context, dir string, cacheBytes int64) (*zarr.Hierarchy, *layout.Layout, *layout.View, error) {
	st, err := objectstore.OpenPosix(filepath.Join(dir, "era5_views.zarr"))
	if err != nil {
		return nil, nil, nil, err
	}
	specs, err := layout.LoadViews(filepath.Join(dir, "train.yaml"))
	if err != nil {
		return nil, nil, nil, err
	}
	probe, err := zarr.Open(ctx, st, zarr.Options{})
	if err != nil {
		return nil, nil, nil, err
	}
	views, err := layout.BindViews(ctx, probe, specs, layout.BindOptions{})
	if err != nil {
		return nil, nil, nil, err
	}
	if cacheBytes == 0 {
		cacheBytes = max(views[0].WorkingSetBytes()*9/4, 256<<20)
	}
	// One CPU worker per core, as the mount decodes; it lives as long as
	// the process.
	dec, err := codec.NewCPU(codec.Options{})
	if err != nil {
		return nil, nil, nil, err
	}
	h, err := zarr.Open(ctx, st, zarr.Options{ChunkCacheBytes: cacheBytes, Decoder: dec, Host: memory.NewArena(1 << 30)})
	if err != nil {
		return nil, nil, nil, err
	}
	if views, err = layout.BindViews(ctx, h, specs, layout.BindOptions{}); err != nil {
		return nil, nil, nil, err
	}
	l, err := layout.Build(h, layout.Options{Views: views})
	if err != nil {
		return nil, nil, nil, err
	}
	return h, l, views[0], nil
}

// sourceChunks counts the distinct chunks the blobs' source regions touch.
func sourceChunks(blobs []layout.Blob) int {
	seen := map[string]bool{}
	for _, b := range blobs {
		for _, q := range b.Sources() {
			lo := make([]int64, len(q.Start))
			hi := make([]int64, len(q.Start))
			for d := range lo {
				lo[d] = q.Start[d] / q.Array.Chunks[d]
				hi[d] = (q.Start[d]+q.Count[d]-1)/q.Array.Chunks[d] + 1
			}
			eachIndex(lo, hi, func(c []int64) { seen[q.Array.ChunkKey(c)] = true })
		}
	}
	return len(seen)
}

func eachIndex(lo, hi []int64, f func([]int64)) {
	c := append([]int64(nil), lo...)
	for {
		f(c)
		d := len(c) - 1
		for ; d >= 0; d-- {
			if c[d]++; c[d] < hi[d] {
				break
			}
			c[d] = lo[d]
		}
		if d < 0 {
			return
		}
	}
}

type discard struct{}

func (discard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// sink returns where blob i goes, and a function that closes it.
func sink(write string, b layout.Blob) (io.WriterAt, func() error, error) {
	if write == "" {
		return discard{}, func() error { return nil }, nil
	}
	p := filepath.Join(write, b.Path())
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, nil, err
	}
	f, err := os.Create(p)
	if err != nil {
		return nil, nil, err
	}
	return f, f.Close, nil
}

// counter counts the data bytes written through it: those at or past the
// blob's data offset (the npy header before it is not data).
type counter struct {
	io.WriterAt
	align int64
	n     *atomic.Int64
}

func (c counter) WriteAt(p []byte, off int64) (int, error) {
	n, err := c.WriterAt.WriteAt(p, off)
	if end := off + int64(n); end > c.align {
		c.n.Add(end - max(off, c.align))
	}
	return n, err
}

// capture keeps the bytes of sample 0 for the comparison with the baseline.
type capture struct {
	io.WriterAt
	buf []byte
}

func (c *capture) WriteAt(p []byte, off int64) (int, error) {
	if end := off + int64(len(p)); end > int64(len(c.buf)) {
		c.buf = append(c.buf, make([]byte, end-int64(len(c.buf)))...)
	}
	copy(c.buf[off:], p)
	return c.WriterAt.WriteAt(p, off)
}

func fill(ctx context.Context, dir string, n int, write, mode string, chunkCache int64) (*result, []byte, error) {
	h, l, v, err := setup(ctx, dir, chunkCache)
	if err != nil {
		return nil, nil, err
	}
	if int64(n) > v.N {
		return nil, nil, fmt.Errorf("view has %d samples, asked for %d", v.N, n)
	}
	e, _ := l.Lookup(v.Name)
	var blobs []layout.Blob
	for i := range n {
		blobs = append(blobs, e.Dir.Entry(i).Blob)
	}
	var ws []io.WriterAt
	var closers []func() error
	for _, b := range blobs {
		w, c, err := sink(write, b)
		if err != nil {
			return nil, nil, err
		}
		ws, closers = append(ws, w), append(closers, c)
	}
	first := &capture{WriterAt: ws[0]}
	ws[0] = first
	var written atomic.Int64
	for i := range ws {
		ws[i] = counter{WriterAt: ws[i], align: l.Align(), n: &written}
	}
	stats := h.Stats()
	dec0, hit0 := stats.ChunksDecoded.Load(), stats.ChunkCacheHits.Load()
	filler, err := zfill.New(zfill.Options{})
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	for i, b := range blobs {
		if err := filler.Fill(ctx, l, b, nil, ws[i]); err != nil {
			return nil, nil, err
		}
	}
	for _, c := range closers {
		if err := c(); err != nil {
			return nil, nil, err
		}
	}
	secs := time.Since(start).Seconds()
	var want int64
	for _, b := range blobs {
		want += b.Size() - l.Align()
	}
	bytes := written.Load()
	if bytes != want {
		return nil, nil, fmt.Errorf("%s: the fills wrote %d data bytes, the blobs hold %d", mode, bytes, want)
	}
	if int64(len(first.buf)) != blobs[0].Size() {
		return nil, nil, fmt.Errorf("%s: sample 0: %d bytes written, the blob holds %d", mode, len(first.buf), blobs[0].Size())
	}
	return &result{
		Reader: "zarrfs", Mode: mode, Samples: n, Channels: int(v.SampleShape[0]), Bytes: bytes, Seconds: secs,
		GBps: float64(bytes) / secs / 1e9, ChunksDecoded: stats.ChunksDecoded.Load() - dec0, SourceChunks: sourceChunks(blobs),
		CacheHits: stats.ChunkCacheHits.Load() - hit0, GOMAXPROCS: runtime.GOMAXPROCS(0),
	}, first.buf[l.Align():], nil
}

func run(dir string, n int, write, py, baseline string, chunkCache int64) error {
	ctx := context.Background()
	var samples [][]byte // sample 0 of every run
	var ours []*result
	for _, mode := range []string{"fill"} {
		r, s0, err := fill(ctx, dir, n, write, mode, chunkCache)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		if r.ChunksDecoded != int64(r.SourceChunks) {
			fmt.Fprintf(os.Stderr, "viewbench: %s decoded %d chunks for %d source chunks\n", mode, r.ChunksDecoded, r.SourceChunks)
		}
		ours = append(ours, r)
		samples = append(samples, s0)
	}
	if py == "" {
		return nil
	}
	dump := filepath.Join(os.TempDir(), fmt.Sprintf("viewbench-%d.bin", os.Getpid()))
	defer os.Remove(dump)
	cmd := exec.Command(py, baseline, filepath.Join(dir, "era5_views.zarr"), filepath.Join(dir, "channels.json"), fmt.Sprint(n), "--dump", dump)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	fmt.Print(string(out))
	var base struct {
		Seconds float64 `json:"seconds"`
		Bytes   int64   `json:"bytes"`
	}
	if err := json.Unmarshal(out, &base); err != nil {
		return fmt.Errorf("baseline output %q: %w", out, err)
	}
	ref, err := os.ReadFile(dump)
	if err != nil {
		return err
	}
	fmt.Printf("view fill, %d samples x %d channels (721 x 1440 float32, %.2f GB), GOMAXPROCS %d:\n", n, ours[0].Channels, float64(ours[0].Bytes)/1e9, ours[0].GOMAXPROCS)
	for _, r := range ours {
		fmt.Printf("  zarrfs %-5s %6.2f s  %5.2f GB/s  %5.1fx xarray+zarr-python  chunks decoded %d, source chunks %d\n",
			r.Mode, r.Seconds, r.GBps, base.Seconds/r.Seconds, r.ChunksDecoded, r.SourceChunks)
	}
	fmt.Printf("  xarray+zarr-python %6.2f s  %5.2f GB/s\n", base.Seconds, float64(base.Bytes)/base.Seconds/1e9)
	err = agree(ours, samples, ref, base.Bytes)
	fmt.Printf("  sample 0 of every run identical to the baseline's, as many bytes: %v\n", err == nil)
	return err
}

// agree checks every zarrfs run against the baseline: sample 0 byte for
// byte, and the data bytes written.
func agree(ours []*result, samples [][]byte, ref []byte, baseBytes int64) error {
	var errs []error
	for i, r := range ours {
		if !bytes.Equal(samples[i], ref) {
			errs = append(errs, fmt.Errorf("zarrfs %s: sample 0 differs from the baseline's", r.Mode))
		}
		if r.Bytes != baseBytes {
			errs = append(errs, fmt.Errorf("zarrfs %s: %d bytes, the baseline %d", r.Mode, r.Bytes, baseBytes))
		}
	}
	return errors.Join(errs...)
}
