package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/codec"
)

// These tests need a GPU, its driver and nvCOMP; elsewhere they skip and
// say which was missing. Every one compares the GPU's bytes with the CPU
// decoder's (codec.Decode) or with the data that was compressed.

var (
	sharedOnce sync.Once
	sharedDec  *Decoder
	sharedErr  error
)

func gpuDecoder(t testing.TB) *Decoder {
	t.Helper()
	sharedOnce.Do(func() {
		sharedDec, sharedErr = New(Options{Deflate: true, Unverified: true})
		if sharedErr == nil {
			t.Logf("%s, nvCOMP from %s", sharedDec.Info(), sharedDec.Info().NvcompPath)
		}
	})
	if sharedErr != nil {
		t.Skipf("no GPU decoding here: %v", sharedErr)
	}
	return sharedDec
}

// cpuDecode returns the CPU decoder's result for a job.
func cpuDecode(j codec.Job) ([]byte, error) {
	out := make([]byte, len(j.Dst))
	err := codec.Decode(j.Codec, out, j.Src)
	return out, err
}

func TestGPUVectors(t *testing.T) {
	d := gpuDecoder(t)
	vecs, src, raw := loadVectors(t)
	jobs := make([]codec.Job, len(vecs))
	for i, v := range vecs {
		jobs[i] = codec.Job{Codec: codec.Name(v.Codec), Src: src[v.Name], Dst: make([]byte, len(raw[v.Name]))}
	}
	before := d.Stats()
	if err := d.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	var onGPU, onCPU int
	for i, v := range vecs {
		j := jobs[i]
		want, cerr := cpuDecode(j)
		switch {
		case j.Err == nil:
			onGPU++
			if cerr != nil {
				t.Errorf("%s: GPU decoded what the CPU rejects (%v)", v.Name, cerr)
			} else if !bytes.Equal(j.Dst, want) || !bytes.Equal(j.Dst, raw[v.Name]) {
				t.Errorf("%s: GPU bytes differ from the CPU's", v.Name)
			}
		case errors.Is(j.Err, codec.ErrUnsupported):
			onCPU++
			if !strings.Contains(v.Name, "blosclz") && !strings.Contains(v.Name, "two_members") && len(raw[v.Name]) != 0 {
				t.Errorf("%s: GPU refused: %v", v.Name, j.Err)
			}
		default:
			t.Errorf("%s: %v", v.Name, j.Err)
		}
	}
	requireOnGPU(t, d, before, onGPU)
	t.Logf("%d vectors decoded on the GPU byte-identical to the CPU, %d left to the CPU", onGPU, onCPU)
}

func TestGPUManyChunks(t *testing.T) {
	d := gpuDecoder(t)
	var jobs []codec.Job
	var want [][]byte
	var names []string
	// Several rounds of every codec and blosc variant, of varied shapes.
	for _, shape := range [][2]int{{37, 91}, {128, 256}, {1, 5000}, {300, 301}} {
		j, w, n := genJobs(t, shape[0], shape[1])
		jobs, want, names = append(jobs, j...), append(want, w...), append(names, n...)
	}
	for _, maxBytes := range []int64{0, 4 << 20} { // one round; many rounds
		t.Run(fmt.Sprintf("max%d", maxBytes), func(t *testing.T) {
			dd := d
			if maxBytes > 0 {
				var err error
				if dd, err = New(Options{MaxBatchBytes: maxBytes, Streams: 2, Deflate: true, Unverified: true}); err != nil {
					t.Fatal(err)
				}
				defer dd.Close()
			}
			for i := range jobs {
				clear(jobs[i].Dst)
			}
			before := dd.Stats()
			if err := dd.DecodeBatch(context.Background(), jobs); err != nil {
				t.Fatal(err)
			}
			requireOnGPU(t, dd, before, len(jobs))
			for i, j := range jobs {
				if j.Err != nil {
					t.Errorf("%s: %v", names[i], j.Err)
					continue
				}
				if !bytes.Equal(j.Dst, want[i]) {
					t.Errorf("%s: GPU bytes differ from the input", names[i])
				}
				if cpu, err := cpuDecode(j); err == nil && !bytes.Equal(cpu, j.Dst) {
					t.Errorf("%s: GPU bytes differ from the CPU's", names[i])
				}
			}
		})
	}
}

// TestGPUPinned decodes chunks whose Src, Dst or both lie in pinned memory
// from HostAlloc, at odd offsets inside it (so that pieces need the
// device-side copies into aligned slots), mixed with ordinary jobs in the
// same rounds, with and without byte swapping; and a caller that gives up
// while its pinned jobs are on the device.
func TestGPUPinned(t *testing.T) {
	d := gpuDecoder(t)
	var jobs []codec.Job
	var want [][]byte
	var names []string
	for _, shape := range [][2]int{{37, 91}, {300, 301}} {
		j, w, n := genJobs(t, shape[0], shape[1])
		jobs, want, names = append(jobs, j...), append(want, w...), append(names, n...)
	}
	var lent [][]byte
	defer func() {
		for _, b := range lent {
			d.HostFree(b)
		}
	}()
	pinnedCopy := func(b []byte, off int) []byte {
		buf := d.HostAllocWait(len(b)+off, 10*time.Second)
		lent = append(lent, buf)
		if !d.pinned(buf) {
			t.Fatalf("HostAlloc(%d) is not pinned", len(buf))
		}
		return buf[off : off+copy(buf[off:], b)]
	}
	for i := range jobs {
		switch i % 4 {
		case 0: // both
			jobs[i].Src, jobs[i].Dst = pinnedCopy(jobs[i].Src, i%7), pinnedCopy(jobs[i].Dst, 0)
		case 1: // Src only, at an odd offset
			jobs[i].Src = pinnedCopy(jobs[i].Src, 1+i%7)
		case 2: // Dst only
			jobs[i].Dst = pinnedCopy(jobs[i].Dst, 64)
		}
	}
	for _, streams := range []int{2, 4} {
		t.Run(fmt.Sprintf("streams%d", streams), func(t *testing.T) {
			dd, err := New(Options{Streams: streams, MaxBatchBytes: 8 << 20, Deflate: true, Unverified: true})
			if err != nil {
				t.Fatal(err)
			}
			defer dd.Close()
			// dd did not lend the memory: it packs and copies out. d did.
			for _, dec := range []*Decoder{dd, d} {
				for i := range jobs {
					clear(jobs[i].Dst)
				}
				if err := dec.DecodeBatch(context.Background(), jobs); err != nil {
					t.Fatal(err)
				}
				for i, j := range jobs {
					if j.Err != nil {
						t.Errorf("%s: %v", names[i], j.Err)
					} else if !bytes.Equal(j.Dst, want[i]) {
						t.Errorf("%s (pinned %d): GPU bytes differ from the input", names[i], i%4)
					}
				}
			}
		})
	}
	// Byte swapping into pinned Dst.
	data := field(64, 64, 9)
	swapped := bytes.Clone(data)
	swapInPlace(swapped, 4)
	sj := []codec.Job{
		{Codec: codec.Zstd, Src: pinnedCopy(compress(codec.Zstd, data), 3), Dst: pinnedCopy(make([]byte, len(data)), 0)},
		{Codec: codec.Blosc, Src: pinnedCopy(bloscCompress(data, 4, 4096, codec.ByteShuffle, "lz4"), 5), Dst: make([]byte, len(data))},
	}
	if err := d.DecodeBatchSwap(context.Background(), sj, 4); err != nil {
		t.Fatal(err)
	}
	for i, j := range sj {
		if j.Err != nil || !bytes.Equal(j.Dst, swapped) {
			t.Errorf("swap job %d: err %v, bytes right %v", i, j.Err, bytes.Equal(j.Dst, swapped))
		}
	}
	// A caller that gives up at once: it must return, and its pinned
	// memory must not be written after it has.
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		cj := []codec.Job{{Codec: codec.Zstd, Src: jobs[0].Src, Dst: jobs[0].Dst}}
		go cancel()
		d.DecodeBatch(ctx, cj)
		clear(cj[0].Dst)
		time.Sleep(2 * time.Millisecond)
		if !allZero(cj[0].Dst) {
			t.Fatal("the device wrote into a pinned Dst after its caller gave up")
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func TestGPUByteSwap(t *testing.T) {
	d := gpuDecoder(t)
	for _, size := range []int{2, 4, 8} {
		data := field(64, 64, uint64(size))
		jobs := []codec.Job{
			{Codec: codec.Zstd, Src: compress(codec.Zstd, data), Dst: make([]byte, len(data))},
			{Codec: codec.Blosc, Src: bloscCompress(data, size, 4096, codec.ByteShuffle, "lz4"), Dst: make([]byte, len(data))},
			{Codec: codec.Gzip, Src: compress(codec.Gzip, data), Dst: make([]byte, len(data))},
		}
		before := d.Stats()
		if err := d.DecodeBatchSwap(context.Background(), jobs, size); err != nil {
			t.Fatal(err)
		}
		requireOnGPU(t, d, before, len(jobs))
		for k, j := range jobs {
			if j.Err != nil {
				t.Fatalf("size %d job %d: %v", size, k, j.Err)
			}
			for i := 0; i < len(data); i += size {
				for b := range size {
					if j.Dst[i+b] != data[i+size-1-b] {
						t.Fatalf("size %d job %d: element %d not swapped", size, k, i/size)
					}
				}
			}
		}
	}
}

// TestGPUCorrupt decodes damaged chunks mixed with good ones through a
// Decoder of default Options, as zarrfs ships it. Every kind of damage
// (damageKinds) is applied to every chunk with -gpu.seeds seeds. No good
// chunk may ever come back with a wrong byte: it decodes right, or fails
// with ErrUnsupported because the CPU decodes its codec (deflate, zstd
// without a checksum) or because nvCOMP faulted. No damaged chunk may be
// accepted by the GPU unless the CPU decoder accepts it too and decodes it
// to the same bytes (damage neither can see, a flipped literal, say): a
// chunk "accepted by the GPU only" fails the test. How many chunks the GPU
// decoded comes from the Decoder's Stats, and must match the jobs that
// came back without error, so the test cannot pass with nothing decoded
// on the GPU. nvCOMP may fault on damaged input (it documents it as
// undefined behaviour); the fault poisons the CUDA context for the whole
// process, so the decoder must then fail every job with ErrUnsupported
// (the caller falls back to the CPU). It runs only when asked
// (-gpu.corrupt), one process per codec and kind of damage.
func TestGPUCorrupt(t *testing.T) {
	runCorrupt(t, Options{}, nil)
}

// TestGPUCorruptDeflate is TestGPUCorrupt with Options.Deflate on:
// damaged gzip, zlib and blosc-zlib chunks go to nvCOMP's deflate decoder,
// and the host checks their CRC-32 (and size) or Adler-32 over what it
// decoded, blosc zlib streams included. As under default Options, a chunk
// accepted by the GPU only fails the test. On an H200 that decoder once
// wrote a damaged stream's output past its end into the next chunk's bytes,
// with no error; the fence around deflate outputs (see fenceGuard) is there
// to stop that. Should a good chunk still come back wrong, the test fails,
// naming every wrong chunk: the fence did not hold.
func TestGPUCorruptDeflate(t *testing.T) {
	var wrong []string
	runCorrupt(t, Options{Deflate: true}, &wrong)
	if len(wrong) > 0 {
		t.Errorf("KNOWN nvCOMP deflate defect: %d good chunks came back with wrong bytes and no error next to damaged deflate streams (%s); Options.Deflate must stay off",
			len(wrong), strings.Join(wrong, ", "))
	}
}

// TestGPUCorruptUnverified is TestGPUCorrupt with Options.Unverified on:
// damaged zstd chunks without a checksum and blosc-zstd chunks go to
// nvCOMP after the host's structural checks only. Some damage makes an
// nvCOMP kernel loop; the watchdog must then release every caller with
// its jobs for the CPU (NVCOMP-HUNG), in the time the process allows. As
// under default Options, a chunk accepted by the GPU only fails the test:
// it is what Unverified risks, and the suite holds every configuration to
// the CPU's verdict.
func TestGPUCorruptUnverified(t *testing.T) {
	runCorrupt(t, Options{Unverified: true}, nil)
}

// TestGPUCorruptWalk is TestGPUCorrupt with Options.WalkOnDevice on:
// damaged LZ4 blocks (numcodecs LZ4, blosc lz4) reach the device, whose
// walk must reject what the host's would, before nvCOMP reads them.
func TestGPUCorruptWalk(t *testing.T) {
	runCorrupt(t, Options{WalkOnDevice: true}, nil)
}

// warnCounter counts the decoder's log records by message.
type warnCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *warnCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *warnCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *warnCounter) WithGroup(string) slog.Handler            { return h }
func (h *warnCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.mu.Lock()
		h.n[r.Message]++
		h.mu.Unlock()
	}
	return nil
}

func (h *warnCounter) fenceWarnings() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int
	for m, c := range h.n {
		if strings.Contains(m, "fence") {
			n += c
		}
	}
	return n
}

// damagedJobs returns the good chunks of genJobs(60, 70) (wants set) and,
// for each, every kind of damage that matches filter (on "name/kind"),
// drawn with seeds seeds (wants nil).
func damagedJobs(t *testing.T, filter *regexp.Regexp, seeds int) (jobs []codec.Job, kinds []string, wants [][]byte, good []codec.Job, want [][]byte, names []string) {
	good, want, names = genJobs(t, 60, 70)
	for i, g := range good {
		jobs = append(jobs, g)
		kinds = append(kinds, names[i]+"/good")
		wants = append(wants, want[i])
		for _, kind := range damageKinds {
			if !filter.MatchString(names[i] + "/" + kind) {
				continue
			}
			for seed := range seeds {
				src := damage(kind, g.Codec, g.Src, rand.New(rand.NewPCG(uint64(seed), uint64(i))))
				if src == nil {
					continue
				}
				jobs = append(jobs, codec.Job{Codec: g.Codec, Src: src, Dst: make([]byte, len(g.Dst))})
				kinds = append(kinds, fmt.Sprintf("%s/%s seed %d", names[i], kind, seed))
				wants = append(wants, nil)
			}
		}
	}
	return jobs, kinds, wants, good, want, names
}

// runCorrupt is TestGPUCorrupt's body for a Decoder of opts. With wrong
// set, good chunks with wrong bytes are collected there rather than
// failed one by one. A damaged chunk accepted by the GPU only fails it
// whatever the options: every configuration is held to the CPU's verdict.
func runCorrupt(t *testing.T, opts Options, wrong *[]string) {
	if *flagCorrupt == "" {
		t.Skip("runs in its own process (-gpu.corrupt=REGEXP): a device fault disables the GPU for the rest of a process")
	}
	corruptFilter, err := regexp.Compile(*flagCorrupt)
	if err != nil {
		t.Fatal(err)
	}
	gpuDecoder(t) // skips without a GPU
	logs := &warnCounter{n: map[string]int{}}
	opts.Logger = slog.New(logs)
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	defer func() {
		for m, n := range logs.n {
			t.Logf("decoder warned %d times: %s", n, m)
		}
	}()
	corruptRounds(t, d, opts, logs, corruptFilter, *flagSeeds, wrong)
}

// corruptRounds is runCorrupt's test proper, on d (of opts, logging to
// logs): three rounds of the good and damaged chunks that filter selects,
// shuffled, then a clean batch.
func corruptRounds(t *testing.T, d *Decoder, opts Options, logs *warnCounter, filter *regexp.Regexp, seeds int, wrong *[]string) {
	r := rand.New(rand.NewPCG(9, 9))
	jobs, kinds, wants, good, want, names := damagedJobs(t, filter, seeds)
	if len(jobs) == len(good) {
		t.Fatalf("no damaged chunk matches %q", filter)
	}
	// Every other job in pinned memory from HostAlloc: good and damaged
	// chunks cross to and from the device directly as well as packed.
	for i := range jobs {
		if i%2 == 0 && len(jobs[i].Src) > 0 {
			src, dst := d.HostAlloc(len(jobs[i].Src)), d.HostAlloc(len(jobs[i].Dst))
			copy(src, jobs[i].Src)
			jobs[i].Src, jobs[i].Dst = src, dst
			defer d.HostFree(src)
			defer d.HostFree(dst)
		}
	}
	// toNvcomp: the host's verdict lets the job reach nvCOMP under opts.
	toNvcomp := func(j codec.Job) bool {
		p := prepare(&j)
		return opts.refusal(&j, &p) == nil
	}
	// cpuOnly: the good chunks this configuration leaves to the CPU: those
	// opts refuses (deflate when Deflate is off, zstd without a checksum
	// when Unverified is off), and those with deflate streams when the
	// fence caught an overrun in the batch (deflate slots after it go back
	// to the CPU).
	fenceHit := false
	cpuOnly := func(j codec.Job) bool {
		p := prepare(&j)
		if p.err != nil {
			return false
		}
		return opts.refusal(&j, &p) != nil || (fenceHit && p.uses(algoDeflate))
	}
	var onGPU int // good chunks this configuration decodes on the GPU
	for _, g := range good {
		if !cpuOnly(g) {
			onGPU++
		}
	}
	var damaged, reach int
	for i := range jobs {
		if wants[i] == nil {
			damaged++
			if toNvcomp(jobs[i]) {
				reach++
			}
		}
	}
	t.Logf("%d good chunks (%d for the GPU), %d damaged (%d seeds per kind), %d of them pass the host checks and reach nvCOMP",
		len(good), onGPU, damaged, seeds, reach)
	badGood := func(round int, kind string, j codec.Job) {
		msg := fmt.Sprintf("round %d: good chunk %s: wrong bytes, no error", round, kind)
		if wrong != nil {
			*wrong = append(*wrong, fmt.Sprintf("round %d %s", round, kind))
			t.Log("WRONG-BYTES " + msg)
			return
		}
		t.Error(msg)
	}
	faulted := false
	var gpuOnlyTotal, cpuRefTotal int
	for round := range 3 {
		r.Shuffle(len(jobs), func(a, b int) {
			jobs[a], jobs[b] = jobs[b], jobs[a]
			kinds[a], kinds[b] = kinds[b], kinds[a]
			wants[a], wants[b] = wants[b], wants[a]
		})
		for i := range jobs {
			for k := range jobs[i].Dst {
				jobs[i].Dst[k] = 0xEE // no stale right answer from the round before
			}
		}
		before := logs.fenceWarnings()
		s0 := d.Stats()
		t0 := time.Now()
		err := d.DecodeBatch(context.Background(), jobs)
		s1 := d.Stats()
		fenceHit = logs.fenceWarnings() > before
		if fenceHit {
			t.Logf("round %d: the fence caught a deflate overrun", round)
		}
		if err != nil {
			faulted = true
			if errors.Is(err, ErrHung) {
				t.Logf("NVCOMP-HUNG round %d: the watchdog retired the GPU after %v: %v", round, time.Since(t0).Round(time.Millisecond), err)
			} else {
				t.Logf("NVCOMP-FAULT round %d: %v", round, err)
			}
		}
		var detected, silent, agreed, noRef, decodedGood, decodedDamaged, ok int
		for i, j := range jobs {
			if j.Err == nil {
				ok++
			}
			if wants[i] != nil {
				switch {
				case j.Err == nil && !bytes.Equal(j.Dst, wants[i]):
					badGood(round, kinds[i], j)
				case j.Err == nil:
					decodedGood++
				case errors.Is(j.Err, codec.ErrUnsupported) && (faulted || cpuOnly(j)):
				default:
					t.Errorf("round %d: good chunk %s: %v", round, kinds[i], j.Err)
				}
				continue
			}
			if faulted {
				// Damaged chunks go back to the CPU too, or were rejected by
				// the host's checks before the device was asked.
				if !errors.Is(j.Err, codec.ErrUnsupported) && !errors.Is(j.Err, codec.ErrCorrupt) {
					t.Errorf("%s: after a device fault, job error %v does not send it to the CPU", kinds[i], j.Err)
				}
				continue
			}
			cpu, cerr := cpuDecode(j)
			switch {
			case j.Err != nil:
				if !errors.Is(j.Err, codec.ErrCorrupt) && !errors.Is(j.Err, codec.ErrUnsupported) {
					t.Errorf("%s: error of no known class: %v", kinds[i], j.Err)
				}
				if errors.Is(j.Err, codec.ErrCorrupt) && cerr == nil {
					t.Errorf("%s: the GPU path calls corrupt what the CPU decodes: %v", kinds[i], j.Err)
				}
				detected++
			case cerr == nil && bytes.Equal(cpu, j.Dst):
				decodedDamaged++
				agreed++ // damage neither decoder can see
			case errors.Is(cerr, codec.ErrUnsupported):
				decodedDamaged++
				noRef++ // blosc snappy: the CPU has no decoder to compare with
			default:
				decodedDamaged++
				silent++
				t.Errorf("%s: the GPU accepted what the CPU %s", kinds[i],
					map[bool]string{true: "decodes differently", false: "rejects: " + fmt.Sprint(cerr)}[cerr == nil])
			}
		}
		// The GPU's own count of what it decoded must be what came back
		// without error: every such chunk went through nvCOMP or the copy
		// kernel, none through a CPU decoder.
		if got := s1.Chunks - s0.Chunks; got != int64(ok) {
			t.Errorf("round %d: Stats says %d chunks decoded on the GPU, %d jobs came back without error", round, got, ok)
		}
		if !faulted && onGPU > 0 && decodedGood == 0 {
			t.Errorf("round %d: none of the %d good chunks for the GPU decoded there", round, onGPU)
		}
		gpuOnlyTotal += silent
		cpuRefTotal += noRef
		if !faulted {
			t.Logf("round %d: %d chunks decoded on the GPU (Stats: %+v); %d damaged chunks detected, %d decode alike on both, %d accepted by the GPU only%s",
				round, s1.Chunks-s0.Chunks, Stats{Chunks: s1.Chunks - s0.Chunks, Corrupt: s1.Corrupt - s0.Corrupt,
					Refused: s1.Refused - s0.Refused, Disagreed: s1.Disagreed - s0.Disagreed, WalkRejected: s1.WalkRejected - s0.WalkRejected},
				detected, agreed, silent, map[bool]string{true: fmt.Sprintf(", %d decoded where the CPU has no decoder", noRef)}[noRef > 0])
		}
	}
	if gpuOnlyTotal > 0 {
		t.Logf("GPU-ONLY: %d damaged chunks accepted by the GPU only over 3 rounds", gpuOnlyTotal)
	}
	// Afterwards a clean batch decodes exactly, or, after a fault, goes to
	// the CPU whole: never wrong bytes.
	clean := make([]codec.Job, len(good))
	for i, g := range good {
		clean[i] = codec.Job{Codec: g.Codec, Src: g.Src, Dst: make([]byte, len(g.Dst))}
	}
	fenceHit = false
	err := d.DecodeBatch(context.Background(), clean)
	if err != nil && !faulted {
		t.Fatalf("clean batch: %v", err)
	}
	for i, j := range clean {
		switch {
		case j.Err == nil && !bytes.Equal(j.Dst, want[i]):
			t.Fatalf("clean batch, %s: wrong bytes", names[i])
		case j.Err != nil && !errors.Is(j.Err, codec.ErrUnsupported):
			t.Fatalf("clean batch, %s: %v", names[i], j.Err)
		case j.Err != nil && !faulted && !cpuOnly(j):
			t.Fatalf("clean batch, %s: %v", names[i], j.Err)
		}
	}
	if faulted {
		t.Logf("NVCOMP-FAULT: the GPU path is off for this process; later batches go to the CPU")
	}
}

func TestGPUConcurrent(t *testing.T) {
	d := gpuDecoder(t)
	jobs0, want, _ := genJobs(t, 50, 50)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			jobs := make([]codec.Job, len(jobs0))
			for i, j := range jobs0 {
				jobs[i] = codec.Job{Codec: j.Codec, Src: j.Src, Dst: make([]byte, len(j.Dst))}
			}
			for range 5 {
				if err := d.DecodeBatch(context.Background(), jobs); err != nil {
					errs <- err
					return
				}
				for i, j := range jobs {
					if j.Err != nil || !bytes.Equal(j.Dst, want[i]) {
						errs <- fmt.Errorf("goroutine %d job %d: %v", g, i, j.Err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestGPUCancelled(t *testing.T) {
	d := gpuDecoder(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	data := field(8, 8, 1)
	jobs := []codec.Job{{Codec: codec.Zstd, Src: compress(codec.Zstd, data), Dst: make([]byte, len(data))}}
	if err := d.DecodeBatch(ctx, jobs); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

// roundCounter counts the decoder's rounds and those shared by several
// callers, from its debug lines; cancelOnFirst, when set, is called at the
// first round.
type roundCounter struct {
	mu            sync.Mutex
	rounds        int
	shared        int
	cancelOnFirst func()
}

func (h *roundCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *roundCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *roundCounter) WithGroup(string) slog.Handler            { return h }
func (h *roundCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "gpu batch" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rounds++
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "callers" && a.Value.Int64() > 1 {
			h.shared++
		}
		return true
	})
	if h.cancelOnFirst != nil {
		h.cancelOnFirst()
		h.cancelOnFirst = nil
	}
	return nil
}

// swapped returns b with the bytes of every size-byte element reversed.
func swapped(b []byte, size int) []byte {
	out := bytes.Clone(b)
	for i := 0; i+size <= len(out); i += size {
		for k := range size / 2 {
			out[i+k], out[i+size-1-k] = out[i+size-1-k], out[i+k]
		}
	}
	return out
}

// TestGPUConcurrentMerge decodes from many goroutines at once, half of them
// with a byte swap, so that callers share rounds: every chunk must come back
// byte-identical to the CPU decoder's (swapped where asked), whoever it
// shared its round with.
func TestGPUConcurrentMerge(t *testing.T) {
	gpuDecoder(t)
	jobs0, want, names := genJobs(t, 64, 96)
	cpuRef := make([][]byte, len(jobs0))
	for i, j := range jobs0 {
		if out, err := cpuDecode(j); err == nil {
			cpuRef[i] = out
		}
	}
	for _, opts := range []Options{{}, {Deflate: true, Unverified: true, MaxBatchBytes: 16 << 20}} {
		t.Run(fmt.Sprintf("deflate=%v", opts.Deflate), func(t *testing.T) {
			rc := &roundCounter{}
			opts.Logger = slog.New(rc)
			d, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for g := range 16 {
				wg.Go(func() {
					elem := []int{0, 4}[g%2]
					jobs := make([]codec.Job, len(jobs0))
					for it := range 4 {
						// Each caller a different slice of the chunks.
						n := 1 + (g*7+it*5)%len(jobs0)
						for i := range n {
							j := jobs0[(g+i)%len(jobs0)]
							jobs[i] = codec.Job{Codec: j.Codec, Src: j.Src, Dst: make([]byte, len(j.Dst))}
						}
						if err := d.DecodeBatchSwap(context.Background(), jobs[:n], elem); err != nil {
							errs <- fmt.Errorf("goroutine %d: %w", g, err)
							return
						}
						for i, j := range jobs[:n] {
							k := (g + i) % len(jobs0)
							p := prepare(&j)
							refused := p.err == nil && opts.refusal(&j, &p) != nil // deflate or unverified streams, for the CPU
							switch {
							case elem > 1 && len(j.Dst)%elem != 0, refused:
								if !errors.Is(j.Err, codec.ErrUnsupported) {
									errs <- fmt.Errorf("goroutine %d %s: %v, want ErrUnsupported", g, names[k], j.Err)
								}
							case j.Err != nil:
								errs <- fmt.Errorf("goroutine %d %s: %v", g, names[k], j.Err)
							case !bytes.Equal(j.Dst, swapped(want[k], max(elem, 1))):
								errs <- fmt.Errorf("goroutine %d %s (elem %d): GPU bytes differ from the input", g, names[k], elem)
							case cpuRef[k] != nil && !bytes.Equal(j.Dst, swapped(cpuRef[k], max(elem, 1))):
								errs <- fmt.Errorf("goroutine %d %s (elem %d): GPU bytes differ from the CPU's", g, names[k], elem)
							}
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			rc.mu.Lock()
			t.Logf("%d rounds, %d of them shared by several callers", rc.rounds, rc.shared)
			rc.mu.Unlock()
		})
	}
}

// TestGPUCancelledMidFlight cancels one caller once the decoder has
// finished its first round, while the caller's other rounds and those of
// other callers are queued or on the device: the others must all succeed,
// and the cancelled caller must return, its unfinished jobs failing with
// ErrUnsupported and its memory left alone afterwards.
func TestGPUCancelledMidFlight(t *testing.T) {
	gpuDecoder(t)
	rc := &roundCounter{}
	d, err := New(Options{MaxBatchBytes: 8 << 20, Logger: slog.New(rc)})
	if err != nil {
		t.Fatal(err)
	}
	jobs0, want, names := genJobs(t, 128, 256)
	var keep []int // what the GPU decodes with default Options
	for i, j := range jobs0 {
		if p := prepare(&j); (Options{}).refusal(&j, &p) == nil {
			keep = append(keep, i)
		}
	}
	mk := func(copies int) ([]codec.Job, []int) {
		var jobs []codec.Job
		var at []int
		for range copies {
			for _, i := range keep {
				j := jobs0[i]
				jobs = append(jobs, codec.Job{Codec: j.Codec, Src: j.Src, Dst: make([]byte, len(j.Dst))})
				at = append(at, i)
			}
		}
		return jobs, at
	}
	ctx, cancel := context.WithCancel(context.Background())
	rc.mu.Lock()
	rc.cancelOnFirst = cancel
	rc.mu.Unlock()
	victim, vat := mk(4)
	vdone := make(chan error, 1)
	go func() { vdone <- d.DecodeBatch(ctx, victim) }()
	waitQueued(d, 0, 1) // the victim's jobs come first
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 6 {
		wg.Go(func() {
			for range 3 {
				jobs, at := mk(1)
				if err := d.DecodeBatch(context.Background(), jobs); err != nil {
					errs <- fmt.Errorf("goroutine %d: %w", g, err)
					return
				}
				for i, j := range jobs {
					if j.Err != nil || !bytes.Equal(j.Dst, want[at[i]]) {
						errs <- fmt.Errorf("goroutine %d %s: %v", g, names[at[i]], j.Err)
						return
					}
				}
			}
		})
	}
	verr := <-vdone
	var left []int
	switch {
	case verr == nil:
		t.Log("the cancelled caller finished before the cancel reached it")
	case !errors.Is(verr, context.Canceled):
		t.Fatalf("cancelled caller: %v", verr)
	}
	var done int
	for i, j := range victim {
		switch {
		case j.Err == nil:
			done++
			if !bytes.Equal(j.Dst, want[vat[i]]) {
				t.Errorf("cancelled caller's finished job %s: wrong bytes", names[vat[i]])
			}
		case errors.Is(j.Err, codec.ErrUnsupported) && errors.Is(j.Err, context.Canceled):
			left = append(left, i)
			for k := range j.Dst {
				j.Dst[k] = 0xAB
			}
		default:
			t.Errorf("cancelled caller's job %s: %v", names[vat[i]], j.Err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	d.Close() // every round in flight is settled
	for _, i := range left {
		for _, b := range victim[i].Dst {
			if b != 0xAB {
				t.Fatalf("cancelled caller's job %s was written after its call returned", names[vat[i]])
			}
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	t.Logf("cancelled caller: %d of %d jobs finished, %d dropped; %d rounds, %d shared", done, len(victim), len(left), rc.rounds, rc.shared)
}
