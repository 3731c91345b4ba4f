package decode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
)

// These tests run auto mode's router (route.go) over the fake GPU of
// decode_test.go, whose Costs report a host time per byte the test sets:
// what the router sends where, what it learns, and what memory the
// pipeline lends meanwhile.

// autoPipeline is an Auto pipeline of two CPU workers and one fake GPU
// whose GPU path costs hostNs host nanoseconds per decoded byte.
func autoPipeline(t *testing.T, hostNs float64) (*Pipeline, *fakeGPU) {
	t.Helper()
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	newGPU := opts.newGPU
	opts.newGPU = func(o gpu.Options) (gpuDecoder, error) {
		if !o.HostOnDemand {
			t.Error("auto mode's GPU registers pinned memory before it takes work")
		}
		g, err := newGPU(o)
		g.(*fakeGPU).hostNs = hostNs
		return g, err
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	// The pool's workers are all taken whenever the test says so (saturate),
	// not only while the other readers' batches happen to keep them.
	full := &atomic.Bool{}
	fullOf[p] = full
	p.router.spare = func() int {
		if full.Load() {
			return 0
		}
		return p.onCPU.Spare()
	}
	if on, err := p.Ready(context.Background()); !on || err != nil {
		t.Fatalf("Ready: %v %v", on, err)
	}
	return p, made[0]
}

// fullOf holds, per pipeline of autoPipeline, whether its pool counts as
// full.
var fullOf = map[*Pipeline]*atomic.Bool{}

// saturate keeps the CPU pool's workers all taken, as other readers' batches
// do (through the router's CPU side, which counts their bytes in flight),
// until the returned function is called.
func saturate(t *testing.T, p *Pipeline) (stop func()) {
	one := zstdJob(t)
	done := make(chan struct{})
	var wg sync.WaitGroup
	// Three loops, so that the pool seldom runs dry between two batches.
	for range 3 {
		big := make([]codec.Job, 500)
		for i := range big {
			big[i] = codec.Job{Codec: one.Codec, Src: one.Src, Dst: make([]byte, len(one.Dst))}
		}
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				p.router.onCPU(context.Background(), big, false)
			}
		})
	}
	for p.onCPU.Spare() > 0 {
		time.Sleep(time.Millisecond)
	}
	fullOf[p].Store(true)
	return func() { fullOf[p].Store(false); close(done); wg.Wait() }
}

// calibrate has the CPU decode lone batches (the pool idle) until the
// router has sampled zstd's cost on a core.
func calibrate(t *testing.T, p *Pipeline) {
	t.Helper()
	for range 2 * firstSamples {
		j := []codec.Job{zstdJob(t)}
		if err := p.DecodeBatch(context.Background(), j); err != nil {
			t.Fatal(err)
		}
		checkJobs(t, j)
	}
	p.router.mu.Lock()
	defer p.router.mu.Unlock()
	if rt := p.router.codecs[codec.Zstd]; rt == nil || rt.cpuSamples == 0 || rt.cpuNs <= 0 {
		t.Fatalf("no sample of the CPU's cost after %d lone batches", 2*firstSamples)
	}
}

// busyBatches sends n one-job batches of mk while the pool is full.
func busyBatches(t *testing.T, p *Pipeline, n int, mk func() []codec.Job) {
	t.Helper()
	for range n {
		j := mk()
		if err := p.DecodeBatch(context.Background(), j); err != nil {
			t.Fatal(err)
		}
		checkJobs(t, j)
	}
}

func routeOf(p *Pipeline, c codec.Name) string { return p.Routes()[string(c)] }

// A GPU whose host side costs far less than the CPU's decoding takes a
// codec once probed, and only then does the pipeline lend its memory.
func TestAutoKeepsGPUThatPays(t *testing.T) {
	p, g := autoPipeline(t, 0.0001)
	calibrate(t, p)
	if g.batches.Load() != 0 {
		t.Fatal("a batch went to the GPU while the CPU had room")
	}
	m := p.Memory()
	b := m.HostAlloc(1 << 20)
	if g.HostLent() != 0 {
		t.Fatal("the GPU's pinned memory was lent before the GPU took any work")
	}
	m.HostFree(b)
	stop := saturate(t, p)
	defer stop()
	busyBatches(t, p, probeBatches+6, func() []codec.Job { return []codec.Job{zstdJob(t)} })
	if r := routeOf(p, codec.Zstd); !strings.HasPrefix(r, "gpu") {
		t.Fatalf("zstd: %s, want the GPU", r)
	}
	if g.batches.Load() <= probeBatches {
		t.Errorf("%d batches on the GPU: it took none after its probes", g.batches.Load())
	}
	// Auto lends no pinned memory even then (lender).
	b = m.HostAlloc(1 << 20)
	if g.HostLent() != 0 {
		t.Error("auto mode lent the GPU's pinned memory")
	}
	m.HostFree(b)
}

// A GPU whose host side costs as much as decoding on the CPU is probed,
// then declined: later batches stay on the CPU however busy it is, the
// arena lends again, and the codec is probed again after the backoff.
func TestAutoDeclinesGPUThatDoesNotPay(t *testing.T) {
	p, g := autoPipeline(t, 1e4)
	calibrate(t, p)
	stop := saturate(t, p)
	defer stop()
	busyBatches(t, p, probeBatches+2, func() []codec.Job { return []codec.Job{zstdJob(t)} })
	if r := routeOf(p, codec.Zstd); !strings.HasPrefix(r, "cpu") {
		t.Fatalf("zstd: %s, want the CPU", r)
	}
	probed := g.batches.Load()
	if probed != probeBatches {
		t.Errorf("%d batches on the GPU, want the %d probes", probed, probeBatches)
	}
	busyBatches(t, p, 20, func() []codec.Job { return []codec.Job{zstdJob(t)} })
	if g.batches.Load() != probed {
		t.Errorf("a declined GPU took %d more batches", g.batches.Load()-probed)
	}
	b := p.Memory().HostAlloc(1 << 20)
	if g.HostLent() != 0 {
		t.Error("a declined GPU's pinned memory is still lent")
	}
	p.Memory().HostFree(b)
	// After the backoff the codec is probed again, and declined again for
	// twice as long.
	later := time.Now().Add(firstBackoff + time.Second)
	p.router.mu.Lock()
	p.router.now = func() time.Time { return later }
	p.router.mu.Unlock()
	busyBatches(t, p, probeBatches+2, func() []codec.Job { return []codec.Job{zstdJob(t)} })
	if n := g.batches.Load() - probed; n != probeBatches {
		t.Errorf("after the backoff the GPU took %d batches, want %d probes", n, probeBatches)
	}
	p.router.mu.Lock()
	rt := p.router.codecs[codec.Zstd]
	if rt.state != declined || rt.backoff != 2*firstBackoff {
		t.Errorf("after the second probe: state %d, backoff %v", rt.state, rt.backoff)
	}
	p.router.mu.Unlock()
}

// A busy pool's mixed batch is split by codec: the codec the GPU decodes
// well goes there, the one it refuses (its host time buys nothing) is
// declined and stays on the CPU; every job decodes right.
func TestAutoSplitsByCodec(t *testing.T) {
	p, g := autoPipeline(t, 0.0001)
	calibrate(t, p)
	stop := saturate(t, p)
	defer stop()
	mixed := func() []codec.Job { return []codec.Job{zstdJob(t), lz4Job(), zstdJob(t), lz4Job()} }
	busyBatches(t, p, probeBatches+4, mixed)
	if r := routeOf(p, codec.Zstd); !strings.HasPrefix(r, "gpu") {
		t.Errorf("zstd: %s, want the GPU", r)
	}
	if r := routeOf(p, codec.LZ4); !strings.HasPrefix(r, "cpu") {
		t.Errorf("lz4 (which the GPU refuses): %s, want the CPU", r)
	}
	before := g.batches.Load()
	refusedBefore := g.Costs()[codec.LZ4].HostNanos
	busyBatches(t, p, 4, mixed)
	if g.batches.Load() == before {
		t.Error("zstd no longer reaches the GPU")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.costs[codec.LZ4].HostNanos != refusedBefore {
		t.Error("declined lz4 jobs still reach the GPU")
	}
}

// A GPU retired for the process (a round that never finished) takes no
// work, lends no memory, and is not opened again after a sleep.
func TestAutoRetiredGPU(t *testing.T) {
	p, g := autoPipeline(t, 0.0001)
	calibrate(t, p)
	hung := errors.Join(gpu.ErrHung, errors.New("round of 3 chunks"))
	g.retired.Store(&hung)
	if p.OnGPU() {
		t.Error("OnGPU with the only GPU retired")
	}
	stop := saturate(t, p)
	busyBatches(t, p, 10, func() []codec.Job { return []codec.Job{zstdJob(t)} })
	stop()
	if g.batches.Load() != 0 {
		t.Errorf("a retired GPU was given %d batches", g.batches.Load())
	}
	b := p.Memory().HostAlloc(1 << 20)
	if g.HostLent() != 0 {
		t.Error("a retired GPU's memory was lent")
	}
	p.Memory().HostFree(b)
	p.mu.Lock()
	p.retireLocked([]gpuDecoder{g}, []int{0})
	p.mu.Unlock()
	if err := p.openGPUs(); !errors.Is(err, gpu.ErrNoGPU) {
		t.Errorf("opening the GPUs again with the only one retired: %v", err)
	}
}

// CloseForExit waits neither for a GPU still starting nor for the
// teardown of one started.
func TestCloseForExit(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	starting := make(chan struct{})
	newGPU := opts.newGPU
	opts.newGPU = func(o gpu.Options) (gpuDecoder, error) {
		<-starting // CUDA taking its time
		return newGPU(o)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	j := []codec.Job{zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, j)
	done := make(chan error, 1)
	go func() { done <- p.CloseForExit() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("CloseForExit waits for a GPU still starting")
	}
	if err := p.DecodeBatch(context.Background(), j); !errors.Is(err, codec.ErrClosed) {
		t.Errorf("after CloseForExit: %v, want ErrClosed", err)
	}
	close(starting)
	<-p.ready
	if len(made) == 1 && made[0].closed.Load() {
		t.Error("the GPU that finished starting after CloseForExit was torn down")
	}

	q, g := autoPipeline(t, 0)
	g.closeHold = make(chan struct{}) // a teardown that takes long
	defer close(g.closeHold)
	go func() { done <- q.CloseForExit() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("CloseForExit waits for a started GPU's teardown")
	}
}

// OnGPU says no while the GPU is still starting, and does not wait for it.
func TestOnGPUDoesNotWait(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	starting := make(chan struct{})
	newGPU := opts.newGPU
	opts.newGPU = func(o gpu.Options) (gpuDecoder, error) {
		<-starting
		return newGPU(o)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	defer close(starting)
	if p.OnGPU() {
		t.Error("OnGPU before the GPU started")
	}
}

// In GPU mode the lender lends the GPU's pinned memory, and none of a GPU
// retired for the process: its buffers come from the arena.
func TestGPUModeRetiredGPULendsNothing(t *testing.T) {
	var made []*fakeGPU
	p, err := New(fakes(GPU, 1, &made))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	g := made[0]
	b := p.Memory().HostAlloc(1 << 20)
	if g.HostLent() != 1 {
		t.Fatalf("GPU mode: %d buffers of the GPU's lent, want 1", g.HostLent())
	}
	p.Memory().HostFree(b)
	hung := errors.Join(gpu.ErrHung, errors.New("round of 3 chunks"))
	g.retired.Store(&hung)
	b = p.Memory().HostAlloc(1 << 20)
	if g.HostLent() != 0 {
		t.Error("a retired GPU's memory was lent")
	}
	p.Memory().HostFree(b)
}

// fakeRefusal is gpu.Refusal for the fake GPU, which decodes zstd alone.
func fakeRefusal(j *codec.Job) error {
	if j.Codec != codec.Zstd {
		return fmt.Errorf("fake GPU has no %s: %w", j.Codec, codec.ErrUnsupported)
	}
	return nil
}
