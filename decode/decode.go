// Package decode is zarrfs's one decoding pipeline: where chunks are
// decompressed (a pool of CPU workers, and the GPUs when nvCOMP loads),
// chosen from --decode and --gpus, built in one place and closed in one
// place. Every command that decodes builds one Pipeline per process and
// hands it to zarr (which decodes with it and reads compressed chunks into
// the memory it lends) and through zarr to the layout.
//
// The pipeline has one CPU worker budget, whatever the mode: the pool that
// decodes in "cpu" and "auto" mode is the same pool that takes the chunks a
// GPU refuses or cannot decode (a codec it lacks, a chunk too large, a
// device fault), so the CPU is never oversubscribed by a second pool. GPU
// to CPU fallback is one decorator (fallback) around the GPUs.
//
// In "auto" mode a batch goes to the CPU pool while it has a spare worker;
// once it has none, the jobs a GPU may take (gpu.Refusal) go to the GPUs
// only where they were measured to pay, freeing more CPU than their host
// side takes, and only while the pipeline decodes no less with them than
// with the CPU alone (router, route.go; rateGuard, routeguard.go): auto aims never
// to be slower than the CPU alone, and a GPU that does not pay ends up
// taking nothing. The GPUs start in the background, and only once the
// CPU has been busy on chunks they may take (GPUStartAfter): until they
// are ready, everything decodes on the CPU, so a mount is live before
// CUDA has initialised; auto mode registers and lends none of their
// pinned memory (the GPU stages what it decodes); and a process about to
// exit does not wait for their teardown (CloseForExit).
//
// Concurrency: a Pipeline is safe for concurrent use; Close waits for the
// batches in flight.
package decode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/internal/memory"
)

// Mode is where chunks are decoded.
type Mode string

const (
	// Auto decodes on the CPU and, when the CUDA driver and nvCOMP load,
	// on the GPUs too.
	Auto Mode = "auto"
	// CPU never touches a GPU.
	CPU Mode = "cpu"
	// GPU refuses to start without a usable GPU and decodes there all it
	// can; what a GPU cannot decode goes to the CPU.
	GPU Mode = "gpu"
)

// ParseMode reads a --decode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Auto, CPU, GPU:
		return m, nil
	case "":
		return Auto, nil
	}
	return "", fmt.Errorf("%q: want auto, cpu or gpu", s)
}

// ParseGPUs reads a --gpus value: "all" (or empty) for every visible
// device, else a comma-separated list of device ordinals.
func ParseGPUs(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return nil, nil
	}
	var out []int
	seen := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want all or device numbers such as 0,1", s)
		}
		if seen[n] {
			return nil, fmt.Errorf("%q: device %d named twice", s, n)
		}
		seen[n] = true
		out = append(out, n)
	}
	return out, nil
}

// Options configure New. The zero value decodes in Auto mode with one CPU
// worker per CPU and every visible GPU.
type Options struct {
	// Mode is where chunks decode. Empty means Auto.
	Mode Mode
	// Workers is the number of CPU decoding goroutines, the pipeline's one
	// CPU budget. Zero means runtime.NumCPU().
	Workers int
	// GPUs lists the device ordinals to decode on. Nil means every device
	// the driver sees.
	GPUs []int
	// GPUMemory bounds the device memory decoding takes on each GPU, the
	// CUDA context included (an estimate of ContextBytes is set aside for
	// it). Zero means DefaultGPUMemory.
	GPUMemory int64
	// PinnedMemory bounds the pinned host memory of each GPU: its rounds'
	// staging and the memory it lends. Zero follows GPUMemory: the staging
	// its rounds take plus DefaultLentMemory (DefaultPinnedMemory at the
	// default GPUMemory), so that one number sizes GPU decoding.
	PinnedMemory int64
	// GPUStartAfter is, in Auto mode, how long the CPU pool must have been
	// decoding chunks a GPU may take (gpu.Refusal) with every worker (its
	// workers' decoding time on them, summed, over their number) before
	// the GPUs start: starting CUDA and nvCOMP costs CPU and memory that a
	// short command (a warm of a few seconds) never wins back, so a
	// pipeline that the CPU keeps up with never starts them, nor one whose
	// chunks the GPU may mostly not take (router). Zero means
	// DefaultGPUStartAfter.
	GPUStartAfter time.Duration
	// IdleMemory bounds the host memory the pipeline keeps mapped, idle,
	// for the next buffers it lends (Memory): compressed chunks and
	// samples are lent again rather than faulted in afresh. Zero means
	// DefaultIdleMemory.
	IdleMemory int64
	// GPU configures each GPU decoder; its Device, Logger and memory
	// bounds are set from the fields above.
	GPU gpu.Options
	// Logger receives the placement line and fallback warnings. Nil
	// discards.
	Logger *slog.Logger

	// newGPU opens one device; tests stand in for it. Nil means gpu.New.
	newGPU func(gpu.Options) (gpuDecoder, error)
	// deviceCount reports the devices the driver sees; tests stand in.
	// noDevice says why there are none (no driver library, no device),
	// "" when it does not know.
	deviceCount func() int
	noDevice    func() string
	// startAtOnce starts the GPUs in Auto mode at New, as tests of the
	// routing want.
	startAtOnce bool
	// refusal stands in for gpu.Refusal (tests whose fake GPU refuses
	// other chunks); guardWindow for the rate guard's window.
	refusal     func(*codec.Job) error
	guardWindow time.Duration
}

// gpuDecoder is what the pipeline needs of one GPU: *gpu.Decoder.
type gpuDecoder interface {
	codec.BatchDecoder
	codec.HostMemory
	memory.Trimmer
	TryHostAlloc(n int) []byte
	Close() error
	Info() gpu.Info
	MemoryHeld() (device, staging, lent int64)
	Pinned() gpu.Pinned
	HostLent() int64
	Stats() gpu.Stats
	Costs() map[codec.Name]gpu.Cost
	Retired() error
}

// GPUDeflate is whether the GPUs decode gzip, zlib and blosc-zlib chunks
// (gpu.Options.Deflate; the host checks their checksums). Off: measured
// against the CPU by gpu's TestThroughputSummary (its deflate row), and
// nvCOMP's deflate decoder needs the fence against its overruns. Turn it on
// when that row shows the GPU at 1x the CPU's cores or more with the host's
// checksums, and the damaged-chunk suite passes with Deflate on.
const GPUDeflate = false

// Memory defaults and floors (see Options).
const (
	DefaultGPUMemory    = 1 << 30
	DefaultPinnedMemory = 2 << 30
	// DefaultLentMemory is the pinned memory lent to fills when
	// PinnedMemory follows GPUMemory: what DefaultPinnedMemory leaves
	// after the staging of DefaultGPUMemory's rounds.
	DefaultLentMemory = DefaultPinnedMemory - (DefaultGPUMemory-ContextBytes)/2*9/8
	DefaultIdleMemory = 1 << 30
	// DefaultGPUStartAfter: a warm of a few seconds in auto mode, started
	// with the GPU at once, ran measurably slower than cpu even with the
	// GPU declined for every codec, the cost being CUDA's start beside so
	// short a fill (BENCHMARKS.md, tuning choices).
	DefaultGPUStartAfter = 2 * time.Second
	// ContextBytes is what a CUDA context with nvCOMP and our kernels
	// takes on the device, set aside from GPUMemory (about 500 MiB on an
	// H200 with CUDA 13).
	ContextBytes = 512 << 20
	// minRoundBytes is the least device (and staging) memory decoding
	// needs: two rounds of 64 MiB.
	minRoundBytes = 128 << 20
	// minLentBytes is the least pinned memory worth lending.
	minLentBytes = 64 << 20
)

// gpuOptions derives each GPU decoder's bounds from the budgets: the rounds
// take half the device memory left after the context (the rest is
// nvCOMP's scratch and allocation slack), at least two rounds in flight
// and at most four, each closing only at its share; pinned staging as
// much as the rounds; the rest of the pinned budget is lent. A budget too
// small for GPU decoding is a budgetError naming the flag to change.
func (o Options) gpuOptions() (gpu.Options, error) {
	g := o.GPU
	dev := o.GPUMemory - ContextBytes
	// Half for the rounds' input and output, half for nvCOMP's scratch and
	// the buffers' slack.
	batch := dev / 2
	if batch < minRoundBytes {
		return g, budgetError(fmt.Sprintf("--gpu-memory %s: too small for GPU decoding: it leaves %s after the CUDA context; give at least %s",
			size(o.GPUMemory), size(max(dev, 0)), size(ContextBytes+minRoundBytes*2)))
	}
	// The staging holds a round's input and output, and an eighth more for
	// the pieces that must be realigned.
	staging := batch + batch/8
	pinned := o.PinnedMemory
	if pinned == 0 {
		pinned = staging + DefaultLentMemory
	}
	lent := pinned - staging
	if lent < minLentBytes {
		return g, budgetError(fmt.Sprintf("--pinned-memory %s: too small for GPU decoding with --gpu-memory %s: its rounds stage %s of it; give at least %s, or leave --pinned-memory out (it follows --gpu-memory)",
			size(pinned), size(o.GPUMemory), size(staging), size(staging+minLentBytes)))
	}
	g.DeviceBytes, g.MaxBatchBytes = dev, batch
	g.Streams = int(min(max(batch/(256<<20), 2), 4))
	// A round closes at its share of the bound, not earlier: nvCOMP takes
	// about as long for a round of one sample's chunks as for one of ten
	// samples', and the other sets' rounds do not decode beside it (both
	// measured in BENCHMARKS.md), so a round cut short holds the GPU to a
	// fraction of its rate.
	g.RoundBytes = batch / int64(g.Streams)
	g.StagingBytes, g.HostBytes = staging, lent
	g.Deflate = g.Deflate || GPUDeflate
	// LZ4 blocks walked on the GPU instead of the host: an experiment,
	// built in with -tags gpuwalk, off until a fill on a few cores shows
	// it paying (gpu.Options).
	g.WalkOnDevice = g.WalkOnDevice || walkOnDevice
	if o.Mode == Auto {
		// Auto lends no pinned memory (lender): none is registered.
		g.HostOnDemand = true
	}
	return g, nil
}

// budgetError is a memory bound too small for GPU decoding, in one line
// that names the flag to change; it wraps gpu.ErrBudget.
type budgetError string

func (e budgetError) Error() string { return string(e) }
func (e budgetError) Unwrap() error { return gpu.ErrBudget }

func size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dB", n)
}

// Pipeline decodes batches of chunks where Options say. It implements
// codec.BatchDecoder.
type Pipeline struct {
	opts  Options
	log   *slog.Logger
	cpu   *codec.CPU
	arena *memory.Arena // the host memory lent without a GPU

	// route is what DecodeBatch runs: the CPU pool until the GPUs are
	// ready, then the mode's composition.
	route atomic.Pointer[routed]
	ready chan struct{} // closed once the GPUs are started (or failed to)
	// startOnce starts the GPUs, or closes ready without starting them:
	// at New in CPU and GPU mode, once in Auto mode (beginStart), and at
	// Close for an Auto pipeline that never started them.
	startOnce sync.Once

	mu      sync.Mutex
	gpus    []gpuDecoder
	devices []int // the ordinal of each of gpus
	closed  bool
	started bool
	woke    bool // the GPUs were started again after sleeping

	// retired sums, by ordinal, the Stats of GPUs closed while asleep;
	// closing are the GPUs being closed now (counted until retired).
	retired        map[int]gpu.Stats
	closing        []gpuDecoder
	closingDevices []int

	// onCPU is the CPU pool, counted; decoded holds the counts of every
	// device, guarded by countMu.
	onCPU   *counter
	countMu sync.Mutex
	decoded Decoded

	// router chooses between the CPU and the GPUs in Auto mode.
	router *router
	// retiredDevs are the GPUs retired for the process (gpu.Decoder's
	// Retired): not opened again.
	retiredDevs map[int]error
	exiting     bool

	// Idle sleep (sleepWhenIdle, wake).
	active  atomic.Int64 // batches in DecodeBatch
	lastUse atomic.Int64 // UnixNano of the last batch
	asleep  atomic.Bool
	// retryWake is the UnixNano before which a wake that failed is not
	// tried again.
	retryWake atomic.Int64
	wakeMu    sync.Mutex

	fellBack sync.Once

	// rings counts delivery's rings and their requests (GPUFor): the GPUs
	// stay awake while any is open.
	rings atomic.Int64
}

type routed struct{ codec.BatchDecoder }

var _ codec.BatchDecoder = (*Pipeline)(nil)

// New builds the pipeline. In GPU mode it opens the GPUs before it
// returns and fails (the error wraps gpu.ErrNoGPU) when none is usable; in
// Auto mode it returns at once, decoding on the CPU, and starts the GPUs in
// the background; a machine without them stays on the CPU, said in one
// debug line.
func New(opts Options) (*Pipeline, error) {
	if opts.Mode == "" {
		opts.Mode = Auto
	}
	if _, err := ParseMode(string(opts.Mode)); err != nil {
		return nil, fmt.Errorf("decode: mode %w", err)
	}
	if opts.Workers < 0 {
		return nil, fmt.Errorf("decode: %d workers: want 0 (one per CPU) or more", opts.Workers)
	}
	if opts.GPU.HostIdle < 0 {
		return nil, fmt.Errorf("decode: GPU.HostIdle %v: want 0 (the default) or more", opts.GPU.HostIdle)
	}
	if opts.Workers == 0 {
		opts.Workers = runtime.NumCPU()
	}
	if opts.IdleMemory < 0 {
		return nil, fmt.Errorf("decode: idle memory %d: want 0 (the default) or more", opts.IdleMemory)
	}
	if opts.IdleMemory == 0 {
		opts.IdleMemory = DefaultIdleMemory
	}
	if opts.GPUStartAfter < 0 {
		return nil, fmt.Errorf("decode: GPU start after %v: want 0 (the default, %v) or more", opts.GPUStartAfter, DefaultGPUStartAfter)
	}
	if opts.GPUStartAfter == 0 {
		opts.GPUStartAfter = DefaultGPUStartAfter
	}
	if opts.GPUMemory == 0 {
		opts.GPUMemory = DefaultGPUMemory
	}
	gopts, budgetErr := opts.gpuOptions()
	if opts.PinnedMemory == 0 {
		// It follows GPUMemory (gpuOptions); said in the start-up line.
		opts.PinnedMemory = cmp.Or(gopts.StagingBytes+gopts.HostBytes, DefaultPinnedMemory)
	}
	if opts.newGPU == nil {
		opts.newGPU = func(o gpu.Options) (gpuDecoder, error) { return gpu.New(o) }
	}
	if opts.deviceCount == nil {
		opts.deviceCount = func() int { return gpu.Probe(opts.GPU.Libraries).DeviceCount }
		opts.noDevice = func() string {
			return strings.TrimPrefix(gpu.Probe(opts.GPU.Libraries).Reason, gpu.ErrNoGPU.Error()+": ")
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cpu, err := codec.NewCPU(codec.Options{Workers: opts.Workers})
	if err != nil {
		return nil, err
	}
	p := &Pipeline{opts: opts, log: log, cpu: cpu, ready: make(chan struct{}),
		decoded: Decoded{}, arena: memory.NewArena(opts.IdleMemory)}
	p.onCPU = &counter{inner: p.cpu, device: "cpu", mu: &p.countMu, into: p.decoded}
	p.route.Store(&routed{p.onCPU})
	opts.GPU = gopts
	p.opts.GPU = gopts
	if opts.refusal == nil {
		opts.refusal = func(j *codec.Job) error { return gpu.Refusal(j, gopts) }
	}
	p.router = &router{cpu: p.onCPU, spare: p.onCPU.Spare, inline: &counter{inner: codec.Inline{}, device: "cpu", mu: &p.countMu, into: p.decoded},
		workers: opts.Workers, costs: p.gpuCosts, usable: p.gpuUsable, refusal: opts.refusal,
		busy: p.cpu.Busy, after: opts.GPUStartAfter, start: p.beginStart, probeMax: probeBytes, now: time.Now, log: log,
		codecs: map[codec.Name]*route{}, guard: rateGuard{window: cmp.Or(opts.guardWindow, guardWindow)}}
	switch {
	case opts.Mode == GPU && budgetErr != nil:
		p.cpu.Close()
		return nil, budgetErr
	case opts.Mode == Auto && budgetErr != nil:
		p.startOnce.Do(func() { close(p.ready) }) // nothing to start
		// Said once, at start, as a warning: the user gave a bound the GPU
		// cannot decode within, and the line names it.
		log.Warn("auto: decoding on the CPU only: the GPU's memory bounds leave it nothing to decode in", "workers", opts.Workers, "reason", budgetErr.Error())
		return p, nil
	}
	switch opts.Mode {
	case CPU:
		p.startOnce.Do(func() { close(p.ready) })
		log.Debug("decoding on the CPU", "workers", opts.Workers)
	case GPU:
		var err error
		p.startOnce.Do(func() { err = p.startGPUs() })
		if err != nil {
			p.cpu.Close()
			return nil, err
		}
	case Auto:
		// The router decodes on the CPU until it starts the GPUs
		// (router.beforeStart), and routes between them after.
		p.route.Store(&routed{p.router})
		if opts.startAtOnce {
			p.router.asked.Store(true)
			p.beginStart()
		}
	}
	return p, nil
}

// beginStart starts the GPUs in the background, once (Auto mode).
func (p *Pipeline) beginStart() {
	p.startOnce.Do(func() {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			close(p.ready)
			return
		}
		go func() {
			if err := p.startGPUs(); err != nil {
				p.log.Debug("decoding on the CPU", "workers", p.opts.Workers, "reason", err)
			}
		}()
	})
}

// startGPUs opens every GPU asked for and switches the route to them.
func (p *Pipeline) startGPUs() error {
	defer close(p.ready)
	err := p.openGPUs()
	if err == nil {
		go p.sleepWhenIdle()
	}
	return err
}

// openGPUs opens every GPU asked for and switches the route to them.
func (p *Pipeline) openGPUs() (err error) {
	devices := p.opts.GPUs
	if devices == nil {
		n := p.opts.deviceCount()
		for i := range n {
			devices = append(devices, i)
		}
	}
	p.mu.Lock()
	var left []int
	for _, d := range devices {
		if p.retiredDevs[d] == nil {
			left = append(left, d)
		}
	}
	if len(devices) > 0 && len(left) == 0 {
		p.mu.Unlock()
		return fmt.Errorf("%w: every GPU was retired for this process (a round did not finish, or a fault outlived a reset)", gpu.ErrNoGPU)
	}
	devices = left
	p.mu.Unlock()
	var gpus []gpuDecoder
	defer func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil || p.closed {
			if p.exiting {
				return // the process exits: nothing to tear down
			}
			for _, g := range gpus {
				g.Close()
			}
			if err == nil {
				err = fmt.Errorf("decode: pipeline: %w", codec.ErrClosed)
			}
			return
		}
		p.gpus, p.devices, p.started = gpus, devices, true
		p.lastUse.Store(time.Now().UnixNano())
		var names []string
		for _, g := range gpus {
			names = append(names, g.Info().String())
		}
		if p.woke {
			p.log.Debug("GPUs started again", "gpus", len(gpus))
		} else {
			p.log.Info("decoding on the GPU", "mode", string(p.opts.Mode), "gpus", len(gpus), "gpu", strings.Join(names, "; "),
				"gpu_memory", size(p.opts.GPUMemory), "pinned_memory", size(p.opts.PinnedMemory), "cpu_workers", p.opts.Workers)
		}
		var onGPU codec.BatchDecoder = gpus[0]
		if len(gpus) > 1 {
			onGPU = newSpread(gpus)
		}
		onGPU = &counter{inner: onGPU, device: "gpu", mu: &p.countMu, into: p.decoded}
		onGPU = &fallback{inner: onGPU, cpu: p.onCPU, warn: p.warnFallback}
		if p.opts.Mode == GPU {
			p.route.Store(&routed{onGPU})
			return
		}
		// The CPU's workers first; the GPUs take what pays.
		p.router.gpu.Store(&routed{onGPU})
		p.route.Store(&routed{p.router})
	}()
	if len(devices) == 0 {
		// The probe knows the true reason: a missing driver library is
		// not a driver that sees no device.
		reason := "the driver sees no device"
		if p.opts.noDevice != nil {
			reason = cmp.Or(p.opts.noDevice(), reason)
		}
		return fmt.Errorf("%w: %s", gpu.ErrNoGPU, reason)
	}
	for _, dev := range devices {
		o := p.opts.GPU
		o.Device = dev
		o.Logger = p.log
		g, err := p.opts.newGPU(o)
		if err != nil {
			for _, g := range gpus {
				g.Close()
			}
			return fmt.Errorf("GPU %d: %w", dev, err)
		}
		gpus = append(gpus, g)
	}
	return nil
}

// DecodeBatch decodes jobs where the mode says; jobs a GPU refuses or
// fails decode on the CPU.
func (p *Pipeline) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	p.active.Add(1)
	defer p.active.Add(-1)
	p.lastUse.Store(time.Now().UnixNano())
	if p.asleep.Load() {
		p.wake()
	}
	return p.route.Load().DecodeBatch(ctx, jobs)
}

// sleepWhenIdle gives the GPUs back (their contexts, buffers and pinned
// memory) after Options.GPU.HostIdle without a batch, so that a mount that
// finished its warm-up leaves the GPUs to training; the next batch starts
// them again (wake).
func (p *Pipeline) sleepWhenIdle() {
	idle := p.opts.GPU.HostIdle
	if idle <= 0 {
		idle = 2 * time.Minute
	}
	t := time.NewTicker(max(idle/4, 10*time.Millisecond))
	defer t.Stop()
	for range t.C {
		// wakeMu is held from the check to the last Close: a wake meanwhile
		// would open the same devices' primary contexts, which the closing
		// decoders then reset under it.
		p.wakeMu.Lock()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			p.wakeMu.Unlock()
			return
		}
		if p.asleep.Load() || len(p.gpus) == 0 || p.active.Load() > 0 || p.rings.Load() > 0 || time.Since(time.Unix(0, p.lastUse.Load())) < idle || p.lentLocked() {
			p.mu.Unlock()
			p.wakeMu.Unlock()
			continue
		}
		gpus, devices := p.gpus, p.devices
		p.gpus, p.devices = nil, nil
		p.closing, p.closingDevices = gpus, devices
		p.route.Store(&routed{p.onCPU})
		p.asleep.Store(true)
		p.mu.Unlock()
		// A batch that loaded the old route just before the swap still
		// runs on it: Close waits for its rounds.
		for _, g := range gpus {
			g.Close()
		}
		p.mu.Lock()
		p.retireLocked(gpus, devices)
		p.mu.Unlock()
		p.wakeMu.Unlock()
		p.log.Debug("idle: GPUs given back", "after", idle)
	}
}

// lentLocked reports whether a GPU has pinned memory lent out: a GPU
// closed then would keep that memory mapped for good (a buffer is given
// back to the GPU that lends now), so the GPUs sleep only with nothing
// lent. The lender lends and takes back under p.mu, so nothing is lent
// between this check and the swap of the route. The caller holds p.mu.
func (p *Pipeline) lentLocked() bool {
	for _, g := range p.gpus {
		if g.HostLent() > 0 {
			return true
		}
	}
	return false
}

// wakeRetry is how long after a failed wake the next one is tried.
const wakeRetry = 30 * time.Second

// wake starts the GPUs again after sleepWhenIdle: in the background in
// Auto mode (batches decode on the CPU meanwhile), before the batch in GPU
// mode.
func (p *Pipeline) wake() {
	start := func() {
		p.wakeMu.Lock()
		defer p.wakeMu.Unlock()
		if !p.asleep.Load() {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		p.woke = true
		p.mu.Unlock()
		if err := p.openGPUs(); err != nil {
			// Still asleep (training may hold the GPU's memory): a later
			// batch tries again, after wakeRetry.
			p.retryWake.Store(time.Now().Add(wakeRetry).UnixNano())
			p.log.Warn("GPUs did not start again; decoding on the CPU", "err", err, "retry_in", wakeRetry)
			return
		}
		p.asleep.Store(false)
	}
	if time.Now().UnixNano() < p.retryWake.Load() {
		return
	}
	if p.opts.Mode == GPU {
		start()
		return
	}
	if p.wakeMu.TryLock() {
		p.wakeMu.Unlock()
		go start()
	}
}

// Ready blocks until the GPUs have started or failed to (at once in CPU
// mode) and reports whether decoding uses a GPU.
//
// In Auto mode a pipeline whose GPUs have not started yet (the CPU has kept
// up, see Options.GPUStartAfter) starts them now: a caller that asks
// wants to know whether a GPU decodes.
func (p *Pipeline) Ready(ctx context.Context) (onGPU bool, err error) {
	if p.opts.Mode == Auto {
		p.beginStart()
	}
	select {
	case <-p.ready:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started, nil
}

// Memory returns the memory zarr reads compressed chunks into and fills
// decode into, the one lender of the process: in GPU mode the first GPU's
// pinned host memory, which the device copies without staging; otherwise
// (in CPU and Auto mode, without a GPU awake, and when its registered
// memory is all lent) memory of the pipeline's own, kept mapped and lent
// again (memory.Arena), so that a steady stream of fills neither faults
// fresh pages in nor has the collector zero and drop them.
//
// Auto mode lends no pinned memory: registering it (cuMemHostRegister, a
// few GB/s and serialised) then fell on every buffer of the fills, which
// made auto slower than cpu while the GPU decoded a small share of the
// chunks (BENCHMARKS.md, tuning choices). The GPU stages what it decodes
// instead.
func (p *Pipeline) Memory() codec.HostMemory { return lender{p} }

// CPU is the pipeline's CPU decoder, counted as its other chunks decoded
// on the CPU: for work a caller has already placed on the host (the
// device path's share of chunks idle cores decode sooner), within the
// pipeline's workers.
func (p *Pipeline) CPU() codec.BatchDecoder { return p.onCPU }

// Host returns the host face of the pipeline's lender: it lends memory
// kept mapped and lent again, never pinned, for buffers no device reads (a
// cast's output, a checksum's input, a piece read from a file), and takes
// back and holds whatever the pipeline lent, pinned or not: a reader
// handed a buffer of a GPU's (a chunk read into pinned memory) can hold it
// as well as one of the arena's.
func (p *Pipeline) Host() memory.Lender { return hostLender{lender{p}} }

// lender lends the first GPU's pinned memory in GPU mode, while that GPU
// is awake, not retired and has room registered, and the arena's
// otherwise. A buffer goes back to whoever lent it: the arena takes back
// its own, a GPU's HostFree ignores memory it did not lend.
type lender struct{ p *Pipeline }

// HostAlloc and HostFree run under p.mu, so that the GPU that lends is
// the one that takes back: a GPU goes to sleep only with nothing lent
// (lentLocked), and none lends while it is being put to sleep.
func (l lender) HostAlloc(n int) []byte {
	p := l.p
	if p.opts.Mode == GPU {
		p.mu.Lock()
		var b []byte
		if len(p.gpus) > 0 && !p.closed && p.gpus[0].Retired() == nil {
			b = p.gpus[0].TryHostAlloc(n)
		}
		p.mu.Unlock()
		if b != nil {
			return b
		}
	}
	return p.arena.HostAlloc(n)
}

// HostFree gives a hold back to whoever lent b: the arena, or one of the
// GPUs (the pipeline's lender lends the first's; a ring lends its own
// GPU's). After Close it drops pinned memory: the closed GPUs have
// unmapped it.
func (l lender) HostFree(b []byte) {
	if l.p.arena.Free(b) {
		return
	}
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if !l.p.closed {
		for _, g := range l.p.gpus {
			g.HostFree(b) // ignored by the GPUs that did not lend it
		}
	}
}

// Retain adds a hold on b with whoever lent it.
func (l lender) Retain(b []byte) bool {
	if l.p.arena.Retain(b) {
		return true
	}
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if l.p.closed {
		return false
	}
	for _, g := range l.p.gpus {
		if g.Retain(b) {
			return true
		}
	}
	return false
}

// HostTrim gives the GPU that lent b the room past its first n bytes
// (memory.Trimmer): a chunk read into room for its decoded size. The
// arena's buffers, of size classes, keep theirs.
func (l lender) HostTrim(b []byte, n int) []byte {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if !l.p.closed {
		for _, g := range l.p.gpus {
			if t := g.HostTrim(b, n); cap(t) != cap(b) { // the one that lent it
				return t
			}
		}
	}
	return b[:n]
}

var _ memory.Trimmer = lender{}

// hostLender is the pipeline's lender lending host memory only (Host).
type hostLender struct{ lender }

func (h hostLender) HostAlloc(n int) []byte { return h.p.arena.HostAlloc(n) }

// gpuUsable reports whether a GPU takes work: started, awake, and not
// every one retired.
func (p *Pipeline) gpuUsable() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.gpus {
		if g.Retired() == nil {
			return true
		}
	}
	return false
}

// gpuCosts sums the GPUs' Costs by codec.
func (p *Pipeline) gpuCosts() map[codec.Name]gpu.Cost {
	p.mu.Lock()
	gpus := p.gpus
	p.mu.Unlock()
	out := map[codec.Name]gpu.Cost{}
	for _, g := range gpus {
		for c, k := range g.Costs() {
			o := out[c]
			out[c] = gpu.Cost{Chunks: o.Chunks + k.Chunks, Bytes: o.Bytes + k.Bytes, HostNanos: o.HostNanos + k.HostNanos}
		}
	}
	return out
}

// OnGPU reports, without waiting, whether decoding uses a GPU now: one
// started and not retired. Unlike Ready it never waits for CUDA.
func (p *Pipeline) OnGPU() bool { return p.gpuUsable() }

// Routes describes, per codec, what auto mode decided from its
// measurements ("cpu", "gpu" or "probing", with the CPU's and the GPU
// path's host time per decoded byte); empty in other modes or before a
// batch found the CPU busy.
func (p *Pipeline) Routes() map[string]string {
	if p.opts.Mode != Auto {
		return map[string]string{}
	}
	return p.router.routes()
}

// Placement describes where chunks decode now, for status lines: "cpu (16
// workers)" or "cpu (16 workers) + 2 GPUs (auto)".
func (p *Pipeline) Placement() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := fmt.Sprintf("cpu (%d workers)", p.opts.Workers)
	if len(p.gpus) > 0 {
		s += fmt.Sprintf(" + %d GPU", len(p.gpus))
		if len(p.gpus) > 1 {
			s += "s"
		}
		s += " (" + string(p.opts.Mode) + ")"
	}
	return s
}

// Decoded returns the chunks and bytes decoded so far by codec and device.
func (p *Pipeline) Decoded() Decoded {
	p.countMu.Lock()
	defer p.countMu.Unlock()
	out := make(Decoded, len(p.decoded))
	for k, v := range p.decoded {
		out[k] = v
	}
	return out
}

// GPUStats sums what the GPUs decoded, refused and found corrupt since
// the pipeline started (package gpu's Stats), zero without a GPU.
func (p *Pipeline) GPUStats() gpu.Stats {
	var s gpu.Stats
	for _, d := range p.GPUStatsByDevice() {
		s = s.Add(d)
	}
	return s
}

// GPUStatsByDevice reports GPUStats for each GPU by its ordinal, over the
// mount's life: with several GPUs, how the work was spread.
func (p *Pipeline) GPUStatsByDevice() map[int]gpu.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[int]gpu.Stats, len(p.retired)+len(p.gpus))
	for d, s := range p.retired {
		m[d] = s
	}
	for i, g := range p.gpus {
		m[p.devices[i]] = m[p.devices[i]].Add(g.Stats())
	}
	for i, g := range p.closing {
		m[p.closingDevices[i]] = m[p.closingDevices[i]].Add(g.Stats())
	}
	return m
}

// retireLocked keeps the counts of GPUs closed for good, which until now
// were counted among those closing.
func (p *Pipeline) retireLocked(gpus []gpuDecoder, devices []int) {
	if p.retired == nil {
		p.retired = map[int]gpu.Stats{}
	}
	for i, g := range gpus {
		p.retired[devices[i]] = p.retired[devices[i]].Add(g.Stats())
		if err := g.Retired(); err != nil {
			if p.retiredDevs == nil {
				p.retiredDevs = map[int]error{}
			}
			p.retiredDevs[devices[i]] = err
		}
	}
	p.closing, p.closingDevices = nil, nil
}

// MemoryHeld reports the memory the GPUs hold for decoding now, besides
// their CUDA contexts: device buffers, and pinned host memory (staging and
// lent), summed over the GPUs.
func (p *Pipeline) MemoryHeld() (device, pinned int64) {
	p.mu.Lock()
	gpus := p.gpus
	p.mu.Unlock()
	for _, g := range gpus {
		d, s, l := g.MemoryHeld()
		device += d
		pinned += s + l
	}
	return device, pinned
}

// Pinned reports the GPUs' pinned host memory by use, summed over them
// (the peaks too: each GPU's own).
func (p *Pipeline) Pinned() gpu.Pinned {
	p.mu.Lock()
	gpus := p.gpus
	p.mu.Unlock()
	var sum gpu.Pinned
	for _, g := range gpus {
		x := g.Pinned()
		sum.Staging += x.Staging
		sum.Pool += x.Pool
		sum.Lent += x.Lent
		sum.LentPeak += x.LentPeak
		sum.Missed += x.Missed
	}
	return sum
}

// Close waits for the batches in flight, then stops the CPU workers and
// frees the GPUs. Later DecodeBatch calls fail. Close is idempotent.
func (p *Pipeline) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	// An Auto pipeline that never started its GPUs never will; a GPU still
	// starting is closed by openGPUs, which sees p.closed.
	p.startOnce.Do(func() { close(p.ready) })
	<-p.ready
	p.route.Store(&routed{closedDecoder{}})
	var errs []error
	p.mu.Lock()
	gpus, devices := p.gpus, p.devices
	p.gpus, p.devices = nil, nil
	p.closing, p.closingDevices = gpus, devices
	p.mu.Unlock()
	for _, g := range gpus {
		errs = append(errs, g.Close())
	}
	p.mu.Lock()
	p.retireLocked(gpus, devices)
	p.mu.Unlock()
	errs = append(errs, p.cpu.Close())
	p.arena.Close()
	return errors.Join(errs...)
}

// CloseForExit is Close for a process about to exit: the CPU workers
// stop, later DecodeBatch calls fail, and nothing else is waited for or
// freed: not GPUs still starting, nor the contexts, device buffers and
// pinned memory of those started, whose teardown (unregistering pinned
// memory, resetting contexts) takes a short command longer than its work;
// the exit frees them. Batches must be done.
func (p *Pipeline) CloseForExit() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed, p.exiting = true, true
	p.mu.Unlock()
	p.route.Store(&routed{closedDecoder{}})
	return p.cpu.Close()
}

func (p *Pipeline) warnFallback(what string, cause error) {
	p.fellBack.Do(func() {
		p.log.Warn("decoding on the CPU instead", "reason", what, "cause", cause)
	})
}

type closedDecoder struct{}

func (closedDecoder) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	return fmt.Errorf("decode: pipeline: %w", codec.ErrClosed)
}
