package decode

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
)

// These tests model the two stores of the GPU fill benchmark for auto
// mode's start and its guards, against gpu.Refusal itself (not a stand-in):
//
//   - "mixed": t, z, u, v in zstd frames without a content checksum
//     (numcodecs' default; a GPU may not take them alone) and the surface
//     fields in blosc-lz4. Its blosc chunks are 19% of a sample's bytes and,
//     blosc-lz4 decoding three times faster than zstd on a core (38.4
//     against 12.6 GB/s on 16 cores), about 8% of the CPU's decoding: one
//     checksummed zstd chunk (which a GPU may take) in thirteen stands in.
//   - "blosc": every chunk one a GPU may take.

// zstdNoSumJob is a zstd chunk without a content checksum: gpu.Refusal
// leaves it to the CPU unless Options.Unverified.
func zstdNoSumJob(t testing.TB) codec.Job {
	noSumOnce.Do(func() {
		e, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(false))
		if err != nil {
			panic(err)
		}
		defer e.Close()
		noSumSrc = e.EncodeAll(sample, nil)
	})
	return codec.Job{Codec: codec.Zstd, Src: noSumSrc, Dst: make([]byte, len(sample))}
}

var (
	noSumOnce, sumOnce sync.Once
	noSumSrc, sumSrc   []byte
)

// sumJob is zstdJob (a frame with its checksum), encoded once.
func sumJob(t testing.TB) codec.Job {
	sumOnce.Do(func() { sumSrc = zstdJob(t).Src })
	return codec.Job{Codec: codec.Zstd, Src: sumSrc, Dst: make([]byte, len(sample))}
}

// mixedBatch is a batch of the mixed store; bloscBatch of the blosc one.
func mixedBatch(t testing.TB) []codec.Job {
	jobs := []codec.Job{sumJob(t)}
	for range 12 {
		jobs = append(jobs, zstdNoSumJob(t))
	}
	return jobs
}

func bloscBatch(t testing.TB) []codec.Job {
	var jobs []codec.Job
	for range 13 {
		jobs = append(jobs, sumJob(t))
	}
	return jobs
}

// gatedPipeline is an Auto pipeline whose GPUs start as auto mode starts
// them (not at New), after 1 ms of the pool's decoding on chunks a GPU may
// take, under gpu.Refusal with unverified as --gpu-trust-unchecked; its
// log lines at info and above go to the returned buffer.
func gatedPipeline(t *testing.T, unverified bool) (*Pipeline, *[]*fakeGPU, *syncBuffer) {
	t.Helper()
	made := new([]*fakeGPU)
	opts := fakes(Auto, 1, made)
	opts.startAtOnce, opts.refusal = false, nil
	opts.GPUStartAfter = time.Millisecond
	opts.GPU.Unverified = unverified
	buf := &syncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, made, buf
}

// decodeUntilBusy decodes batches of mk until the pool has spent 50 times
// the start threshold decoding them, far past it whatever the share.
func decodeUntilBusy(t *testing.T, p *Pipeline, mk func(testing.TB) []codec.Job) {
	t.Helper()
	need := 50 * p.opts.GPUStartAfter * time.Duration(p.opts.Workers)
	for i := 0; p.cpu.Busy() < need; i++ {
		if i > 20000 {
			t.Fatalf("the pool spent %v decoding after %d batches", p.cpu.Busy(), i)
		}
		jobs := mk(t)
		if err := p.DecodeBatch(context.Background(), jobs); err != nil {
			t.Fatal(err)
		}
		checkJobs(t, jobs)
	}
}

// On the mixed store, and on one whose every chunk is a zstd frame without
// a checksum, auto never starts a GPU (no context, no memory, no probe)
// however long the CPU is busy: what a GPU could take is under minShare of
// the decoding. It says so once, with the reason and the flag that would
// change it.
func TestAutoNeverStartsForUnverifiedChunks(t *testing.T) {
	for _, tc := range []struct {
		name string
		mk   func(testing.TB) []codec.Job
	}{
		{"mixed", mixedBatch},
		{"unverified only", func(t testing.TB) []codec.Job { return []codec.Job{zstdNoSumJob(t), zstdNoSumJob(t)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, made, log := gatedPipeline(t, false)
			decodeUntilBusy(t, p, tc.mk)
			if p.router.asked.Load() || len(*made) != 0 {
				t.Fatalf("the GPU was started (%d opened)", len(*made))
			}
			if s := p.Decoded()[Place{"zstd", "cpu"}]; s.Chunks == 0 {
				t.Error("nothing counted on the CPU")
			}
			lines := log.lines("too little of it is of chunks a GPU may take")
			if len(lines) != 1 || !strings.Contains(lines[0], "without a content checksum") || !strings.Contains(lines[0], "--gpu-trust-unchecked") {
				t.Errorf("want one line with the reason and the flag, got %q", lines)
			}
			if r := routeOf(p, codec.Zstd); !strings.Contains(r, "cpu") {
				t.Errorf("zstd: %s", r)
			}
		})
	}
}

// Once auto said why the GPUs do not start, it classifies one batch in
// settledPeriod, not every batch for the mount's life: each classification
// reads every job's framing (gpu.Refusal).
func TestAutoSamplesOnceItSaidNo(t *testing.T) {
	p, _, log := gatedPipeline(t, false)
	decodeUntilBusy(t, p, mixedBatch)
	if len(log.lines("too little of it")) != 1 || !p.router.settled.Load() {
		t.Fatal("no verdict said")
	}
	var calls atomic.Int64
	refusal := p.router.refusal
	p.router.refusal = func(j *codec.Job) error { calls.Add(1); return refusal(j) }
	const batches = 10 * settledPeriod
	for range batches {
		jobs := mixedBatch(t)
		if err := p.DecodeBatch(context.Background(), jobs); err != nil {
			t.Fatal(err)
		}
	}
	perBatch := int64(len(mixedBatch(t)))
	if n := calls.Load(); n == 0 || n > perBatch*batches/settledPeriod {
		t.Errorf("%d jobs classified in %d batches of %d, want 1 to %d", n, batches, perBatch, perBatch*batches/settledPeriod)
	}
	if p.router.asked.Load() || len(log.lines("too little of it")) != 1 {
		t.Error("the verdict changed, or was said again, on the same work")
	}
}

// On the blosc store, and on the mixed one with --gpu-trust-unchecked,
// every chunk is one a GPU may take: the busy CPU starts the GPU.
func TestAutoStartsWhenGPUMayTakeTheWork(t *testing.T) {
	for _, tc := range []struct {
		name       string
		unverified bool
		mk         func(testing.TB) []codec.Job
	}{
		{"blosc", false, bloscBatch},
		{"mixed, trusting unchecked", true, mixedBatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, made, log := gatedPipeline(t, tc.unverified)
			decodeUntilBusy(t, p, tc.mk)
			select {
			case <-p.ready:
			case <-time.After(10 * time.Second):
				t.Fatal("the GPUs did not start")
			}
			if !p.router.asked.Load() || len(*made) != 1 || !p.OnGPU() {
				t.Errorf("asked %v, %d GPUs opened", p.router.asked.Load(), len(*made))
			}
			if l := log.lines("too little of it"); len(l) != 0 {
				t.Errorf("said it would not start: %q", l)
			}
		})
	}
}

// A probe batch takes probeMax decoded bytes at most (its first job
// whatever its size); the rest of the batch decodes on the CPU beside it,
// every job right. So what the probes of a codec cost is bounded however
// large the batches: probeBatches times probeMax.
func TestAutoProbeBounded(t *testing.T) {
	p, g := autoPipeline(t, 1e4) // a host side that does not pay: declined after the probes
	calibrate(t, p)
	p.router.mu.Lock()
	p.router.probeMax = 3 * int64(len(sample))
	p.router.mu.Unlock()
	stop := saturate(t, p)
	defer stop()
	big := func() []codec.Job {
		jobs := make([]codec.Job, 20)
		for i := range jobs {
			jobs[i] = zstdJob(t)
		}
		return jobs
	}
	busyBatches(t, p, probeBatches+3, big)
	if n := g.decoded.Load(); n == 0 || n > probeBatches*3 {
		t.Errorf("the probes took %d jobs, want 1 to %d (%d batches of at most 3)", n, probeBatches*3, probeBatches)
	}
	if g.batches.Load() != probeBatches {
		t.Errorf("%d batches on the GPU, want %d probes", g.batches.Load(), probeBatches)
	}
	if r := routeOf(p, codec.Zstd); !strings.HasPrefix(r, "cpu") {
		t.Errorf("zstd after probes that do not pay: %s", r)
	}
}

// costlyGPU is the fake GPU with host costs its Costs do not report, a
// core's time per batch (the driver's threads, the copies' memory
// traffic): the per-codec rule keeps it, its host side looking free, but
// it takes the CPU the pool decodes with.
type costlyGPU struct {
	*fakeGPU
	spin time.Duration
}

func (s costlyGPU) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	for t0 := time.Now(); time.Since(t0) < s.spin; {
	}
	return s.fakeGPU.DecodeBatch(ctx, jobs)
}

// A GPU share that the per-codec host costs keep but that takes CPU they
// do not see makes the pipeline decode less than the CPU alone, as auto
// did on 4 cores of the mixed store. The rate guard sees it and turns the
// GPU off: later batches stay on the CPU.
func TestAutoStopsWhenRateLoses(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	opts.guardWindow = 40 * time.Millisecond
	buf := &syncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	newGPU := opts.newGPU
	opts.newGPU = func(o gpu.Options) (gpuDecoder, error) {
		g, err := newGPU(o)
		g.(*fakeGPU).hostNs = 0.0001
		return costlyGPU{g.(*fakeGPU), 30 * time.Millisecond}, err
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if on, _ := p.Ready(context.Background()); !on {
		t.Fatal("no GPU")
	}
	g := made[0]
	// Two fills, each a batch of two chunks at a time: together they keep
	// both workers busy, so the router gives a batch to the GPU.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var batches atomic.Int64
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				jobs := []codec.Job{sumJob(t), sumJob(t)}
				if err := p.DecodeBatch(context.Background(), jobs); err != nil {
					t.Error(err)
					return
				}
				checkJobs(t, jobs)
				batches.Add(1)
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(routeOf(p, codec.Zstd), "GPU is off") {
		if time.Now().After(deadline) {
			t.Fatalf("after %d batches, %d on the GPU: zstd %s", batches.Load(), g.batches.Load(), routeOf(p, codec.Zstd))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(buf.lines("decoded less with the GPU")) != 1 {
		t.Errorf("the log: %s", buf.String())
	}
	time.Sleep(100 * time.Millisecond) // a batch chosen before may finish
	onGPU, before := g.batches.Load(), batches.Load()
	for batches.Load() < before+50 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := g.batches.Load() - onGPU; n != 0 {
		t.Errorf("the GPU took %d batches after the guard turned it off", n)
	}
}

// The guard's verdicts, on windows of known rates: a GPU share at 0.9 of
// the CPU's rate loses, one at 1.0 or more keeps; the GPU is kept out for
// two windows every guardAB, the second measuring the CPU alone.
func TestRateGuard(t *testing.T) {
	t0 := time.Unix(0, 0)
	run := func(gpuRate float64) (verdicts []verdict, held int) {
		g := rateGuard{window: time.Second}
		now := t0
		g.tick(now)
		window := func(rate float64, onGPU bool) verdict {
			g.add(rate*float64(time.Second), onGPU)
			now = now.Add(time.Second)
			return g.tick(now)
		}
		for range 5 {
			window(4, false)
		}
		for range 3 * guardAB {
			if !g.gpuAllowed() {
				held++
				window(4, false)
				continue
			}
			if v := window(gpuRate, true); v != noVerdict {
				verdicts = append(verdicts, v)
			}
		}
		return verdicts, held
	}
	loses, held := run(3.6)
	if len(loses) == 0 || loses[0] != gpuLoses {
		t.Errorf("GPU at 0.9 of the CPU's rate: %v", loses)
	}
	if held < 2 {
		t.Errorf("the GPU was kept out of %d windows, want 2 every %d", held, guardAB)
	}
	for _, r := range []float64{4, 5} {
		if v, _ := run(r); len(v) == 0 || v[0] != gpuKeeps || v[len(v)-1] != gpuKeeps {
			t.Errorf("GPU at %.2f of the CPU's rate: %v", r/4, v)
		}
	}
	// A window without work is no CPU window: without one, no verdict.
	g := rateGuard{window: time.Second}
	g.tick(t0)
	g.tick(t0.Add(time.Second))
	for i := range judgeWindows + 1 {
		g.add(float64(time.Second), true)
		if v := g.tick(t0.Add(time.Duration(i+2) * time.Second)); v != noVerdict {
			t.Errorf("a verdict without a CPU window: %v", v)
		}
	}
}

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines returns the log lines holding sub.
func (s *syncBuffer) lines(sub string) []string {
	var out []string
	for _, l := range strings.Split(s.String(), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// With the GPU started (a status request asks, say) and paying, a busy
// mixed store's batches give it only the chunks it may take: the zstd
// frames without a checksum never reach it, not even to be refused.
func TestAutoSendsOnlyWhatGPUMayTake(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	opts.refusal = nil // gpu.Refusal itself
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if on, _ := p.Ready(context.Background()); !on {
		t.Fatal("no GPU")
	}
	made[0].hostNs = 0.0001
	full := &atomic.Bool{}
	fullOf[p] = full
	p.router.spare = func() int {
		if full.Load() {
			return 0
		}
		return p.onCPU.Spare()
	}
	calibrate(t, p)
	stop := saturate(t, p)
	defer stop()
	const n = 3 * probeBatches
	busyBatches(t, p, n, func() []codec.Job { return mixedBatch(t) })
	g := made[0]
	if d := g.decoded.Load(); d == 0 || d > n {
		t.Errorf("the GPU decoded %d chunks of %d batches holding one it may take each", d, n)
	}
	if r := routeOf(p, codec.Zstd); !strings.HasPrefix(r, "gpu") {
		t.Errorf("zstd: %s", r)
	}
}
