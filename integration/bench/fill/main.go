// Command fill measures the roofline of zarrfs's fill path on one store and
// view: the machine's two I/O floors (every compressed chunk file read by N
// threads from the page cache; decoded-size files written by N threads to
// the cache's filesystem), then the real fill (package fill's Warm, what
// `zarrfs warm` runs) into a fresh cache, under a CPU profile whose samples
// are attributed to the fill's stages by the functions on their stacks:
//
//	source read  reading compressed bytes (objectstore)
//	decode       decompressing (codec, zstd, lz4, the GPU's host side)
//	assembly     placing decoded chunks into samples (copies, byte swaps,
//	             casts, fill values, stacking)
//	checksum     the checksum the cache records while a blob is written
//	write        writing blobs to the cache's filesystem
//	publish      the cache's temp files, journal, links and locks
//	alloc/gc     the Go runtime: allocation, zeroing, collection
//	other        everything else (identity, planning, scheduling)
//
// For each stage it prints CPU seconds (user and system: a page fault or a
// copy in the kernel counts for the stage whose call caused it), CPU
// seconds per GB of decoded bytes, the wall time the stage alone would take
// on N cores (CPU / N), and the bytes the stage moves through memory per
// decoded byte, from the fill's own counters under a stated model: a read
// from the page cache reads and writes the bytes once (2 per compressed
// byte); a decode reads its input and writes its output (a Blosc shuffle
// adds a read and a write of its output, not counted); a copy reads and
// writes; a checksum
// reads; a write to the page cache reads and writes.
//
// Usage: fill -store DIR -view FILE -cache DIR [-only train] [-jobs N]
// [-threads N] [-decode cpu|gpu|auto] [-json FILE]
//
// The cache directory is emptied first. The source should be in the page
// cache (the run reads it once before timing).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/pprof/profile"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/decode"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

func main() {
	storeDir := flag.String("store", "", "Zarr store (a local path)")
	viewFile := flag.String("view", "", "view YAML")
	only := flag.String("only", "", "mount path to fill (default: the view's name when one view is given)")
	cacheDir := flag.String("cache", "", "cache directory, emptied first (put it where the cache will live: tmpfs or disk)")
	jobs := flag.Int("jobs", runtime.NumCPU(), "fills in flight, as zarrfs warm --jobs")
	threads := flag.Int("threads", runtime.NumCPU(), "threads of the floor measurements")
	mode := flag.String("decode", "cpu", "decoder: cpu, gpu or auto")
	jsonOut := flag.String("json", "", "append one JSON line per measurement to this file")
	label := flag.String("label", "", "label of this run in the JSON lines (a store's name)")
	profOut := flag.String("cpuprofile", "", "also write the fill's CPU profile (pprof) to this file")
	flag.Parse()
	if *storeDir == "" || *cacheDir == "" {
		log.Fatal("fill: -store and -cache are required")
	}
	ctx := context.Background()
	rec := &recorder{label: *label}
	if *jsonOut != "" {
		f, err := os.OpenFile(*jsonOut, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		rec.out = f
	}

	dec := openPipeline(ctx, *mode)
	defer dec.Close()
	store, err := objectstore.OpenPosix(*storeDir)
	if err != nil {
		log.Fatal(err)
	}
	var specs []*layout.ViewSpec
	if *viewFile != "" {
		if specs, err = layout.LoadViews(*viewFile); err != nil {
			log.Fatal(err)
		}
		if *only == "" && len(specs) == 1 {
			*only = specs[0].Name
		}
	}
	mem := memory.DefaultBudget()
	stats := &zarr.Stats{}
	src := &layout.Source{
		Store: store,
		Zarr:  zarr.Options{Decoder: dec, Memory: dec.Memory(), Host: dec.Host(), ChunkCacheBytes: min(256<<20, mem/4), Stats: stats},
		Views: specs,
	}
	lay, err := src.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer lay.Close()
	var onlyPaths []string
	if *only != "" {
		onlyPaths = []string{*only}
	}
	plan, err := fill.Select(lay, fill.SelectOptions{Only: onlyPaths})
	if err != nil {
		log.Fatal(err)
	}
	files := chunkFiles(*storeDir, plan.Blobs)
	decoded := plan.Bytes - int64(len(plan.Blobs))*lay.Align()
	fmt.Printf("%d blobs, %.2f GB decoded, %d chunk files (%.2f GB); %d CPUs, %d jobs, %s\n",
		len(plan.Blobs), gb(decoded), len(files), gb(sumSizes(files)), runtime.NumCPU(), *jobs, dec.Placement())

	blobBytes := floors(rec, files, plan.Blobs, *threads, *cacheDir, decoded)

	// The fill, profiled.
	c, err := cache.Open(cache.Options{Dir: *cacheDir})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	todo, _, err := fill.Todo(ctx, c, lay, plan.Blobs)
	if err != nil {
		log.Fatal(err)
	}
	var prof bytes.Buffer
	runtime.GC()
	r0 := rusage()
	if err := pprof.StartCPUProfile(&prof); err != nil {
		log.Fatal(err)
	}
	start := time.Now()
	var firstErr atomic.Value
	filler, err := fill.New(fill.Options{Cache: c, MemoryBudget: memory.New(mem / 2), Memory: dec.Host()})
	if err != nil {
		log.Fatal(err)
	}
	failed, err := fill.Warm(ctx, filler, lay, todo, fill.WarmOptions{Jobs: *jobs, Done: func(b layout.Blob, err error) {
		if err != nil {
			firstErr.CompareAndSwap(nil, err)
		}
	}})
	wall := time.Since(start)
	pprof.StopCPUProfile()
	r1 := rusage()
	if *profOut != "" {
		if err := os.WriteFile(*profOut, prof.Bytes(), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	if err != nil || failed > 0 {
		log.Fatalf("fill: %d failed: %v %v", failed, err, firstErr.Load())
	}
	cpu := r1.cpu - r0.cpu
	fmt.Printf("fill: %d blobs in %.3f s: %.2f GB/s of decoded bytes; CPU %.2f s (%.1f cores busy); %d minor faults (%.0f per MB decoded); peak RSS %.2f GB\n",
		len(todo), wall.Seconds(), gb(decoded)/wall.Seconds(), cpu.Seconds(), cpu.Seconds()/wall.Seconds(),
		r1.minflt-r0.minflt, float64(r1.minflt-r0.minflt)/(float64(decoded)/1e6), gb(r1.maxrss))
	if err := reportStages(rec, prof.Bytes(), cpu, stats, decoded, blobBytes); err != nil {
		log.Fatal(err)
	}
	rec.put("fill", map[string]any{"blobs": len(todo), "decoded_bytes": decoded, "seconds": wall.Seconds(), "gbps": gb(decoded) / wall.Seconds(),
		"cpu_seconds": cpu.Seconds(), "minor_faults": r1.minflt - r0.minflt, "peak_rss": r1.maxrss, "jobs": *jobs, "decode": *mode,
		"chunks_decoded": stats.ChunksDecoded.Load(), "bytes_fetched": stats.BytesFetched.Load(),
		"bytes_decoded": stats.BytesDecoded.Load(), "bytes_assembled": stats.BytesAssembled.Load()})
}

// openPipeline starts the decoding pipeline of mode (cpu, gpu or auto)
// and waits for its devices.
func openPipeline(ctx context.Context, mode string) *decode.Pipeline {
	m, err := decode.ParseMode(mode)
	if err != nil {
		log.Fatal(err)
	}
	dec, err := decode.New(decode.Options{Mode: m, GPU: gpu.Options{Libraries: gpu.LibrariesFrom(os.Getenv)}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := dec.Ready(ctx); err != nil {
		dec.Close()
		log.Fatal(err)
	}
	return dec
}

// floors measures, and records, what the machine does without zarrfs:
// threads reading every chunk file (from the page cache: read twice) and
// writing files the size of the blobs into cacheDir (removed after). It
// returns the blobs' bytes.
func floors(rec *recorder, files map[string]int64, blobs []layout.Blob, threads int, cacheDir string, decoded int64) (blobBytes int64) {
	// The source in the page cache, then the floors.
	readAll(files, threads)
	t := readAll(files, threads)
	rec.put("floor_read", map[string]any{"threads": threads, "bytes": sumSizes(files), "seconds": t.Seconds(), "gbps": gb(sumSizes(files)) / t.Seconds()})
	fmt.Printf("floor: %d threads read every chunk file: %.2f GB/s of files (%.2f GB/s of decoded bytes)\n",
		threads, gb(sumSizes(files))/t.Seconds(), gb(decoded)/t.Seconds())
	if err := os.RemoveAll(cacheDir); err != nil {
		log.Fatal(err)
	}
	wt, err := writeFloor(filepath.Join(cacheDir, "floor"), blobs, threads)
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range blobs {
		blobBytes += b.Size()
	}
	rec.put("floor_write", map[string]any{"threads": threads, "bytes": blobBytes, "seconds": wt.Seconds(), "gbps": gb(blobBytes) / wt.Seconds()})
	fmt.Printf("floor: %d threads write %d blob-sized files to %s: %.2f GB/s\n", threads, len(blobs), cacheDir, gb(blobBytes)/wt.Seconds())
	os.RemoveAll(cacheDir)
	return blobBytes
}

// reportStages prints, and records, the fill's CPU by stage from its
// profile (scaled to cpu, which rusage counts exactly) and the bytes each
// stage moved per decoded byte.
func reportStages(rec *recorder, prof []byte, cpu time.Duration, stats *zarr.Stats, decoded, blobBytes int64) error {
	stages, err := attribute(prof)
	if err != nil {
		return err
	}
	moved := movedPerByte(stats, decoded, blobBytes)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "stage\tCPU s\tCPU s/GB\talone on N cores, s\tbytes moved per decoded byte\t")
	var total float64
	for _, s := range stageNames {
		total += stages[s]
	}
	scale := 1.0
	if total > 0 {
		scale = cpu.Seconds() / total // the profile samples CPU time; rusage counts it exactly
	}
	for _, s := range stageNames {
		sec := stages[s] * scale
		mv := "-"
		if v, ok := moved[s]; ok {
			mv = fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.3f\t%.3f\t%s\t\n", s, sec, sec/gb(decoded), sec/float64(runtime.NumCPU()), mv)
		fields := map[string]any{"stage": s, "cpu_seconds": sec, "cpu_s_per_gb": sec / gb(decoded)}
		if v, ok := moved[s]; ok {
			fields["moved_per_byte"] = v
		}
		rec.put("stage", fields)
	}
	tw.Flush()
	return nil
}

// stageNames in the order printed.
var stageNames = []string{"source read", "decode", "assembly", "checksum", "write", "publish", "alloc/gc", "other"}

// stageOf names the stage of one profile sample from its stack, leaf
// first: the first frame that belongs to a stage decides.
func stageOf(funcs []string) string {
	for _, f := range funcs {
		switch {
		case strings.Contains(f, "xxhash"), strings.Contains(f, "zeebo/xxh3"), strings.Contains(f, "cache.(*treeHash)"), strings.Contains(f, "cache.sumOf"):
			return "checksum"
		case strings.Contains(f, "zarrfs/codec."), strings.Contains(f, "klauspost/compress"), strings.Contains(f, "pierrec/lz4"),
			strings.Contains(f, "zarrfs/gpu."), strings.Contains(f, "zarr.(*readState).decode"):
			return "decode"
		case strings.Contains(f, "zarr.(*readState).assemble"), strings.Contains(f, "zarr.copyBox"), strings.Contains(f, "zarr.fillBox"),
			strings.Contains(f, "zarr.swapBytes"), strings.Contains(f, "zarr.Cast"), strings.Contains(f, "fill.run.fillSamples"),
			strings.Contains(f, "fill.writePiece"):
			return "assembly"
		case strings.Contains(f, "zarrfs/objectstore."):
			return "source read"
		case strings.Contains(f, "cache.(*hashingWriter)"), strings.Contains(f, "fill.writeBlob"):
			return "write"
		case strings.Contains(f, "zarrfs/cache."):
			return "publish"
		case strings.HasPrefix(f, "runtime.gc"), strings.HasPrefix(f, "runtime.bgscavenge"), strings.HasPrefix(f, "runtime.mallocgc"),
			strings.HasPrefix(f, "runtime.(*mheap)"), strings.HasPrefix(f, "runtime.memclrNoHeapPointers"), strings.HasPrefix(f, "runtime.bgsweep"):
			return "alloc/gc"
		}
	}
	return "other"
}

// attribute sums a CPU profile's samples by stage, in seconds.
func attribute(raw []byte) (map[string]float64, error) {
	p, err := profile.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("profile has no cpu samples")
	}
	out := map[string]float64{}
	for _, s := range p.Sample {
		var funcs []string
		for _, loc := range s.Location {
			for _, ln := range loc.Line {
				if ln.Function != nil {
					funcs = append(funcs, ln.Function.Name)
				}
			}
		}
		out[stageOf(funcs)] += float64(s.Value[idx]) / 1e9
	}
	return out, nil
}

// movedPerByte is the bytes each stage moves through memory per decoded
// byte, under the model in the package comment.
func movedPerByte(st *zarr.Stats, decoded, blobBytes int64) map[string]float64 {
	d := float64(decoded)
	return map[string]float64{
		"source read": 2 * float64(st.BytesFetched.Load()) / d,
		"decode":      (float64(st.BytesFetched.Load()) + float64(st.BytesDecoded.Load())) / d,
		"assembly":    2 * float64(st.BytesAssembled.Load()) / d,
		"checksum":    float64(blobBytes) / d,
		"write":       2 * float64(blobBytes) / d,
	}
}

// chunkFiles lists the files of every chunk the blobs read (those that
// exist), with their sizes.
func chunkFiles(dir string, blobs []layout.Blob) map[string]int64 {
	out := map[string]int64{}
	for _, b := range blobs {
		for _, r := range b.Sources() {
			for _, k := range r.Array.RegionChunks(r.Start, r.Count) {
				p := filepath.Join(dir, filepath.FromSlash(k))
				if _, ok := out[p]; ok {
					continue
				}
				if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
					out[p] = fi.Size()
				}
			}
		}
	}
	return out
}

func sumSizes(files map[string]int64) int64 {
	var n int64
	for _, s := range files {
		n += s
	}
	return n
}

// readAll reads every file with n threads, each into a buffer it reuses.
func readAll(files map[string]int64, n int) time.Duration {
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for {
				i := int(next.Add(1) - 1)
				if i >= len(names) {
					return
				}
				f, err := os.Open(names[i])
				if err != nil {
					log.Fatal(err)
				}
				sz := files[names[i]]
				if int64(cap(buf)) < sz {
					buf = make([]byte, sz)
				}
				if _, err := f.ReadAt(buf[:sz], 0); err != nil {
					log.Fatal(err)
				}
				f.Close()
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// writeFloor writes one file per blob, of its size, with n threads from
// buffers written once before timing (no fsync: the fill does not sync
// either).
func writeFloor(dir string, blobs []layout.Blob, n int) (time.Duration, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	var maxSize int64
	for _, b := range blobs {
		maxSize = max(maxSize, b.Size())
	}
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = bytes.Repeat([]byte{byte(i + 1)}, int(maxSize))
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(blobs) {
					return
				}
				f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%d", i)))
				if err == nil {
					_, err = f.WriteAt(bufs[w][:blobs[i].Size()], 0)
					if cerr := f.Close(); err == nil {
						err = cerr
					}
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return el, nil
}

type usage struct {
	cpu    time.Duration
	minflt int64
	maxrss int64
}

func rusage() usage {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return usage{
		cpu:    time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		minflt: ru.Minflt,
		maxrss: ru.Maxrss * 1024,
	}
}

func gb(n int64) float64 { return float64(n) / 1e9 }

// recorder appends JSON lines.
type recorder struct {
	out   *os.File
	label string
}

func (r *recorder) put(what string, fields map[string]any) {
	if r.out == nil {
		return
	}
	fields["what"] = what
	if r.label != "" {
		fields["store"] = r.label
	}
	b, _ := json.Marshal(fields)
	r.out.Write(append(b, '\n'))
}
