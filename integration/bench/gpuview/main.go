// Command gpuview measures the end-to-end fill rate of a 20-channel view
// with GPU decoding against CPU decoding: it writes an ERA5-like Zarr v3
// store of float32 variables (time, 721, 1440), one chunk per time step,
// once with zstd level 3 and once with blosc lz4 + byte shuffle; then, for
// each store and decoder, it fills one sample after another: one
// Hierarchy.Read per time step with one Request per variable (the whole
// 721x1440 field), all into one buffer of 20 x 4.15 MB. The files are read
// once before timing, so the page cache is warm and the numbers are those
// of reading from memory, fetching and decoding in the zarr package.
//
// Decoders: the pipelines of --decode cpu, gpu and auto (package decode):
// cpu (one worker per core); gpu (every GPU, default options; chunks it
// refuses go to the CPU pool; the sample buffers and the compressed chunks
// are in its pinned memory, as in the mount); auto (a batch decodes on the
// CPU pool while it is idle, else on the GPUs). -readers N runs N goroutines filling
// different samples at once, as a data loader with several workers does;
// the GPU decoder merges the batches of readers waiting for the device
// into shared rounds, and the table says how many rounds it ran and how
// full they were, and what share of the chunks the GPU decoded (from its
// own counters). gpuview fails when the gpu decoder left any chunk to the
// CPU: its rows would not measure the GPU. Auto promises no share (it may
// decline the GPU by measurement).
//
// Usage: gpuview [-dir DIR] [-steps 32] [-vars 20] [-passes 3] [-readers 1,4]
// [-codecs zstd,blosc-lz4] [-decoders cpu,gpu,auto]
//
// The program builds with CGO_ENABLED=0; without a GPU it reports why and
// measures the CPU only.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/zarrfs/zarrfs/decode"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

const ny, nx = 721, 1440

func main() {
	dir := flag.String("dir", "", "where to write the stores (default: a temporary folder, removed afterwards)")
	steps := flag.Int("steps", 32, "time steps (samples) per store")
	nvars := flag.Int("vars", 20, "variables (channels) per sample")
	passes := flag.Int("passes", 3, "timed passes over all samples per decoder; the best counts")
	readersFlag := flag.String("readers", "1,4", "comma-separated numbers of concurrent readers to measure")
	codecs := flag.String("codecs", "zstd,blosc-lz4", "stores to write and read: zstd, blosc-lz4")
	decFlag := flag.String("decoders", "cpu,gpu,auto", "decoders to measure: cpu, gpu, auto")
	flag.Parse()
	readers := parseReaders(*readersFlag)
	root := *dir
	if root == "" {
		var err error
		if root, err = os.MkdirTemp("", "gpuview"); err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(root)
	}
	ctx := context.Background()

	stats := &roundStats{}
	decoders := pipelines(ctx, stats, *decFlag)
	defer func() {
		for _, d := range decoders {
			d.d.Close()
		}
	}()
	fmt.Printf("%d CPU cores; %d variables of %dx%d float32 per sample (%.1f MB), %d samples per store\n",
		runtime.NumCPU(), *nvars, ny, nx, float64(*nvars*ny*nx*4)/1e6, *steps)

	var rows []row
	for _, c := range strings.Split(*codecs, ",") {
		sdir := filepath.Join(root, c)
		t0 := time.Now()
		ratio, err := writeStore(sdir, c, *nvars, *steps)
		if err != nil {
			log.Fatalf("writing the %s store: %v", c, err)
		}
		fmt.Printf("wrote %s store in %v (ratio %.2f)\n", c, time.Since(t0).Round(time.Millisecond), ratio)
		if err := warm(sdir); err != nil {
			log.Fatal(err)
		}
		var ref []byte // sample 0 by the CPU, to check every decoder's bytes
		for _, dec := range decoders {
			st, err := objectstore.OpenPosix(sdir)
			if err != nil {
				log.Fatal(err)
			}
			h, err := zarr.Open(ctx, st, zarr.Options{Decoder: dec.d, Memory: dec.d.Memory(), Host: dec.d.Host(), ChunkCacheBytes: -1})
			if err != nil {
				log.Fatal(err)
			}
			arrays := make([]*zarr.Array, *nvars)
			for i := range arrays {
				name := fmt.Sprintf("v%02d", i)
				for _, a := range h.Arrays {
					if a.Path == name {
						arrays[i] = a
					}
				}
				if arrays[i] == nil || arrays[i].Unsupported != "" {
					log.Fatalf("%s: array %s missing or unsupported", c, name)
				}
			}
			sample := func(buf []byte, t int) error {
				reqs := make([]zarr.Request, len(arrays))
				per := int64(ny * nx * 4)
				for i, a := range arrays {
					reqs[i] = zarr.Request{Array: a, Start: []int64{int64(t), 0, 0}, Count: []int64{1, ny, nx},
						Dst: buf[int64(i)*per : int64(i+1)*per]}
				}
				return h.Read(ctx, nil, reqs)
			}
			// A decoder that lends memory (the GPU's pinned memory) gets
			// its sample buffers from it, as the mount's fills do.
			alloc, free := func(n int) []byte { return make([]byte, n) }, func([]byte) {}
			if m := dec.d.Memory(); m != nil {
				alloc, free = m.HostAlloc, m.HostFree
			}
			first := alloc(*nvars * ny * nx * 4)
			if err := sample(first, 0); err != nil { // warm-up: buffers, GPU memory
				log.Fatalf("%s/%s: %v", c, dec.name, err)
			}
			if ref == nil {
				ref = first
			} else if !bytes.Equal(ref, first) {
				log.Fatalf("%s/%s: sample 0 differs from the CPU decoder's", c, dec.name)
			} else {
				free(first)
			}
			for _, nr := range readers {
				bufs := make([][]byte, nr)
				for i := range bufs {
					bufs[i] = alloc(*nvars * ny * nx * 4)
				}
				stats.reset()
				decoded0, onGPU0 := h.Stats().ChunksDecoded.Load(), dec.d.GPUStats().Chunks
				bestDt, err := bestPass(*passes, *steps, bufs, sample)
				if err != nil {
					log.Fatalf("%s/%s: %v", c, dec.name, err)
				}
				for _, b := range bufs {
					free(b)
				}
				s := float64(*steps) / bestDt.Seconds()
				onGPU := int64(-1)
				if dec.name != "cpu" {
					onGPU = dec.d.GPUStats().Chunks - onGPU0
				}
				rows = append(rows, row{c, dec.name, nr, s, s * float64(*nvars*ny*nx*4) / 1e9, ratio, stats.snapshot(),
					h.Stats().ChunksDecoded.Load() - decoded0, onGPU})
			}
		}
	}
	if failed := report(rows, *nvars, *passes, *steps); len(failed) > 0 {
		log.Fatalf("FAIL: %s", strings.Join(failed, "; "))
	}
}

// parseReaders parses -readers: comma-separated positive integers.
func parseReaders(list string) []int {
	var readers []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			log.Fatalf("-readers %q: want positive integers", list)
		}
		readers = append(readers, n)
	}
	return readers
}

// decoder is a pipeline --decode builds (package decode), named by its
// mode.
type decoder struct {
	name string
	d    *decode.Pipeline
}

// pipelines starts the pipelines of the modes decFlag names that can run
// here (cpu, gpu, auto): each the pipeline --decode builds, so the bench
// measures what ships (chunks a GPU refuses go to the pipeline's CPU
// pool). The caller closes them.
func pipelines(ctx context.Context, stats *roundStats, decFlag string) []decoder {
	var decoders []decoder
	for _, m := range []decode.Mode{decode.CPU, decode.GPU, decode.Auto} {
		p, err := decode.New(decode.Options{Mode: m, GPU: gpu.Options{Libraries: gpu.LibrariesFrom(os.Getenv)}, Logger: slog.New(stats)})
		if err != nil {
			fmt.Printf("no GPU decoding: %v\n", err)
			continue
		}
		if onGPU, _ := p.Ready(ctx); m == decode.Auto && !onGPU {
			p.Close()
			continue // auto without a GPU is the CPU
		}
		fmt.Printf("%s: %s\n", m, p.Placement())
		decoders = append(decoders, decoder{string(m), p})
	}
	want := map[string]bool{}
	for _, n := range strings.Split(decFlag, ",") {
		want[strings.TrimSpace(n)] = true
	}
	kept := decoders[:0]
	for _, dec := range decoders {
		if want[strings.SplitN(dec.name, "(", 2)[0]] {
			kept = append(kept, dec)
		} else {
			dec.d.Close()
		}
	}
	return kept
}

// row is one measurement: a store read by a decoder with readers readers.
type row struct {
	store, dec string
	readers    int
	samples    float64
	gbs        float64
	ratio      float64
	rounds     roundCounts // GPU rounds over all timed passes
	// chunks decoded over all timed passes, and how many of them on
	// the GPU (its own counters; -1: no GPU in this decoder)
	decoded, onGPU int64
}

// bestPass reads every one of steps samples, by one reader per buffer of
// bufs, passes times, and returns the best pass's time.
func bestPass(passes, steps int, bufs [][]byte, sample func(buf []byte, t int) error) (time.Duration, error) {
	var bestDt time.Duration
	for p := range passes {
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, len(bufs))
		t0 := time.Now()
		for r := range bufs {
			wg.Go(func() {
				for {
					t := int(next.Add(1) - 1)
					if t >= steps {
						return
					}
					if err := sample(bufs[r], t); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		dt := time.Since(t0)
		close(errs)
		if err := <-errs; err != nil {
			return 0, err
		}
		if p == 0 || dt < bestDt {
			bestDt = dt
		}
	}
	return bestDt, nil
}

// report prints the rows against the CPU decoder's, and returns the gpu
// rows that did not measure the GPU alone (it left chunks to the CPU).
func report(rows []row, nvars, passes, steps int) (failed []string) {
	fmt.Println()
	fmt.Printf("%d-channel view fill rate (best of %d passes over %d samples, warm page cache)\n", nvars, passes, steps)
	fmt.Printf("%-10s %6s %-14s %8s %10s %8s %10s %8s %13s %14s %7s\n", "store", "ratio", "decoder", "readers", "samples/s", "GB/s", "x cpu",
		"rounds", "chunks/round", "callers/round", "on GPU")
	cpuRate := map[string]float64{}
	for _, r := range rows {
		if r.dec == "cpu" {
			cpuRate[fmt.Sprint(r.store, r.readers)] = r.samples
		}
	}
	for _, r := range rows {
		rounds, chunks, callers := "-", "-", "-"
		if n := r.rounds.rounds; n > 0 {
			rounds = strconv.FormatInt(n, 10)
			chunks = fmt.Sprintf("%.1f", float64(r.rounds.chunks)/float64(n))
			callers = fmt.Sprintf("%.2f", float64(r.rounds.callers)/float64(n))
		}
		vsCPU := "-"
		if c := cpuRate[fmt.Sprint(r.store, r.readers)]; c > 0 {
			vsCPU = fmt.Sprintf("%.2f", r.samples/c)
		}
		share := "-"
		if r.onGPU >= 0 && r.decoded > 0 {
			share = fmt.Sprintf("%.0f%%", 100*float64(r.onGPU)/float64(r.decoded))
		}
		fmt.Printf("%-10s %6.2f %-14s %8d %10.1f %8.2f %10s %8s %13s %14s %7s\n", r.store, r.ratio, r.dec, r.readers, r.samples, r.gbs,
			vsCPU, rounds, chunks, callers, share)
		// The gpu rows measure the GPU only if it decoded every chunk.
		if r.dec == "gpu" && (r.decoded == 0 || r.onGPU != r.decoded) {
			failed = append(failed, fmt.Sprintf("%s %s with %d readers: the GPU decoded %d of %d chunks", r.store, r.dec, r.readers, r.onGPU, r.decoded))
		}
	}
	fmt.Println("GB/s: decoded bytes delivered into the sample buffers per second; x cpu: against the CPU decoder with as many readers;")
	fmt.Println("rounds: GPU rounds over all timed passes, with their mean chunks and callers (readers' batches merged into one round)")
	fmt.Println("on GPU: the share of the chunks decoded on the GPU, from the GPU decoder's own counters")
	return failed
}

// roundStats counts the GPU decoder's rounds from its debug lines ("gpu
// batch", one per round, with its chunks and callers), and prints the
// pipeline's warnings (chunks the GPU refused, with why) to stderr, so
// that a GPU row that fails says what the CPU took.
type roundStats struct {
	mu sync.Mutex
	roundCounts
}

type roundCounts struct{ rounds, chunks, callers int64 }

var warnings = slog.NewTextHandler(os.Stderr, nil)

func (h *roundStats) Enabled(context.Context, slog.Level) bool { return true }
func (h *roundStats) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *roundStats) WithGroup(string) slog.Handler            { return h }
func (h *roundStats) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		return warnings.Handle(ctx, r)
	}
	if r.Message != "gpu batch" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rounds++
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "chunks":
			h.chunks += a.Value.Int64()
		case "callers":
			h.callers += a.Value.Int64()
		}
		return true
	})
	return nil
}

func (h *roundStats) reset() {
	h.mu.Lock()
	h.roundCounts = roundCounts{}
	h.mu.Unlock()
}

func (h *roundStats) snapshot() roundCounts {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.roundCounts
}

// warm reads every file of the store once, so that timing starts with a
// warm page cache.
func warm(dir string) error {
	return filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		_, err = os.ReadFile(p)
		return err
	})
}

// writeStore writes the store and returns its compression ratio.
func writeStore(dir, c string, nvars, steps int) (float64, error) {
	var codecJSON map[string]any
	switch c {
	case "zstd":
		codecJSON = map[string]any{"name": "zstd", "configuration": map[string]any{"level": 3, "checksum": true}} // the encoder writes content checksums (its default), which the GPU path needs
	case "blosc-lz4":
		codecJSON = map[string]any{"name": "blosc", "configuration": map[string]any{"cname": "lz4", "clevel": 5,
			"shuffle": "shuffle", "typesize": 4, "blocksize": 0}}
	default:
		return 0, fmt.Errorf("codec %q: want zstd or blosc-lz4", c)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	if err := writeJSON(filepath.Join(dir, "zarr.json"), map[string]any{"zarr_format": 3, "node_type": "group", "attributes": map[string]any{}}); err != nil {
		return 0, err
	}
	for v := range nvars {
		adir := filepath.Join(dir, fmt.Sprintf("v%02d", v))
		if err := os.MkdirAll(adir, 0o755); err != nil {
			return 0, err
		}
		md := map[string]any{
			"zarr_format": 3, "node_type": "array", "shape": []int{steps, ny, nx}, "data_type": "float32",
			"chunk_grid":         map[string]any{"name": "regular", "configuration": map[string]any{"chunk_shape": []int{1, ny, nx}}},
			"chunk_key_encoding": map[string]any{"name": "default", "configuration": map[string]any{"separator": "/"}},
			"codecs": []any{
				map[string]any{"name": "bytes", "configuration": map[string]any{"endian": "little"}},
				codecJSON,
			},
			"fill_value": "NaN", "dimension_names": []string{"time", "latitude", "longitude"}, "attributes": map[string]any{},
		}
		if err := writeJSON(filepath.Join(adir, "zarr.json"), md); err != nil {
			return 0, err
		}
	}
	// Chunks on all cores, each worker with its own encoder.
	type task struct{ v, t int }
	tasks := make(chan task)
	var in, out atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	for range runtime.NumCPU() {
		wg.Go(func() {
			enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(3)), zstd.WithEncoderConcurrency(1))
			defer enc.Close()
			raw := make([]byte, ny*nx*4)
			for tk := range tasks {
				fieldInto(raw, uint64(tk.v*100003+tk.t))
				var b []byte
				if c == "zstd" {
					b = enc.EncodeAll(raw, nil)
				} else {
					b = bloscLZ4Shuffle(raw, 4, 256<<10)
				}
				p := filepath.Join(dir, fmt.Sprintf("v%02d", tk.v), "c", strconv.Itoa(tk.t), "0", "0")
				err := os.MkdirAll(filepath.Dir(p), 0o755)
				if err == nil {
					err = os.WriteFile(p, b, 0o644)
				}
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
				in.Add(int64(len(raw)))
				out.Add(int64(len(b)))
			}
		})
	}
	for v := range nvars {
		for t := range steps {
			tasks <- task{v, t}
		}
	}
	close(tasks)
	wg.Wait()
	return float64(in.Load()) / float64(out.Load()), firstErr
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// fieldInto fills b with a 721x1440 float32 field shaped like a reanalysis
// variable: a large-scale pattern in latitude and longitude plus noise
// small against it, so that it compresses about as real fields do.
func fieldInto(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	phase := r.Float64() * 6
	base, amp := 200+100*r.Float64(), 5+40*r.Float64()
	wave := make([]float64, nx)
	for x := range nx {
		wave[x] = math.Sin(3*2*math.Pi*float64(x)/nx + phase)
	}
	for y := range ny {
		lat := math.Pi * (float64(y)/ny - 0.5)
		cl, c2 := math.Cos(lat), math.Cos(2*lat)
		row := b[4*y*nx:]
		for x := range nx {
			v := base + amp*cl + 0.2*amp*wave[x]*c2 + 0.05*r.NormFloat64()
			binary.LittleEndian.PutUint32(row[4*x:], math.Float32bits(float32(v)))
		}
	}
}

// bloscLZ4Shuffle writes a Blosc 1 frame (format version 2) of LZ4 streams
// with byte shuffle, as c-blosc does: each block shuffled on its own and,
// for full blocks of small types, split into one stream per byte of the
// type; a stream that does not shrink is stored raw.
func bloscLZ4Shuffle(data []byte, typesize, blocksize int) []byte {
	nbytes := len(data)
	blocksize = max(min(blocksize, nbytes)/typesize*typesize, typesize)
	nblocks := (nbytes + blocksize - 1) / blocksize
	out := make([]byte, 16+4*nblocks, nbytes/2)
	const flagShuffle, codeLZ4 = 0x01, 1
	out[0], out[1], out[2], out[3] = 2, 1, codeLZ4<<5|flagShuffle, byte(typesize)
	binary.LittleEndian.PutUint32(out[4:], uint32(nbytes))
	binary.LittleEndian.PutUint32(out[8:], uint32(blocksize))
	blk := make([]byte, blocksize)
	comp := make([]byte, lz4.CompressBlockBound(blocksize))
	var lc lz4.Compressor
	for i := range nblocks {
		binary.LittleEndian.PutUint32(out[16+4*i:], uint32(len(out)))
		off := i * blocksize
		n := min(blocksize, nbytes-off)
		src := data[off : off+n]
		ne := n / typesize
		b := blk[:n]
		for e := range ne {
			for j := range typesize {
				b[j*ne+e] = src[e*typesize+j]
			}
		}
		copy(b[ne*typesize:], src[ne*typesize:]) // leftover bytes stay as they are
		ns := 1
		if typesize <= 16 && ne >= 128 && n == blocksize {
			ns = typesize
		}
		sl := n / ns
		for j := range ns {
			s := b[j*sl : (j+1)*sl]
			k, err := lc.CompressBlock(s, comp)
			c := comp[:k]
			if err != nil || k == 0 || k >= len(s) {
				c = s // stored raw
			}
			out = binary.LittleEndian.AppendUint32(out, uint32(len(c)))
			out = append(out, c...)
		}
	}
	binary.LittleEndian.PutUint32(out[12:], uint32(len(out)))
	return out
}
