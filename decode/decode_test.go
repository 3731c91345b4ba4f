package decode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/internal/memory"
)

// fakeGPU stands in for one gpu.Decoder: it decodes zstd on the host,
// refuses other codecs (ErrUnsupported), fails whole batches while failing
// is set, lends memory it tracks, and can be held in DecodeBatch.
type fakeGPU struct {
	dev     int
	failing atomic.Bool
	hold    chan struct{} // when set, DecodeBatch waits on it
	batches atomic.Int64
	decoded atomic.Int64
	closed  atomic.Bool
	// closeHold, when set, keeps Close waiting until it is closed.
	closeHold chan struct{}
	// hostNs is the host time per decoded byte its Costs report; retired,
	// when set, is what Retired reports (and DecodeBatch then refuses
	// everything, as a retired gpu.Decoder does).
	hostNs  float64
	retired atomic.Pointer[error]

	mu    sync.Mutex
	lent  map[*byte]bool
	trims int // HostTrim calls on buffers it lent
	costs map[codec.Name]gpu.Cost
}

func (g *fakeGPU) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	g.batches.Add(1)
	if g.hold != nil {
		<-g.hold
	}
	if g.failing.Load() {
		return errors.New("fake device fault")
	}
	if p := g.retired.Load(); p != nil {
		for i := range jobs {
			jobs[i].Err = fmt.Errorf("%w: %w", codec.ErrUnsupported, *p)
		}
		return *p
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.costs == nil {
		g.costs = map[codec.Name]gpu.Cost{}
	}
	for i := range jobs {
		j := &jobs[i]
		c := g.costs[j.Codec]
		if j.Codec != codec.Zstd {
			j.Err = fmt.Errorf("%w: fake GPU has no %s", codec.ErrUnsupported, j.Codec)
			c.HostNanos += 1000 // reading the framing
			g.costs[j.Codec] = c
			continue
		}
		j.Err = codec.Decode(j.Codec, j.Dst, j.Src)
		g.decoded.Add(1)
		c.Chunks++
		c.Bytes += int64(len(j.Dst))
		c.HostNanos += int64(g.hostNs * float64(len(j.Dst)))
		g.costs[j.Codec] = c
	}
	return nil
}

func (g *fakeGPU) Costs() map[codec.Name]gpu.Cost {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[codec.Name]gpu.Cost{}
	for k, v := range g.costs {
		out[k] = v
	}
	return out
}

func (g *fakeGPU) Retired() error {
	if p := g.retired.Load(); p != nil {
		return *p
	}
	return nil
}

func (g *fakeGPU) TryHostAlloc(n int) []byte { return g.HostAlloc(n) }

func (g *fakeGPU) HostAlloc(n int) []byte {
	b := make([]byte, n)
	g.mu.Lock()
	g.lent[&b[:1][0]] = true
	g.mu.Unlock()
	return b
}

func (g *fakeGPU) HostFree(b []byte) {
	if cap(b) == 0 {
		return
	}
	g.mu.Lock()
	delete(g.lent, &b[:1][0])
	g.mu.Unlock()
}

// HostTrim keeps a buffer it lent to its first n bytes, recording it.
func (g *fakeGPU) HostTrim(b []byte, n int) []byte {
	if cap(b) == 0 {
		return b[:n]
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.lent[&b[:1][0]] {
		return b[:n]
	}
	g.trims++
	return b[:n:n]
}

// Retain reports a buffer it lent as held, without counting holds: the
// pipeline's tests give each back once.
func (g *fakeGPU) Retain(b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lent[&b[:1][0]]
}

func (g *fakeGPU) Close() error {
	if g.closeHold != nil {
		<-g.closeHold
	}
	g.closed.Store(true)
	return nil
}
func (g *fakeGPU) MemoryHeld() (int64, int64, int64) { return 1, 2, 3 }
func (g *fakeGPU) Pinned() gpu.Pinned                { return gpu.Pinned{Staging: 2, Pool: 3, Lent: 1, LentPeak: 3} }
func (g *fakeGPU) HostLent() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return int64(len(g.lent))
}
func (g *fakeGPU) Stats() gpu.Stats { return gpu.Stats{Chunks: g.decoded.Load()} }
func (g *fakeGPU) Info() gpu.Info {
	return gpu.Info{Available: true, Device: fmt.Sprintf("fake %d", g.dev)}
}

// fakes returns options whose GPUs are fakes, recorded in *made.
func fakes(mode Mode, devices int, made *[]*fakeGPU) Options {
	return Options{
		Mode:    mode,
		Workers: 2,
		newGPU: func(o gpu.Options) (gpuDecoder, error) {
			g := &fakeGPU{dev: o.Device, lent: map[*byte]bool{}}
			*made = append(*made, g)
			return g, nil
		},
		deviceCount: func() int { return devices },
		startAtOnce: true,
		refusal:     fakeRefusal,
	}
}

var sample = bytes.Repeat([]byte("zarrfs decode pipeline "), 2000)

func zstdJob(t testing.TB) codec.Job {
	e, _ := zstd.NewWriter(nil)
	defer e.Close()
	return codec.Job{Codec: codec.Zstd, Src: e.EncodeAll(sample, nil), Dst: make([]byte, len(sample))}
}

// lz4Job is a numcodecs LZ4 chunk holding the sample uncompressed (a
// literal-only block), which the fake GPU refuses.
func lz4Job() codec.Job {
	src := []byte{byte(len(sample)), byte(len(sample) >> 8), byte(len(sample) >> 16), byte(len(sample) >> 24)}
	n := len(sample)
	tok := []byte{0xF0}
	for r := n - 15; ; r -= 255 {
		if r < 255 {
			tok = append(tok, byte(r))
			break
		}
		tok = append(tok, 255)
	}
	src = append(src, tok...)
	src = append(src, sample...)
	return codec.Job{Codec: codec.LZ4, Src: src, Dst: make([]byte, len(sample))}
}

func checkJobs(t *testing.T, jobs []codec.Job) {
	t.Helper()
	for i, j := range jobs {
		if j.Err != nil || !bytes.Equal(j.Dst, sample) {
			t.Errorf("job %d (%s): %v", i, j.Codec, j.Err)
		}
	}
}

func TestCPUMode(t *testing.T) {
	var made []*fakeGPU
	p, err := New(fakes(CPU, 1, &made))
	if err != nil {
		t.Fatal(err)
	}
	jobs := []codec.Job{zstdJob(t), lz4Job()}
	if err := p.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, jobs)
	if onGPU, _ := p.Ready(context.Background()); onGPU || len(made) != 0 {
		t.Errorf("cpu mode opened %d GPUs", len(made))
	}
	if p.Memory() == nil || p.Placement() != "cpu (2 workers)" {
		t.Errorf("cpu mode: memory %v, placement %q", p.Memory(), p.Placement())
	}
	// The CPU decoder the device path's router asks says its workers.
	if w := codec.WorkersOf(p.CPU()); w != 2 {
		t.Errorf("the pipeline's CPU decoder says %d workers, want 2", w)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.DecodeBatch(context.Background(), jobs); !errors.Is(err, codec.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// GPU mode: what the GPU refuses, and whole batches it fails, decode on
// the CPU; the GPUs are closed with the pipeline.
func TestGPUModeFallback(t *testing.T) {
	var made []*fakeGPU
	p, err := New(fakes(GPU, 1, &made))
	if err != nil {
		t.Fatal(err)
	}
	jobs := []codec.Job{zstdJob(t), lz4Job(), zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, jobs)
	if got := made[0].decoded.Load(); got != 2 {
		t.Errorf("GPU decoded %d jobs, want the 2 zstd ones", got)
	}
	n := int64(len(sample))
	if d := p.Decoded(); d[Place{"zstd", "gpu"}] != (Count{2, 2 * n}) || d[Place{"lz4", "cpu"}] != (Count{1, n}) || len(d) != 2 {
		t.Errorf("Decoded %v", d)
	}
	made[0].failing.Store(true)
	jobs = []codec.Job{zstdJob(t), zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, jobs)
	if !bytes.Contains([]byte(p.Placement()), []byte("1 GPU (gpu)")) {
		t.Errorf("placement %q", p.Placement())
	}
	p.Close()
	if !made[0].closed.Load() {
		t.Error("Close left the GPU open")
	}
}

func TestGPUModeWithoutDevice(t *testing.T) {
	var made []*fakeGPU
	_, err := New(fakes(GPU, 0, &made))
	if !errors.Is(err, gpu.ErrNoGPU) {
		t.Errorf("gpu mode without a device: %v, want ErrNoGPU", err)
	}
	opts := fakes(GPU, 2, &made)
	opts.newGPU = func(o gpu.Options) (gpuDecoder, error) {
		if o.Device == 1 {
			return nil, fmt.Errorf("%w: device 1 broken", gpu.ErrNoGPU)
		}
		g := &fakeGPU{lent: map[*byte]bool{}}
		made = append(made, g)
		return g, nil
	}
	if _, err := New(opts); err == nil || !made[0].closed.Load() {
		t.Errorf("a failing second GPU: %v; first closed: %v", err, made[0].closed.Load())
	}
}

// Auto mode: a batch decodes on the CPU while the CPU is idle, on the
// GPU while another batch holds the CPU; without a GPU, all on the CPU.
func TestAutoMode(t *testing.T) {
	var made []*fakeGPU
	p, err := New(fakes(Auto, 1, &made))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if onGPU, err := p.Ready(context.Background()); !onGPU || err != nil {
		t.Fatalf("auto with a GPU: ready %v %v", onGPU, err)
	}
	jobs := []codec.Job{zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, jobs)
	if made[0].batches.Load() != 0 {
		t.Errorf("a lone batch went to the GPU")
	}
	// Hold the CPU with a slow batch: many jobs (one encoding, each its
	// own destination).
	one := zstdJob(t)
	var big []codec.Job
	for range 5000 {
		big = append(big, codec.Job{Codec: one.Codec, Src: one.Src, Dst: make([]byte, len(one.Dst))})
	}
	// On a loaded machine the slow batch may end before a small one is
	// routed: it is run again, a few times, before the test fails.
	for try := 0; made[0].batches.Load() == 0; try++ {
		if try == 5 {
			t.Fatal("no batch reached the GPU while the CPU was busy")
		}
		done := make(chan struct{})
		go func() { p.DecodeBatch(context.Background(), big); close(done) }()
	small:
		for made[0].batches.Load() == 0 {
			j := []codec.Job{zstdJob(t)}
			if err := p.DecodeBatch(context.Background(), j); err != nil {
				t.Fatal(err)
			}
			checkJobs(t, j)
			select {
			case <-done:
				break small
			default:
			}
		}
		<-done
		checkJobs(t, big)
	}

	var none []*fakeGPU
	q, err := New(fakes(Auto, 0, &none))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if onGPU, _ := q.Ready(context.Background()); onGPU {
		t.Error("auto without a GPU claims one")
	}
	if q.Memory() == nil {
		t.Error("auto mode lends no memory")
	}
}

// Memory lends the first GPU's memory once the GPUs are ready, and every
// buffer comes back to it.
func TestMemory(t *testing.T) {
	var made []*fakeGPU
	p, err := New(fakes(GPU, 2, &made))
	if err != nil {
		t.Fatal(err)
	}
	m := p.Memory()
	b := m.HostAlloc(1000)
	if len(made[0].lent) != 1 || len(made[1].lent) != 0 {
		t.Errorf("lent %d and %d buffers, want 1 from the first GPU", len(made[0].lent), len(made[1].lent))
	}
	// A trim goes to the GPU that lent the buffer; the arena's keep theirs.
	tr := m.(memory.Trimmer)
	if got := tr.HostTrim(b, 10); len(got) != 10 || cap(got) != 10 || made[0].trims != 1 || made[1].trims != 0 {
		t.Errorf("a trim of the first GPU's buffer: len %d cap %d, trims %d and %d", len(got), cap(got), made[0].trims, made[1].trims)
	}
	ab := p.Host().HostAlloc(4096)
	if got := tr.HostTrim(ab, 10); len(got) != 10 || cap(got) != cap(ab) || made[0].trims != 1 {
		t.Errorf("a trim of the arena's buffer: len %d cap %d (of %d)", len(got), cap(got), cap(ab))
	}
	p.Host().HostFree(ab)
	m.HostFree(b)
	if len(made[0].lent) != 0 {
		t.Error("buffer not given back")
	}
	// The host face lends the arena's memory, and holds and gives back
	// whatever the pipeline lent: the GPUs' pinned memory too, a ring's
	// on the second GPU included.
	h := p.Host()
	hb := h.HostAlloc(1 << 20)
	if len(made[0].lent)+len(made[1].lent) != 0 || !h.Retain(hb) {
		t.Error("the host face lent a GPU's memory, or does not hold its own")
	}
	h.HostFree(hb)
	h.HostFree(hb)
	for i, g := range made {
		pb := g.HostAlloc(100)
		if !h.Retain(pb) {
			t.Errorf("GPU %d's buffer not held", i)
		}
		h.HostFree(pb)
		if len(g.lent) != 0 {
			t.Errorf("GPU %d's buffer not given back", i)
		}
	}
	if h.Retain(make([]byte, 100)) {
		t.Error("held memory nobody lent")
	}
	p.Close()
	m.HostFree(m.HostAlloc(10)) // after Close: the arena's memory, unmapped
}

// Without a GPU the pipeline lends memory of its own, kept mapped and lent
// again: a buffer given back serves the next request of its class, memory
// it did not lend is ignored, and idle memory stays within IdleMemory.
func TestArena(t *testing.T) {
	p, err := New(Options{Mode: CPU, Workers: 1, IdleMemory: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m := p.Memory()
	b := m.HostAlloc(3 << 20)
	if len(b) != 3<<20 || cap(b) < 3<<20 || cap(b) > 3<<20+3<<17 {
		t.Fatalf("HostAlloc(3 MiB): len %d cap %d", len(b), cap(b))
	}
	for i := range b {
		b[i] = byte(i)
	}
	m.HostFree(b)
	c := m.HostAlloc(3<<20 - 1000) // same class
	if &c[0] != &b[0] {
		t.Error("a buffer of the same class was not lent again")
	}
	if c[12345] != byte(12345%256) {
		t.Error("the buffer lent again is not the same memory")
	}
	m.HostFree(make([]byte, 1<<20)) // not the arena's: ignored
	m.HostFree(c)
	m.HostFree(c) // twice: ignored
	var held [][]byte
	for range 4 {
		held = append(held, m.HostAlloc(3<<20))
	}
	for _, h := range held {
		m.HostFree(h)
	}
	if mapped, idle := p.arena.Held(); idle > 8<<20 || mapped != idle {
		t.Errorf("mapped %d, idle %d: want idle within 8 MiB, nothing lent", mapped, idle)
	}
	small := m.HostAlloc(100)
	if len(small) != 100 {
		t.Errorf("HostAlloc(100): len %d", len(small))
	}
	m.HostFree(small)
	p.Close()
	if mapped, idle := p.arena.Held(); mapped != 0 || idle != 0 {
		t.Errorf("after Close: mapped %d, idle %d", mapped, idle)
	}
}

// Two GPUs share concurrent batches.
func TestSpread(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(GPU, 2, &made)
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	hold := make(chan struct{})
	made[0].hold = hold
	made[1].hold = hold
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			j := []codec.Job{zstdJob(t)}
			p.DecodeBatch(context.Background(), j)
			checkJobs(t, j)
		})
	}
	for made[0].batches.Load()+made[1].batches.Load() < 4 {
		runtime.Gosched()
	}
	close(hold)
	wg.Wait()
	if made[0].batches.Load() != 2 || made[1].batches.Load() != 2 {
		t.Errorf("batches %d and %d, want 2 and 2", made[0].batches.Load(), made[1].batches.Load())
	}
}

func TestParse(t *testing.T) {
	for _, s := range []string{"", "auto", "cpu", "gpu"} {
		if _, err := ParseMode(s); err != nil {
			t.Errorf("ParseMode(%q): %v", s, err)
		}
	}
	if _, err := ParseMode("tpu"); err == nil {
		t.Error("ParseMode(tpu) accepted")
	}
	for in, want := range map[string]string{"": "[]", "all": "[]", "0": "[0]", "1, 0": "[1 0]"} {
		g, err := ParseGPUs(in)
		if err != nil || fmt.Sprint(g) != want {
			t.Errorf("ParseGPUs(%q) = %v, %v; want %s", in, g, err, want)
		}
	}
	for _, bad := range []string{"-1", "x", "0,0", "0,"} {
		if _, err := ParseGPUs(bad); err == nil {
			t.Errorf("ParseGPUs(%q) accepted", bad)
		}
	}
}

// The memory budgets become each GPU's bounds; too small a budget refuses
// --decode gpu and leaves auto on the CPU.
func TestBudgets(t *testing.T) {
	g, err := Options{GPUMemory: 1 << 30, PinnedMemory: 2 << 30}.gpuOptions()
	if err != nil {
		t.Fatal(err)
	}
	if g.DeviceBytes != 512<<20 || g.MaxBatchBytes != 256<<20 || g.Streams != 2 || g.HostBytes != 2<<30-288<<20 ||
		g.StagingBytes != 288<<20 || g.RoundBytes != 128<<20 {
		t.Errorf("defaults: %+v", g)
	}
	if g.StagingBytes+g.HostBytes != 2<<30 {
		t.Errorf("staging %d and lent %d exceed --pinned-memory", g.StagingBytes, g.HostBytes)
	}
	// A round closes at its share of the bound (nvCOMP takes about as long
	// for a small round as for a large one), not at gpu's 256 MiB default.
	if g, err := (Options{GPUMemory: 8 << 30, PinnedMemory: 8 << 30}).gpuOptions(); err != nil || g.Streams != 4 ||
		g.RoundBytes != g.MaxBatchBytes/4 || g.RoundBytes <= 256<<20 {
		t.Errorf("8 GiB: %+v, %v", g, err)
	}
	for _, o := range []Options{{GPUMemory: 600 << 20, PinnedMemory: 2 << 30}, {GPUMemory: 1 << 30, PinnedMemory: 300 << 20}} {
		if _, err := o.gpuOptions(); !errors.Is(err, gpu.ErrBudget) {
			t.Errorf("%+v: %v, want gpu.ErrBudget", o, err)
		}
	}
	var made []*fakeGPU
	opts := fakes(GPU, 1, &made)
	opts.GPUMemory = 600 << 20
	if _, err := New(opts); !errors.Is(err, gpu.ErrBudget) || len(made) != 0 {
		t.Errorf("gpu mode under budget: %v, %d GPUs opened", err, len(made))
	}
	opts.Mode = Auto
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if onGPU, _ := p.Ready(context.Background()); onGPU || len(made) != 0 {
		t.Errorf("auto under budget: on GPU %v, %d GPUs opened", onGPU, len(made))
	}
	var two []*fakeGPU
	q, _ := New(fakes(GPU, 2, &two))
	defer q.Close()
	if d, pin := q.MemoryHeld(); d != 2 || pin != 10 {
		t.Errorf("MemoryHeld over two GPUs: %d, %d", d, pin)
	}
}

// After the idle time the GPUs are given back; the next batch starts them
// again (before it runs, in GPU mode).
func TestSleepAndWake(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(GPU, 1, &made)
	opts.GPU.HostIdle = 30 * time.Millisecond
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	j := []codec.Job{zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	// The GPU that decoded the batch: on a loaded machine the one New
	// opened may have gone to sleep before the batch, which woke another.
	n := len(made)
	if made[n-1].decoded.Load() != 1 {
		t.Fatalf("the first batch: the newest of %d GPUs decoded %d chunks", n, made[n-1].decoded.Load())
	}
	deadline := time.Now().Add(5 * time.Second)
	for !made[n-1].closed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("idle GPUs not given back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d, pin := p.MemoryHeld(); d != 0 || pin != 0 {
		t.Errorf("asleep, the pipeline reports %d and %d bytes held", d, pin)
	}
	j = []codec.Job{zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, j)
	if len(made) != n+1 || made[n].decoded.Load() != 1 {
		t.Errorf("after waking: %d GPUs opened (%d before), the newest decoded %d", len(made), n, made[len(made)-1].decoded.Load())
	}
	if s := p.GPUStats(); s.Chunks != 2 {
		t.Errorf("GPUStats across a sleep: %d chunks, want 2", s.Chunks)
	}
}

// A GPU with pinned memory lent out does not go to sleep (closed, it would
// keep that memory mapped for good); once the memory is back it does. A
// batch after Close opens no GPU again.
func TestSleepWaitsForLentMemory(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(GPU, 1, &made)
	opts.GPU.HostIdle = 20 * time.Millisecond
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if on, err := p.Ready(context.Background()); !on || err != nil {
		t.Fatalf("Ready: %v %v", on, err)
	}
	mem := p.Memory()
	var b []byte
	var g *fakeGPU
	for try := 0; ; try++ {
		b = mem.HostAlloc(1 << 20)
		if g = made[len(made)-1]; g.HostLent() == 1 {
			break
		}
		// On a loaded machine the GPU may sleep before the buffer is
		// lent (then lent by the pipeline's own memory): a batch wakes it.
		mem.HostFree(b)
		if !g.closed.Load() || try == 10 {
			t.Fatalf("the pipeline's memory did not come from its GPU (%d lent)", g.HostLent())
		}
		if err := p.DecodeBatch(context.Background(), []codec.Job{zstdJob(t)}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if g.closed.Load() {
		t.Fatal("the GPU went to sleep with pinned memory lent out")
	}
	mem.HostFree(b)
	deadline := time.Now().Add(5 * time.Second)
	for !g.closed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("idle GPU not given back once its memory came back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Close()
	n := len(made)
	if err := p.DecodeBatch(context.Background(), []codec.Job{zstdJob(t)}); err == nil {
		t.Error("DecodeBatch after Close succeeded")
	}
	if len(made) != n {
		t.Errorf("a batch after Close opened %d GPUs again", len(made)-n)
	}
}

// GPUStatsByDevice keys each GPU's counts by its ordinal, and keeps them
// after the GPUs close.
func TestGPUStatsByDevice(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(GPU, 6, &made)
	opts.GPUs = []int{5, 2}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	j := []codec.Job{zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, j)
	want := map[int]gpu.Stats{5: {Chunks: 1}, 2: {}}
	if got := p.GPUStatsByDevice(); !reflect.DeepEqual(got, want) {
		t.Errorf("GPUStatsByDevice: %v, want %v", got, want)
	}
	p.Close()
	if got := p.GPUStatsByDevice(); !reflect.DeepEqual(got, want) {
		t.Errorf("GPUStatsByDevice after Close: %v, want %v", got, want)
	}
	if s := p.GPUStats(); s.Chunks != 1 {
		t.Errorf("GPUStats after Close: %d chunks, want 1", s.Chunks)
	}
}

// A wake that fails (the GPU's memory taken meanwhile) leaves the pipeline
// asleep, decoding on the CPU, and a later batch tries again.
func TestFailedWakeTriesAgain(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(GPU, 1, &made)
	opts.GPU.HostIdle = 30 * time.Millisecond
	var refuse atomic.Bool
	newGPU := opts.newGPU
	opts.newGPU = func(o gpu.Options) (gpuDecoder, error) {
		if refuse.Load() {
			return nil, errors.New("out of memory")
		}
		return newGPU(o)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.DecodeBatch(context.Background(), []codec.Job{zstdJob(t)}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !made[0].closed.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("idle GPUs not given back")
		}
	}
	refuse.Store(true)
	j := []codec.Job{zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, j)
	if !p.asleep.Load() || len(made) != 1 {
		t.Fatalf("after a failed wake: asleep %v, %d GPUs opened", p.asleep.Load(), len(made))
	}
	refuse.Store(false)
	p.retryWake.Store(0) // the retry time has passed
	j = []codec.Job{zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, j)
	if p.asleep.Load() || len(made) != 2 || made[1].decoded.Load() != 1 {
		t.Errorf("the next wake: asleep %v, %d GPUs opened", p.asleep.Load(), len(made))
	}
}

// A batch the GPU fails as a whole is decoded again on the CPU and counted
// there only.
func TestFailedBatchCountedOnce(t *testing.T) {
	var made []*fakeGPU
	p, err := New(fakes(GPU, 1, &made))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	made[0].failing.Store(true)
	j := []codec.Job{zstdJob(t), zstdJob(t)}
	if err := p.DecodeBatch(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	checkJobs(t, j)
	want := Decoded{{"zstd", "cpu"}: {Chunks: 2, Bytes: int64(2 * len(sample))}}
	if got := p.Decoded(); !reflect.DeepEqual(got, want) {
		t.Errorf("Decoded: %v, want %v", got, want)
	}
}

// While the GPUs are being closed for a sleep, their counts still count:
// the metrics built on them never go backwards.
func TestStatsWhileClosing(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(GPU, 1, &made)
	opts.GPU.HostIdle = 50 * time.Millisecond
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	made[0].closeHold = release
	if err := p.DecodeBatch(context.Background(), []codec.Job{zstdJob(t)}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !p.asleep.Load(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the GPUs did not start to sleep")
		}
	}
	if s := p.GPUStats(); s.Chunks != 1 {
		t.Errorf("GPUStats while the GPU closes: %d chunks, want 1", s.Chunks)
	}
	close(release)
	for deadline := time.Now().Add(5 * time.Second); !made[0].closed.Load(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the GPU did not close")
		}
	}
	if s := p.GPUStats(); s.Chunks != 1 {
		t.Errorf("GPUStats after the GPU closed: %d chunks, want 1", s.Chunks)
	}
}

// In Auto mode the GPUs start only once the CPU pool has been busy with no
// spare worker for GPUStartAfter, or when Ready asks: a command the CPU
// keeps up with never pays for CUDA's start.
func TestAutoStartsGPUsWhenBusy(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	opts.startAtOnce = false
	opts.GPUStartAfter = 50 * time.Millisecond
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for range 20 {
		j := []codec.Job{zstdJob(t)}
		if err := p.DecodeBatch(context.Background(), j); err != nil {
			t.Fatal(err)
		}
		checkJobs(t, j)
	}
	if startedWithin(p, 50*time.Millisecond) {
		t.Fatal("the GPUs started while the CPU had spare workers")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				p.DecodeBatch(context.Background(), []codec.Job{zstdJob(t), zstdJob(t), zstdJob(t)})
			}
		})
	}
	started := startedWithin(p, 10*time.Second)
	close(stop)
	wg.Wait()
	if !started {
		t.Fatal("the GPUs did not start under a CPU pool kept full")
	}
	if onGPU, err := p.Ready(context.Background()); err != nil || !onGPU {
		t.Fatalf("Ready: %v %v, want the GPU", onGPU, err)
	}
}

// startedWithin reports whether p's GPUs have started (or failed to)
// within d, without starting them as Ready would: the fakes start at once.
func startedWithin(p *Pipeline, d time.Duration) bool {
	select {
	case <-p.ready:
		return true
	case <-time.After(d):
		return false
	}
}

// Ready starts the GPUs of an Auto pipeline that has not started them.
func TestAutoReadyStarts(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	opts.startAtOnce = false
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if onGPU, err := p.Ready(context.Background()); err != nil || !onGPU || len(made) != 1 {
		t.Fatalf("Ready: %v %v, %d GPUs opened", onGPU, err, len(made))
	}
}

// An Auto pipeline closed before its GPUs started closes at once.
func TestAutoCloseNeverStarted(t *testing.T) {
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	opts.startAtOnce = false
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for GPUs that never started")
	}
	if len(made) != 0 {
		t.Fatal("Close started the GPUs")
	}
}
