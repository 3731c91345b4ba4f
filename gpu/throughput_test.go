package gpu

import (
	"bytes"
	"context"
	"fmt"
	"hash/adler32"
	"hash/crc32"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/codec"
)

// The ERA5-like workload: one chunk is one 721x1440 float32 field (a
// quarter-degree global grid), 4,152,960 bytes decoded.
const era5Y, era5X = 721, 1440

type workload struct {
	name string
	jobs []codec.Job
}

// era5Workloads compresses n fields with each codec the comparison covers,
// on all cores.
func era5Workloads(n int) []workload {
	kinds := []struct {
		name string
		enc  func([]byte) []byte
		c    codec.Name
	}{
		{"zstd-3", func(b []byte) []byte { return compress(codec.Zstd, b) }, codec.Zstd},
		{"blosc-lz4-shuffle", func(b []byte) []byte { return bloscCompress(b, 4, 256<<10, codec.ByteShuffle, "lz4") }, codec.Blosc},
		{"blosc-zstd-shuffle", func(b []byte) []byte { return bloscCompress(b, 4, 256<<10, codec.ByteShuffle, "zstd") }, codec.Blosc},
		{"lz4", func(b []byte) []byte { return compress(codec.LZ4, b) }, codec.LZ4},
	}
	var out []workload
	for _, k := range kinds {
		w := workload{name: k.name, jobs: make([]codec.Job, n)}
		var wg sync.WaitGroup
		sem := make(chan struct{}, runtime.NumCPU())
		for i := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				d := field(era5Y, era5X, uint64(i+1))
				w.jobs[i] = codec.Job{Codec: k.c, Src: k.enc(d), Dst: make([]byte, len(d))}
			})
		}
		wg.Wait()
		out = append(out, w)
	}
	return out
}

func decodedBytes(jobs []codec.Job) (in, out int64) {
	for _, j := range jobs {
		in += int64(len(j.Src))
		out += int64(len(j.Dst))
	}
	return in, out
}

// best runs f reps times and returns the shortest duration.
func best(reps int, f func() error) (time.Duration, error) {
	var b time.Duration
	for i := range reps {
		t0 := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		if d := time.Since(t0); i == 0 || d < b {
			b = d
		}
	}
	return b, nil
}

// phaseHandler sums the phase durations the decoder logs per round.
type phaseHandler struct {
	mu    sync.Mutex
	sums  map[string]time.Duration
	count int
}

func (h *phaseHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *phaseHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *phaseHandler) WithGroup(string) slog.Handler            { return h }
func (h *phaseHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "gpu batch" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.count++
	r.Attrs(func(a slog.Attr) bool {
		if a.Value.Kind() == slog.KindDuration {
			h.sums[a.Key] += a.Value.Duration()
		}
		return true
	})
	return nil
}

func (h *phaseHandler) reset() {
	h.mu.Lock()
	h.sums, h.count = map[string]time.Duration{}, 0
	h.mu.Unlock()
}

// TestThroughputSummary compares decode throughput on the GPU with the CPU
// decoder on one core and on all cores, over the same chunks in one run,
// and the GPU with and without the host's LZ4 checks (checkStreams). It
// asserts only correctness; the numbers are printed. Run with
// -gpu.throughput (integration/gpu/run.sh does). The decoders take
// Options.Unverified, so that blosc-zstd is measured on the GPU. A second
// table (deflateRows) measures zlib, gzip and blosc-zlib on the GPU with
// Options.Deflate and the host's checksums against the CPU pool, and says
// whether that measure argues for decode.GPUDeflate.
func TestThroughputSummary(t *testing.T) {
	if !*flagThroughput {
		t.Skip("throughput comparison not requested (-gpu.throughput)")
	}
	ph := &phaseHandler{sums: map[string]time.Duration{}}
	d, err := New(Options{Logger: slog.New(ph), Unverified: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d0 := d
	// The same with other round sizes and rounds in flight, to show what
	// the pipeline's shape buys.
	type variant struct {
		name string
		d    *Decoder
	}
	var variants []variant
	for _, c := range []struct {
		streams int
		round   int64
	}{{2, 128 << 20}, {3, 128 << 20}, {4, 64 << 20}, {4, 128 << 20}, {4, 256 << 20}, {6, 64 << 20}, {6, 128 << 20}, {8, 64 << 20}} {
		v, err := New(Options{Streams: c.streams, RoundBytes: c.round, MaxBatchBytes: int64(c.streams) * c.round * 2, Unverified: true})
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		variants = append(variants, variant{fmt.Sprintf("%d streams, rounds of %d MiB", c.streams, c.round>>20), v})
	}
	var extra []string
	n := *flagChunks
	ncpu := runtime.NumCPU()
	t0 := time.Now()
	loads := era5Workloads(n)
	t.Logf("generated %d chunks of %dx%d float32 per codec in %v", n, era5Y, era5X, time.Since(t0).Round(time.Millisecond))
	cpu := must(codec.NewCPU(codec.Options{Workers: ncpu}))
	defer cpu.Close()
	ctx := context.Background()
	gbs := func(b int64, dt time.Duration) float64 { return float64(b) / dt.Seconds() / 1e9 }

	var lines []string
	lines = append(lines, fmt.Sprintf("%-18s %6s %9s %9s %9s %9s %9s %8s %8s %9s %9s %7s %9s",
		"codec", "ratio", "cpu1", fmt.Sprintf("cpu%d", ncpu), "gpu-b16", fmt.Sprintf("gpu-b%d", n), "gpu-dev", "x cpu1", fmt.Sprintf("x cpu%d", ncpu),
		"pinned", "no-check", "ratio", "check1"))
	for _, w := range loads {
		in, out := decodedBytes(w.jobs)
		// CPU, one core: a few chunks, one after the other.
		few := w.jobs[:min(8, len(w.jobs))]
		_, fewOut := decodedBytes(few)
		dt1, err := best(2, func() error {
			for _, j := range few {
				if err := codec.Decode(j.Codec, j.Dst, j.Src); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// CPU, all cores: the codec package's worker pool.
		dtAll, err := best(3, func() error {
			if err := cpu.DecodeBatch(ctx, w.jobs); err != nil {
				return err
			}
			for _, j := range w.jobs {
				if j.Err != nil {
					return j.Err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		ref := make([][]byte, len(w.jobs))
		for i, j := range w.jobs {
			ref[i] = append([]byte(nil), j.Dst...)
		}
		// GPU, batches of 16 chunks and one batch of all.
		gpuRun := func(d *Decoder, batch int) (time.Duration, time.Duration, error) {
			for i := range w.jobs {
				clear(w.jobs[i].Dst)
			}
			if err := d.DecodeBatch(ctx, w.jobs[:min(batch, len(w.jobs))]); err != nil { // warm the buffers
				return 0, 0, err
			}
			var kern time.Duration
			var stages string
			dt, err := best(3, func() error {
				ph.reset()
				for s := 0; s < len(w.jobs); s += batch {
					if err := d.DecodeBatch(ctx, w.jobs[s:min(s+batch, len(w.jobs))]); err != nil {
						return err
					}
				}
				ph.mu.Lock()
				k := ph.sums["device"]
				st := fmt.Sprintf("%d rounds:", ph.count)
				for _, name := range []string{"pack", "h2d", "nvcomp", "kernels", "d2h", "wait", "copyout", "total"} {
					st += fmt.Sprintf(" %s %.1fms", name, float64(ph.sums[name])/1e6)
				}
				ph.mu.Unlock()
				if kern == 0 || k < kern {
					kern, stages = k, st
				}
				return nil
			})
			if err != nil {
				return 0, 0, err
			}
			for i, j := range w.jobs {
				if j.Err != nil {
					return 0, 0, fmt.Errorf("%s chunk %d: %w", w.name, i, j.Err)
				}
				if string(j.Dst) != string(ref[i]) {
					return 0, 0, fmt.Errorf("%s chunk %d: GPU bytes differ from the CPU's", w.name, i)
				}
			}
			if d == d0 {
				mem := "plain"
				if d.pinned(w.jobs[0].Dst) {
					mem = "pinned"
				}
				extra = append(extra, fmt.Sprintf("%-18s batch of %d, %s memory, stage sums over %s", w.name, batch, mem, stages))
			}
			return dt, kern, nil
		}
		// The same chunks in pinned memory from HostAlloc: no host copies.
		plainJobs := w.jobs
		pinnedRun := func(dec *Decoder) (time.Duration, time.Duration, error) {
			pj := make([]codec.Job, len(plainJobs))
			for i, j := range plainJobs {
				src, dst := dec.HostAllocWait(len(j.Src), 10*time.Second), dec.HostAllocWait(len(j.Dst), 10*time.Second)
				if !dec.pinned(src) || !dec.pinned(dst) {
					return 0, 0, fmt.Errorf("HostAlloc(%d): not pinned", len(j.Dst))
				}
				copy(src, j.Src)
				pj[i] = codec.Job{Codec: j.Codec, Src: src, Dst: dst}
			}
			defer func() {
				for _, j := range pj {
					dec.HostFree(j.Src)
					dec.HostFree(j.Dst)
				}
			}()
			w.jobs = pj
			defer func() { w.jobs = plainJobs }()
			return gpuRun(dec, n)
		}
		dtPinned, kernPinned, err := pinnedRun(d)
		if err != nil {
			t.Fatal(err)
		}
		// The same without the host's LZ4 checks, to show what they cost.
		d.noValidate = true
		dtNoCheck, _, err := pinnedRun(d)
		d.noValidate = false
		if err != nil {
			t.Fatal(err)
		}
		// The checks alone on one core, in GB/s of decoded data as the
		// other columns (compressed bytes in the benchmarks).
		dtCheck, err := best(3, func() error {
			for _, j := range few {
				if p := prepare(&j); p.err != nil {
					return p.err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		extra = append(extra, fmt.Sprintf("%-18s gpu-b%d pinned (HostAlloc): %.2f GB/s, %.2f x cpu%d; device busy %.2f GB/s",
			w.name, n, gbs(out, dtPinned), gbs(out, dtPinned)/gbs(out, dtAll), ncpu, gbs(out, kernPinned)))
		for _, v := range variants {
			dv, _, err := pinnedRun(v.d)
			if err != nil {
				t.Fatal(err)
			}
			extra = append(extra, fmt.Sprintf("%-18s gpu-b%d pinned with %s: %.2f GB/s", w.name, n, v.name, gbs(out, dv)))
		}
		dt16, _, err := gpuRun(d, 16)
		if err != nil {
			t.Fatal(err)
		}
		dtN, kernN, err := gpuRun(d, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range variants {
			dv, _, err := gpuRun(v.d, n)
			if err != nil {
				t.Fatal(err)
			}
			extra = append(extra, fmt.Sprintf("%-18s gpu-b%d with %s: %.2f GB/s", w.name, n, v.name, gbs(out, dv)))
		}
		g16, gN := gbs(out, dt16), gbs(out, dtN)
		g := max(g16, gN)
		c1, cAll := gbs(fewOut, dt1), gbs(out, dtAll)
		gp, gnc := gbs(out, dtPinned), gbs(out, dtNoCheck)
		lines = append(lines, fmt.Sprintf("%-18s %6.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.1f %8.2f %9.2f %9.2f %7.3f %9.2f",
			w.name, float64(out)/float64(in), c1, cAll, g16, gN, gbs(out, kernN), g/c1, g/cAll, gp, gnc, gp/gnc, gbs(fewOut, dtCheck)))
	}
	lines = append(lines, deflateRows(t, n, cpu)...)
	summary := fmt.Sprintf("decode throughput, GB/s of decoded data (%d chunks of %dx%d float32 = %.1f MB each per codec; %s; %d CPU cores; nvCOMP input alignments %v)\n",
		n, era5Y, era5X, float64(4*era5Y*era5X)/1e6, d.Info(), ncpu, d.inAligns)
	for _, l := range append(lines, extra...) {
		summary += l + "\n"
	}
	summary += "cpu1: codec.Decode on one goroutine; cpuN: codec.NewCPU with N workers; gpu-bK: DecodeBatch of K chunks, from host memory to host memory\n" +
		"(pack, H2D, nvCOMP, kernels, D2H, copy out; rounds of 512 MiB pipelined); gpu-dev: decoded bytes over the device's busy time (H2D to D2H, CUDA events)\n" +
		"in the one-batch run; x: best gpu over cpu; " +
		fmt.Sprintf("pinned, no-check: gpu-b%d with pinned memory, with and without the host's LZ4 checks,\n", n) +
		"ratio: pinned over no-check; check1: prepare (framing and every host check) on one goroutine.\n"
	fmt.Print(summary)
	t.Log("\n" + summary)
}

// TestHostBandwidth prints the ceilings of a host-to-host decode: copies
// between ordinary and pinned host memory on the copy workers, and PCIe
// transfers from and to pinned memory, one way and both ways at once. Run
// with -gpu.throughput.
func TestHostBandwidth(t *testing.T) {
	if !*flagThroughput {
		t.Skip("throughput comparison not requested (-gpu.throughput)")
	}
	d, err := New(Options{Streams: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	defer d.holdDevice()()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cu := d.cu
	if err := cu.check("cuCtxSetCurrent", cu.cuCtxSetCurrent(d.ctx)); err != nil {
		t.Fatal(err)
	}
	const size = 512 << 20
	var h1, h2 hostBuf
	var d1, d2 devBuf
	for _, g := range []error{d.growHost(&h1, size), d.growHost(&h2, size), d.growDev(&d1, size), d.growDev(&d2, size)} {
		if g != nil {
			t.Fatal(g)
		}
	}
	defer func() {
		d.freeHost(&h1)
		d.freeHost(&h2)
		cu.cuMemFree(d1.ptr)
		cu.cuMemFree(d2.ptr)
	}()
	plain := make([]byte, size)
	for i := range plain {
		plain[i] = byte(i)
	}
	pinned := h1.bytes()[:size]
	const piece = 4 << 20
	par := func(dst, src []byte) func() error {
		return func() error {
			d.parallel(size/piece, func(i int) { copy(dst[i*piece:(i+1)*piece], src[i*piece:(i+1)*piece]) })
			return nil
		}
	}
	s0, s1 := d.sets[0].stream, d.sets[1].stream
	xfer := func(h2d, d2h bool) func() error {
		return func() error {
			if h2d {
				if err := cu.check("H2D", cu.cuMemcpyHtoDAsync(d1.ptr, h1.p, size, s0)); err != nil {
					return err
				}
			}
			if d2h {
				if err := cu.check("D2H", cu.cuMemcpyDtoHAsync(h2.p, d2.ptr, size, s1)); err != nil {
					return err
				}
			}
			if err := cu.check("sync", cu.cuStreamSynchronize(s0)); err != nil {
				return err
			}
			return cu.check("sync", cu.cuStreamSynchronize(s1))
		}
	}
	gbs := func(n int64, f func() error) float64 {
		dt, err := best(5, f)
		if err != nil {
			t.Fatal(err)
		}
		return float64(n) / dt.Seconds() / 1e9
	}
	summary := fmt.Sprintf("host bandwidth, GB/s (512 MiB, %d copy workers, 4 MiB pieces): plain->pinned %.1f, pinned->plain %.1f, plain->plain %.1f\n",
		d.opts.CopyWorkers, gbs(size, par(pinned, plain)), gbs(size, par(plain, pinned)), gbs(size, par(plain, make([]byte, size))))
	summary += fmt.Sprintf("PCIe, GB/s (512 MiB from/to pinned memory): H2D %.1f, D2H %.1f, both at once %.1f each way\n",
		gbs(size, xfer(true, false)), gbs(size, xfer(false, true)), gbs(size, xfer(true, true)))
	// What lending a fresh buffer costs (map, fault in, register), and a
	// reused one: the price of the pool's first use.
	fresh := func(n int) float64 {
		v, err := New(Options{Streams: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		t0 := time.Now()
		var bufs [][]byte
		for range 8 {
			bufs = append(bufs, v.HostAllocWait(n, 10*time.Second))
		}
		dt := time.Since(t0)
		for _, b := range bufs {
			if !v.pinned(b) {
				t.Fatal("HostAlloc: not pinned")
			}
			v.HostFree(b)
		}
		return float64(8*n) / dt.Seconds() / 1e9
	}
	summary += fmt.Sprintf("HostAlloc of a fresh pool, arenas registered in the background as needed, GB/s: 4 MiB %.1f, 88 MiB %.1f\n", fresh(4<<20), fresh(88<<20))
	fmt.Print(summary)
	t.Log("\n" + summary)
}

// deflateRows measures the deflate family on the GPU (Options.Deflate,
// with the host's CRC-32 and Adler-32 checks of what nvCOMP decoded, blosc
// zlib streams included) against the CPU pool, on n ERA5-like chunks per
// codec, from ordinary and from pinned memory: the measure that decides
// decode.GPUDeflate. It fails if the GPU refused the chunks or decoded a
// byte otherwise than the CPU.
func deflateRows(t *testing.T, n int, cpu *codec.CPU) []string {
	d, err := New(Options{Deflate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	gbs := func(b int64, dt time.Duration) float64 { return float64(b) / dt.Seconds() / 1e9 }
	kinds := []struct {
		name string
		c    codec.Name
		enc  func([]byte) []byte
		sum  func([]byte) // the host's check alone
	}{
		{"zlib-5", codec.Zlib, func(b []byte) []byte { return compress(codec.Zlib, b) }, func(b []byte) { adler32.Checksum(b) }},
		{"gzip-5", codec.Gzip, func(b []byte) []byte { return compress(codec.Gzip, b) }, func(b []byte) { crc32.ChecksumIEEE(b) }},
		{"blosc-zlib-shuffle", codec.Blosc, func(b []byte) []byte { return bloscCompress(b, 4, 256<<10, codec.ByteShuffle, "zlib") },
			func(b []byte) { adler32.Checksum(b) }},
	}
	ncpu := runtime.NumCPU()
	lines := []string{"", fmt.Sprintf("deflate family on the GPU (Options.Deflate; the host checks CRC-32 / Adler-32 after nvCOMP), against codec.NewCPU with %d workers, GB/s of decoded data:", ncpu),
		fmt.Sprintf("%-18s %6s %9s %9s %9s %9s %9s %9s", "codec", "ratio", fmt.Sprintf("cpu%d", ncpu), "gpu", "gpu-pin", "x cpu", "x(pin)", "sum1")}
	worst := 1e9
	for _, k := range kinds {
		jobs := make([]codec.Job, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, ncpu)
		for i := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				f := field(era5Y, era5X, uint64(i+1))
				jobs[i] = codec.Job{Codec: k.c, Src: k.enc(f), Dst: make([]byte, len(f))}
			})
		}
		wg.Wait()
		in, out := decodedBytes(jobs)
		dtCPU, err := best(3, func() error {
			if err := cpu.DecodeBatch(ctx, jobs); err != nil {
				return err
			}
			for _, j := range jobs {
				if j.Err != nil {
					return j.Err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		ref := make([][]byte, n)
		for i, j := range jobs {
			ref[i] = append([]byte(nil), j.Dst...)
		}
		run := func(js []codec.Job) (time.Duration, error) {
			d.DecodeBatch(ctx, js) // warm the buffers
			before := d.Stats().Chunks
			dt, err := best(3, func() error { return d.DecodeBatch(ctx, js) })
			if err != nil {
				return 0, err
			}
			if got := d.Stats().Chunks - before; got != 3*int64(n) {
				return 0, fmt.Errorf("%s: the GPU decoded %d of %d chunks (Stats %+v; first error: %v)", k.name, got, 3*n, d.Stats(), js[0].Err)
			}
			for i, j := range js {
				if j.Err != nil || string(j.Dst) != string(ref[i]) {
					return 0, fmt.Errorf("%s chunk %d: %v, or GPU bytes differ from the CPU's", k.name, i, j.Err)
				}
			}
			return dt, nil
		}
		for i := range jobs {
			clear(jobs[i].Dst)
		}
		dtGPU, err := run(jobs)
		if err != nil {
			t.Fatal(err)
		}
		pj := make([]codec.Job, n)
		for i, j := range jobs {
			src, dst := d.HostAllocWait(len(j.Src), 10*time.Second), d.HostAllocWait(len(j.Dst), 10*time.Second)
			copy(src, j.Src)
			pj[i] = codec.Job{Codec: j.Codec, Src: src, Dst: dst}
		}
		dtPin, err := run(pj)
		for _, j := range pj {
			d.HostFree(j.Src)
			d.HostFree(j.Dst)
		}
		if err != nil {
			t.Fatal(err)
		}
		few := ref[:min(8, n)]
		var fewOut int64
		for _, b := range few {
			fewOut += int64(len(b))
		}
		dtSum, _ := best(3, func() error {
			for _, b := range few {
				k.sum(b)
			}
			return nil
		})
		c, g, gp := gbs(out, dtCPU), gbs(out, dtGPU), gbs(out, dtPin)
		worst = min(worst, gp/c)
		lines = append(lines, fmt.Sprintf("%-18s %6.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f",
			k.name, float64(out)/float64(in), c, g, gp, g/c, gp/c, gbs(fewOut, dtSum)))
	}
	// What the measure says, not what decode.GPUDeflate is now (this
	// package cannot see it).
	verdict := "decode.GPUDeflate should be off"
	if worst >= 1 {
		verdict = "decode.GPUDeflate may be on, if the Deflate damage suite passes too"
	}
	lines = append(lines, fmt.Sprintf("deflate verdict: worst pinned GPU / cpu%d = %.2f: %s (on takes 1.00 or more on every row). sum1: the host's checksum alone on one goroutine.",
		ncpu, worst, verdict))
	return lines
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The first rounds of each codec in a fresh process, timed: what the
// first batch of a mount pays before the device's rate (module loading,
// nvCOMP's first use), against the rounds after it. A measure for the GPU
// machine (make test-gpu logs it); it checks only the bytes.
func TestGPUFirstRounds(t *testing.T) {
	t0 := time.Now()
	d, err := New(Options{})
	if err != nil {
		t.Skipf("no GPU decoding here: %v", err)
	}
	defer d.Close()
	t.Logf("New: %v", time.Since(t0).Round(time.Microsecond))
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i / 7 % 251)
	}
	srcs := map[codec.Name][]byte{
		codec.LZ4:   compress(codec.LZ4, data),
		codec.Zstd:  zstdCompress(data, 3),
		codec.Blosc: bloscCompress(data, 4, 256<<10, codec.ByteShuffle, "lz4"),
	}
	for _, name := range []codec.Name{codec.Blosc, codec.LZ4, codec.Zstd} {
		var times []string
		for range 3 {
			jobs := []codec.Job{{Codec: name, Src: srcs[name], Dst: make([]byte, len(data))}}
			t1 := time.Now()
			if err := d.DecodeBatch(context.Background(), jobs); err != nil || jobs[0].Err != nil {
				t.Fatalf("%s: %v, %v", name, err, jobs[0].Err)
			}
			times = append(times, time.Since(t1).Round(time.Microsecond).String())
			if !bytes.Equal(jobs[0].Dst, data) {
				t.Fatalf("%s: other bytes", name)
			}
		}
		t.Logf("%s: rounds of one 4 MiB chunk: %s", name, strings.Join(times, ", "))
	}
}
