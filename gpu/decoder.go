package gpu

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/parallel"
)

// Options configure a Decoder. The zero value is ready to use.
type Options struct {
	// Device is the CUDA device ordinal. Zero means the first GPU.
	Device int
	// Libraries says where nvCOMP is looked for, when this New is the
	// first of the process to load the libraries (see Probe).
	Libraries Libraries
	// MaxBatchBytes bounds the device memory and, as much again, the pinned
	// host memory the Decoder keeps for its buffers (compressed input,
	// decoded output, scratch). Zero means 2 GiB. Each of the Streams
	// rounds in flight gets an equal share; a single chunk needing more
	// than one share is left to the CPU (ErrUnsupported).
	MaxBatchBytes int64
	// RoundBytes is the buffer size of one round: a batch is cut into
	// rounds so that the host packs the next round and copies out an
	// earlier one while the GPU copies and decodes the rounds between. A
	// round of fewer than 64 compressed pieces (chunks, or blosc streams)
	// grows past it, up to its share of MaxBatchBytes, since nvCOMP needs
	// many pieces to fill a GPU. Zero means 256 MiB.
	RoundBytes int64
	// Streams is the number of rounds in flight, each with its own buffers
	// and CUDA stream, so that one round's host-to-device copy, another's
	// decoding and a third's device-to-host copy overlap. Zero means 4:
	// 4 rounds of 256 MiB were best, or within noise of the best, of the
	// counts and sizes tried for every codec (BENCHMARKS.md, tuning
	// choices).
	Streams int
	// CopyWorkers is the number of goroutines that pack compressed bytes
	// into pinned memory and copy decoded bytes out of it. Zero means
	// min(16, GOMAXPROCS).
	CopyWorkers int
	// SkipChecksums turns off the CPU check of gzip CRC-32, zlib Adler-32
	// and zstd content checksums after GPU decoding (nvCOMP checks none of
	// them). Zero value: they are checked. Without Unverified, chunks that
	// only their checksum verifies then go to the CPU.
	SkipChecksums bool
	// HostBytes bounds the pinned host memory HostAlloc lends. Zero means
	// 4 GiB (16 fills of a 20-channel ERA5 sample with their compressed
	// chunks take about 3); past it HostAlloc returns ordinary memory.
	HostBytes int64
	// HostOnDemand registers no pinned memory before the first HostAlloc
	// (or TryHostAlloc). Zero value: the first arena is registered in the
	// background at New, ahead of demand, as a Decoder that will take
	// work wants; a caller that may not use the GPU at all (decoding in
	// auto mode) sets it, so that a GPU it declines costs no pinning.
	HostOnDemand bool
	// HostIdle is how long the Decoder keeps memory it is not using: the
	// lent memory's arenas with nothing lent and no request, and the
	// device and staging buffers of rounds, are given back after this long
	// without a round. Zero means two minutes.
	HostIdle time.Duration
	// DeviceBytes bounds the device memory the rounds' buffers take
	// altogether (compressed input, decoded output, nvCOMP's scratch),
	// besides the CUDA context. Zero means no bound beyond MaxBatchBytes'
	// rounds. A round that would need more beside the other sets' buffers
	// waits for every set, frees their buffers and runs alone, and the
	// rounds after it are cut (down to 16 MiB) until they fit side by side,
	// and let grow again, doubling, after 32 rounds in a row fit; one that
	// needs more even alone is left to the CPU.
	DeviceBytes int64
	// StagingBytes bounds the pinned host memory of the rounds' own
	// staging buffers. Zero means no bound beyond MaxBatchBytes' rounds.
	StagingBytes int64
	// ResetOnClose resets the device's primary context when the Decoder
	// closes, which frees what the CUDA runtime inside nvCOMP keeps in it
	// (about 500 MiB); only for a process where nothing else uses the GPU
	// (the zarrfs daemon), since it ends every other user's allocations.
	ResetOnClose bool
	// Deflate sends gzip, zlib and blosc-zlib chunks to nvCOMP's deflate
	// decoder; the host then checks their CRC-32 or Adler-32 over what it
	// decoded (blosc zlib streams too). Off by default: nvCOMP's deflate
	// writes past its output on some damaged streams (see the package
	// doc), the checksums leave a few kinds of damage only the CPU sees,
	// and the GPU pays for deflate only where TestThroughputSummary's
	// deflate row says so. The fence around deflate outputs keeps overruns
	// from other chunks (on an H200, the good chunk next to a damaged zlib
	// chunk came back wrong without the fence and right with it), but a
	// large overrun turns the GPU path off for the process. Off, those
	// codecs decode on the CPU (ErrUnsupported).
	Deflate bool
	// Unverified sends to nvCOMP streams for which the host cannot hold
	// nvCOMP's verdict to the CPU decoder's: zstd chunks of frames without
	// a content checksum (numcodecs and zarr-python write none by
	// default), every blosc chunk with zstd streams, and blosc chunks
	// with snappy streams, which the CPU decoder does not decode at all.
	// Off by
	// default: the host checks only zstd's frame, block and section
	// headers, and nvCOMP may accept damage inside the entropy-coded data
	// that the CPU decoder rejects (see the package doc); off, such chunks
	// go to the CPU (ErrUnsupported). zstd frames with a content checksum
	// decode on the GPU either way: the host verifies the checksum of the
	// bytes nvCOMP decoded.
	Unverified bool
	// WalkOnDevice walks LZ4 blocks on the GPU (kernels.cu's lz4_check,
	// the host's lz4Check rule for rule, before nvCOMP reads them) instead
	// of on the host, taking the walk off the host's CPU, of which it is a
	// large share in a blosc-lz4 GPU fill on few cores. The verdicts are
	// the same (a block it rejects goes to the CPU, which calls it
	// corrupt). Off by default: on the device the walk, one thread per
	// block, costs GPU throughput, and a fill on a few cores, where it
	// should pay, took less host CPU with it but was no faster
	// (BENCHMARKS.md, tuning choices).
	WalkOnDevice bool
	// RoundTimeout bounds the time a round may take on the device, from
	// the moment the submitter takes it up, before the Decoder gives up
	// on the GPU: a round not finished by then (damaged input that makes
	// an nvCOMP kernel loop, a device that stopped answering) fails its
	// jobs with an error wrapping ErrHung and ErrUnsupported, so their
	// callers decode them on the CPU, and the Decoder takes no more work
	// for the life of the process, as after a device fault it cannot
	// recover from (see Retired). The bound grows with the round: this
	// long plus a second per 64 MiB of its decoded bytes (an H200 decodes
	// a round of 256 MiB in tens of milliseconds). Zero means 5 s;
	// negative is refused.
	RoundTimeout time.Duration
	// KernelsPTX, when set, is the PTX the kernels are loaded from instead
	// of the embedded one (kernels/kernels.cu compiled with nvcc): to run
	// kernels before their PTX is checked in. Kernels it lacks that the
	// Decoder can do without (xxh64_check) stay on the host.
	KernelsPTX string
	// Logger receives one debug line per batch and a warning when the device
	// fails. Nil discards.
	Logger *slog.Logger
}

const (
	defaultMaxBatchBytes = 2 << 30
	defaultRoundBytes    = 256 << 20
	defaultStreams       = 4
	defaultHostBytes     = 4 << 30
	defaultRoundTimeout  = 5 * time.Second
)

// maxJobsPerRound keeps grid dimensions and descriptor arrays small.
const maxJobsPerRound = 16384

// minRoundPieces is the number of nvCOMP pieces a round holds before
// RoundBytes may close it: two rounds of this many pieces, running at
// once on their own streams, keep most multiprocessors of a large GPU busy.
const minRoundPieces = 64

// Decoder decodes batches of chunks on one GPU. It implements
// codec.BatchDecoder. It is safe for concurrent use: the jobs of callers
// waiting for the device are decoded together (see queue.go).
type Decoder struct {
	libs *libs
	cu   *cudaLib
	nv   *nvcompLib
	opts Options
	log  *slog.Logger
	info Info

	host   hostPool  // pinned memory lent to callers (hostmem.go)
	counts counters  // what Stats reports (stats.go)
	costs  costTable // what Costs reports (stats.go)

	// Memory held by the rounds' buffers, and the time (UnixNano) the last
	// round was submitted, for budgets and idle trimming.
	devHeld, stagingHeld atomic.Int64
	// ringHeld is the part of devHeld that rings hold (ipc.go): the
	// rounds share what they leave (roundLimit).
	ringHeld           atomic.Int64
	stagingBase        int64 // the argument blocks, kept while idle
	lastRound          atomic.Int64
	trimStop, trimDone chan struct{}

	// ctxMu guards ctx: HostAlloc registers memory under its read lock (so
	// callers register at once), a context rebuild or Close holds it.
	ctxMu sync.RWMutex
	// rings are the rings open in the context (ipc.go), under ringsMu
	// (taken inside ctxMu): a context rebuild loses them.
	ringsMu                     sync.Mutex
	rings                       map[*Ring]struct{}
	dev                         int32
	ctx                         uintptr
	mod                         uintptr
	fnCopy, fnUnshuffle, fnSwap uintptr
	fnLZ4Check                  uintptr
	// fnXXH64 is xxh64_check, when the PTX has it (hashKernel, set once
	// at open): zstd frames decoded into device memory the host never
	// reads are held to their content checksum on the device.
	fnXXH64    uintptr
	hashKernel bool

	sets      []bufSet // one per round in flight (Options.Streams)
	outAligns [numAlgos]int64
	inAligns  [numAlgos]int64

	// stateMu guards broken and dead, which the submitter and the
	// completer both set.
	stateMu sync.Mutex
	broken  error // a sticky device error: the context must be rebuilt
	dead    error // rebuilding failed: the GPU path is off for good
	// mendMu lets one caller outside the rounds rebuild at a time
	// (mendIdle): two that each held some buffer sets would wait for the
	// other's.
	mendMu sync.Mutex

	// The queue of callers (queue.go).
	rounds        device
	qmu           sync.Mutex
	queue         []*request
	seq           uint64
	closing       bool
	wake          chan struct{} // a request was queued, or Close called
	free          chan int      // buffer sets with no round in flight
	ringAhead     chan struct{} // places of ring rounds in flight (awaitAhead)
	submitted     chan *round   // rounds in flight, oldest first, to the completer
	stopped       chan struct{} // closed when Close has freed everything
	completerDone chan struct{}
	live          map[*request]struct{} // requests not yet done, under qmu

	// The watchdog (watchdog.go): hung is set, and hungCh closed, once a
	// round has not finished in time; the device is then never used, nor
	// freed, again.
	hung atomic.Bool
	// roundCap, when above zero, bounds a round's cost below its share
	// (roundLimit); fitStreak, the submitter's, counts the rounds readied
	// beside the others since it was last changed (roundFitted).
	roundCap   atomic.Int64
	fitStreak  int
	hungCh     chan struct{}
	retireOnce sync.Once

	// noFence lays deflate outputs out unfenced and lets their rounds
	// overlap, as before the fence existed: tests set it to show what the
	// fence prevents.
	noFence bool
	// ipcCalls, when set, are the IPC calls (ipc.go) instead of the
	// driver's: tests' stand-ins.
	ipcCalls *ipcLib

	// noValidate skips the walk of LZ4 blocks (checkStreams on the host,
	// lz4_check on the device): the throughput test sets it to measure
	// what the walk costs. Nothing else may.
	noValidate bool
}

// bufSet is the memory of one round in flight.
type bufSet struct {
	hIn, hOut  hostBuf
	dIn, dOut  devBuf
	args       hostBuf // kernel argument values and pointer arrays (C memory)
	start, end uintptr // events around the round's device work
	// out follows the copies into pinned callers' memory (finishDirect).
	out uintptr
	// marks are events between its stages: after the host-to-device copy,
	// after nvCOMP, after our kernels. The debug line reports each stage.
	marks [3]uintptr
	// Each set has its own stream and nvCOMP scratch, so that the GPU may
	// run two rounds at once: large chunks give nvCOMP few, long tasks,
	// and a second round fills the idle multiprocessors.
	stream uintptr
	dTemp  devBuf
}

var (
	_ codec.BatchDecoder = (*Decoder)(nil)
	_ codec.HostMemory   = (*Decoder)(nil)
)

type devBuf struct {
	ptr  uintptr
	size int64
}

type hostBuf struct {
	p    unsafe.Pointer
	size int64
	// mapped: an anonymous mapping registered with the driver
	// (mapStaging), not cuMemAllocHost's.
	mapped bool
}

func (h hostBuf) bytes() []byte { return unsafe.Slice((*byte)(h.p), h.size) }

// New opens the GPU opts.Device: it retains its primary context, creates a
// stream and loads the kernels. The error wraps ErrNoGPU and says why when
// the machine has no driver, no device or no nvCOMP.
func New(opts Options) (*Decoder, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	if opts.RoundTimeout < 0 {
		return nil, fmt.Errorf("gpu: round timeout %v: want 0 (the default, %v) or more", opts.RoundTimeout, defaultRoundTimeout)
	}
	return open(getLibs(opts.Libraries), opts)
}

// open is New over the libraries l: the process's own, or a test's
// stand-ins for the driver and nvCOMP.
func open(l *libs, opts Options) (*Decoder, error) {
	if l.err != nil {
		return nil, l.err
	}
	if opts.Device < 0 || opts.Device >= int(l.devices) {
		return nil, fmt.Errorf("%w: device %d requested, the driver sees %d", ErrNoGPU, opts.Device, l.devices)
	}
	opts, log := opts.withDefaults()
	d := &Decoder{libs: l, cu: l.cu, nv: l.nv, opts: opts, log: log, info: probe(l, opts.Device),
		sets: make([]bufSet, opts.Streams)}
	d.host.limit = opts.HostBytes
	for a := range numAlgos {
		d.outAligns[a] = max(int64(l.nv.algos[a].align.Output), 1)
		d.inAligns[a] = max(int64(l.nv.algos[a].align.Input), 1)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.initContext(); err != nil {
		d.teardown()
		return nil, err
	}
	d.hashKernel = d.fnXXH64 != 0
	d.host.idle = opts.HostIdle
	d.host.onDemand = opts.HostOnDemand
	d.host.register, d.host.unregister = d.register, d.unregister
	d.host.start()
	d.lastRound.Store(time.Now().UnixNano())
	d.stagingBase = d.stagingHeld.Load()
	d.start(cudaRounds{d})
	// The goroutine gets its channels as values: close and abandon clear
	// the fields while it may still be starting.
	stop, done := make(chan struct{}), make(chan struct{})
	d.trimStop, d.trimDone = stop, done
	go func() { defer close(done); d.trimWhenIdle(stop) }()
	return d, nil
}

// check refuses negative sizes, counts and durations: zero means the
// default, and a negative value is a mistake, not a request for it.
func (opts Options) check() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxBatchBytes", opts.MaxBatchBytes}, {"RoundBytes", opts.RoundBytes}, {"HostBytes", opts.HostBytes},
		{"Streams", int64(opts.Streams)}, {"DeviceBytes", opts.DeviceBytes}, {"StagingBytes", opts.StagingBytes},
		{"CopyWorkers", int64(opts.CopyWorkers)}, {"HostIdle", int64(opts.HostIdle)},
	} {
		if f.v < 0 {
			return fmt.Errorf("gpu: Options.%s %d: want 0 (the default) or more", f.name, f.v)
		}
	}
	return nil
}

// withDefaults fills in the zero values of o.
func (opts Options) withDefaults() (Options, *slog.Logger) {
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = defaultMaxBatchBytes
	}
	if opts.RoundBytes <= 0 {
		opts.RoundBytes = defaultRoundBytes
	}
	if opts.HostBytes <= 0 {
		opts.HostBytes = defaultHostBytes
	}
	if opts.Streams <= 0 {
		opts.Streams = defaultStreams
	}
	if opts.RoundTimeout == 0 {
		opts.RoundTimeout = defaultRoundTimeout
	}
	opts.RoundBytes = min(opts.RoundBytes, opts.share())
	if opts.DeviceBytes <= 0 {
		opts.DeviceBytes = math.MaxInt64
	}
	if opts.StagingBytes <= 0 {
		opts.StagingBytes = math.MaxInt64
	}
	if opts.CopyWorkers <= 0 {
		opts.CopyWorkers = min(16, runtime.GOMAXPROCS(0))
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return opts, log
}

// share is the most memory one round may use: MaxBatchBytes split among
// the rounds in flight.
func (opts Options) share() int64 { return opts.MaxBatchBytes / int64(opts.Streams) }

// Info describes the device and libraries the Decoder uses.
func (d *Decoder) Info() Info { return d.info }

// initContext makes the device ready: context, stream, kernels, argument
// buffer. The caller holds the OS thread.
func (d *Decoder) initContext() error {
	cu := d.cu
	if err := cu.check("cuDeviceGet", cu.cuDeviceGet(&d.dev, int32(d.opts.Device))); err != nil {
		return err
	}
	if err := cu.check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		return err
	}
	if err := cu.check("cuCtxSetCurrent", cu.cuCtxSetCurrent(d.ctx)); err != nil {
		return err
	}
	ptx, err := loadPTX()
	if d.opts.KernelsPTX != "" {
		ptx = d.opts.KernelsPTX
	}
	if err != nil {
		return err
	}
	img := cStr(ptx)
	if err := cu.check("cuModuleLoadData", cu.cuModuleLoadData(&d.mod, unsafe.Pointer(img))); err != nil {
		return err
	}
	runtime.KeepAlive(img)
	for _, f := range []struct {
		p    *uintptr
		name string
	}{{&d.fnCopy, "scatter_copy"}, {&d.fnUnshuffle, "unshuffle"}, {&d.fnSwap, "byteswap"}, {&d.fnLZ4Check, "lz4_check"},
		{&d.fnXXH64, "xxh64_check"}} {
		if f.p == &d.fnXXH64 && !ptxHas(ptx, f.name) {
			continue // PTX from before the kernel: checksums stay on the host
		}
		if err := cu.check("cuModuleGetFunction "+f.name, cu.cuModuleGetFunction(f.p, d.mod, cStr(f.name))); err != nil {
			return err
		}
	}
	for i := range d.sets {
		st := &d.sets[i]
		const nonBlocking = 1 // CU_STREAM_NON_BLOCKING: no implicit sync with the legacy stream
		if err := cu.check("cuStreamCreate", cu.cuStreamCreate(&st.stream, nonBlocking)); err != nil {
			return err
		}
		// The host waits on end and out: blocking-sync events let its
		// thread sleep, where a default event has it spin a core for the
		// length of every round.
		const blockingSync = 1 // CU_EVENT_BLOCKING_SYNC
		for _, e := range []struct {
			p     *uintptr
			flags uint32
		}{{&st.start, 0}, {&st.end, blockingSync}, {&st.out, blockingSync}, {&st.marks[0], 0}, {&st.marks[1], 0}, {&st.marks[2], 0}} {
			if err := cu.check("cuEventCreate", cu.cuEventCreate(e.p, e.flags)); err != nil {
				return err
			}
		}
		if err := d.growHost(&st.args, 4096); err != nil {
			return err
		}
	}
	return nil
}

// teardown frees what initContext and the batches allocated. Errors are
// ignored: after a sticky error every call fails, and the context reset
// that follows frees everything anyway.
func (d *Decoder) teardown() {
	cu := d.cu
	if d.ctx != 0 {
		cu.cuCtxSetCurrent(d.ctx)
	}
	var devs []*devBuf
	var hosts []*hostBuf
	for i := range d.sets {
		st := &d.sets[i]
		devs = append(devs, &st.dIn, &st.dOut, &st.dTemp)
		if st.stream != 0 {
			cu.cuStreamDestroy(st.stream)
			st.stream = 0
		}
		hosts = append(hosts, &st.hIn, &st.hOut, &st.args)
		for _, e := range []*uintptr{&st.start, &st.end, &st.out, &st.marks[0], &st.marks[1], &st.marks[2]} {
			if *e != 0 {
				cu.cuEventDestroy(*e)
				*e = 0
			}
		}
	}
	for _, b := range devs {
		d.freeDev(b)
	}
	for _, b := range hosts {
		d.freeHost(b)
	}
	if d.mod != 0 {
		cu.cuModuleUnload(d.mod)
		d.mod = 0
	}
	if d.ctx != 0 {
		cu.cuDevicePrimaryCtxRelease(d.dev)
		d.ctx = 0
	}
}

// Close frees the device resources once the rounds in flight are done;
// jobs still queued fail (wrapping ErrUnsupported), and DecodeBatch fails
// after it. Close is idempotent.
func (d *Decoder) Close() error {
	d.qmu.Lock()
	d.closing = true
	d.qmu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	// A retired Decoder's submitter may be held in a driver call for good.
	select {
	case <-d.stopped:
	case <-d.hungCh:
	}
	return nil
}

// recover rebuilds the context after a sticky error (an illegal address in
// a kernel, say): such an error poisons the context for good, so the
// primary context is reset, which frees everything in it, and made again.
// The caller holds every buffer set.
func (d *Decoder) recoverContext() error {
	d.stateMu.Lock()
	cause := d.broken
	d.stateMu.Unlock()
	d.log.Warn("gpu: resetting the CUDA context after a device error", "device", d.opts.Device, "cause", cause)
	d.ctxMu.Lock()
	defer d.ctxMu.Unlock()
	d.teardown()
	// The reset frees every allocation of the context, the rings' too:
	// their readers learn it from their next fill, and none of them may
	// write or free the addresses the new context hands out again.
	d.loseRings(cause)
	d.cu.cuCtxSetCurrent(0)
	if r := d.cu.cuDevicePrimaryCtxReset(d.dev); r != cuSuccess {
		return d.cu.check("cuDevicePrimaryCtxReset", r)
	}
	if err := d.initContext(); err != nil {
		return err
	}
	d.reregister()
	d.stateMu.Lock()
	d.broken = nil
	d.stateMu.Unlock()
	return nil
}

// mendContext rebuilds the context broken by broken (recoverContext), or,
// where a sticky error outlives the reset (the driver may insist on a new
// process), stops using the GPU rather than fail every batch slowly. The
// caller holds every buffer set.
func (d *Decoder) mendContext(broken error) error {
	err := d.recoverContext()
	if err == nil {
		return nil
	}
	d.stateMu.Lock()
	d.dead = fmt.Errorf("gpu: device unusable after %v: %w", broken, err)
	dead := d.dead
	d.stateMu.Unlock()
	d.log.Error("gpu: decoding on the GPU is off until restart", "err", dead)
	return dead
}

// mendIdle rebuilds a broken context outside a round, once the rounds in
// flight have given their buffer sets back (up to wait): a ring's
// allocation cannot wait for the next round to do it, as a reader whose
// ring the error lost opens the next one before it asks for a batch.
func (d *Decoder) mendIdle(wait time.Duration) error {
	d.stateMu.Lock()
	broken, dead := d.broken, d.dead
	d.stateMu.Unlock()
	if dead != nil || broken == nil {
		return dead
	}
	d.mendMu.Lock()
	defer d.mendMu.Unlock()
	sets, ok := d.holdSets(wait)
	defer func() {
		for _, s := range sets {
			d.free <- s
		}
	}()
	d.stateMu.Lock()
	broken, dead = d.broken, d.dead // a round may have mended it meanwhile
	d.stateMu.Unlock()
	switch {
	case dead != nil || broken == nil:
		return dead
	case !ok:
		return broken
	}
	// A rebuild is driver calls that may not return on a device that
	// stopped answering: bounded as a round is, it retires the GPU past
	// the limit, so that the callers waiting for it go to the CPU.
	limit := cmp.Or(d.opts.RoundTimeout, defaultRoundTimeout)
	watch := time.AfterFunc(limit, func() {
		d.retire(fmt.Errorf("%w: rebuilding the context after %v took more than %v", ErrHung, broken, limit))
	})
	defer watch.Stop()
	if err := d.mendContext(broken); err != nil {
		return err
	}
	return d.Retired() // past the limit, retired meanwhile
}

// DecodeBatch decodes jobs on the GPU; see codec.BatchDecoder. Jobs the GPU
// path cannot take (blosc with blosclz, a zlib preset dictionary, empty
// chunks, a chunk larger than MaxBatchBytes) get an Err wrapping
// codec.ErrUnsupported; chunks nvCOMP rejects, or that decode to the wrong
// size or checksum, get one wrapping codec.ErrCorrupt.
func (d *Decoder) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	return d.DecodeBatchSwap(ctx, jobs, 0)
}

// cudaRounds is the device half of a Decoder: rounds decoded by nvCOMP and
// our kernels on the Decoder's GPU.
type cudaRounds struct{ d *Decoder }

func (c cudaRounds) needsIdle() bool {
	d := c.d
	d.stateMu.Lock()
	defer d.stateMu.Unlock()
	return d.broken != nil && d.dead == nil
}

func (c cudaRounds) trim() { c.d.trim() }

// prepare readies the device (rebuilding a broken context when no other
// round is in flight) and r's buffer set.
func (c cudaRounds) prepare(r *round) error {
	d := c.d
	d.stateMu.Lock()
	broken, dead := d.broken, d.dead
	d.stateMu.Unlock()
	if dead != nil {
		return dead
	}
	if broken != nil {
		if !r.exclusive {
			// The error came while this round was being formed: the other
			// set's round may still use the buffers a rebuild frees.
			return broken
		}
		if err := d.mendContext(broken); err != nil {
			return err
		}
	}
	// Rounds are readied one at a time, and a rebuild happens only while
	// readying one: a ring not lost now is not lost before this round ends.
	if err := r.ringLost(); err != nil {
		return err
	}
	if err := d.cu.check("cuCtxSetCurrent", d.cu.cuCtxSetCurrent(d.ctx)); err != nil {
		return err
	}
	d.lastRound.Store(time.Now().UnixNano())
	fl, err := d.prepareRound(r.jobs, r.preps, r.dev, &d.sets[r.set])
	r.fl = fl
	return err
}

// pack copies r's compressed pieces into its set's staging.
func (c cudaRounds) pack(r *round) { c.d.pack(r.fl.set, r.fl.l, r.jobs) }

// start queues r's device work.
func (c cudaRounds) start(r *round) error {
	d := c.d
	if err := d.cu.check("cuCtxSetCurrent", d.cu.cuCtxSetCurrent(d.ctx)); err != nil {
		return err
	}
	err := d.startRound(r.fl, r.elemSize)
	if err != nil {
		// Copies from pinned callers' memory may be queued: they end
		// before the callers are told, unless the device stopped answering.
		set := r.fl.set
		if d.cu.cuEventRecord(set.out, set.stream) == cuSuccess {
			d.await(set.out, r.deadline, d.hungCh)
		}
	}
	return err
}

func (c cudaRounds) collect(r *round, cancel <-chan struct{}) ([][]byte, []error, error) {
	d := c.d
	if err := d.cu.check("cuCtxSetCurrent", d.cu.cuCtxSetCurrent(d.ctx)); err != nil {
		return nil, nil, err
	}
	return d.finish(r, cancel)
}

// finishDirect copies the decoded bytes of the jobs which straight into
// their pinned Dst, or on the device where they go (a ring's runs), and
// waits for them.
func (c cudaRounds) finishDirect(r *round, which []int, deadline time.Time, cancel <-chan struct{}) error {
	d := c.d
	cu, fl := d.cu, r.fl
	set := fl.set
	if err := cu.check("cuCtxSetCurrent", cu.cuCtxSetCurrent(d.ctx)); err != nil {
		return err
	}
	for _, k := range which {
		dst := r.jobs[fl.idx[k]].Dst
		var err error
		if runs := r.devAt(fl.idx[k]); len(runs) > 0 {
			from := set.dOut.ptr + uintptr(fl.l.finalOff[k])
			for _, run := range runs {
				if err = d.copyOnDevice(run.to, from+uintptr(run.from), run.n, set.stream); err != nil {
					break
				}
			}
		} else {
			err = cu.check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), set.dOut.ptr+uintptr(fl.l.finalOff[k]),
				uint64(len(dst)), set.stream))
		}
		if err != nil {
			// Those queued already are waited for below.
			cu.cuEventRecord(set.out, set.stream)
			d.await(set.out, deadline, cancel)
			return d.deviceFailed(err)
		}
	}
	if err := cu.check("cuEventRecord", cu.cuEventRecord(set.out, set.stream)); err != nil {
		return d.deviceFailed(err)
	}
	return d.await(set.out, deadline, cancel)
}

func (c cudaRounds) close() {
	if c.d.trimStop != nil {
		close(c.d.trimStop)
		<-c.d.trimDone
		c.d.trimStop = nil
	}
	c.d.releaseHost()
	c.d.ctxMu.Lock()
	defer c.d.ctxMu.Unlock()
	c.d.teardown()
	if c.d.opts.ResetOnClose {
		c.d.cu.cuCtxSetCurrent(0)
		c.d.cu.cuDevicePrimaryCtxReset(c.d.dev)
	}
}

// abandon stops the Decoder's own goroutines and frees nothing: the device
// may still run the round that did not finish, and freeing what it uses
// (cuMemFree, unregistering pinned memory) would wait for it.
func (c cudaRounds) abandon() {
	d := c.d
	if d.trimStop != nil {
		close(d.trimStop)
		d.trimStop = nil
	}
	d.host.abandon()
}

// await waits for event ev until deadline, or until cancel is closed. A
// waiting driver call cannot be interrupted, so it runs on a goroutine of
// its own, which a device that never finishes keeps.
func (d *Decoder) await(ev uintptr, deadline time.Time, cancel <-chan struct{}) error {
	cu := d.cu
	switch r := cu.cuEventQuery(ev); r {
	case cuSuccess:
		return nil
	case cuErrNotReady:
	default:
		return d.deviceFailed(cu.check("cuEventQuery", r))
	}
	ctx := d.ctx
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cu.check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx)); err != nil {
			done <- err
			return
		}
		done <- cu.check("cuEventSynchronize", cu.cuEventSynchronize(ev))
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			return d.deviceFailed(err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("gpu: device %d: %w", d.opts.Device, errRoundTimeout)
	case <-cancel:
		return errRetiredWait
	}
}

// failAll marks the jobs not yet decoded as failed by err, wrapped as
// ErrUnsupported so that a caller retries them on the CPU, and returns err.
func (d *Decoder) failAll(jobs []codec.Job, idx []int, err error) error {
	for _, i := range idx {
		if jobs[i].Err == nil {
			jobs[i].Err = fmt.Errorf("gpu: batch not decoded: %w: %w", codec.ErrUnsupported, err)
		}
	}
	return err
}

// finish waits for a round's device work and checks nvCOMP's statuses,
// the decoded sizes and the fence. It returns each job's decoded bytes in
// pinned memory or its error; settle checks the trailers and copies out.
func (d *Decoder) finish(r *round, cancel <-chan struct{}) ([][]byte, []error, error) {
	cu, fl := d.cu, r.fl
	l, idx, set := fl.l, fl.idx, fl.set
	tw := time.Now()
	if err := d.await(set.end, r.deadline, cancel); err != nil {
		return nil, nil, err
	}
	tWait := time.Since(tw)
	// The device time of the round, and of each stage.
	ev := []uintptr{set.start, set.marks[0], set.marks[1], set.marks[2], set.end}
	elapsed := func(a, b uintptr) time.Duration {
		var ms float32
		cu.cuEventElapsedTime(&ms, a, b)
		return time.Duration(float64(ms) * float64(time.Millisecond))
	}
	launchErr := fl.launchErr
	le := binary.LittleEndian
	// Per-segment results: nvCOMP status and the decoded size.
	hout := set.hOut.bytes()
	jobErr := make([]error, len(idx))
	for k := range idx {
		if e := launchErr[k]; e != nil {
			jobErr[k] = fmt.Errorf("%w: %w", codec.ErrUnsupported, e)
		}
	}
	var segBase int64
	walked := d.walksLZ4() || l.walk
	for a := range numAlgos {
		for i, s := range l.segs[a] {
			g := segBase + int64(i)
			if jobErr[s.job] != nil {
				continue
			}
			if a == algoLZ4 && walked && le.Uint32(l.staged(hout, l.walkOff+4*int64(i))) != 0 {
				// The device's walk rejected the block, so nvCOMP did not
				// read it: the CPU decides, and says what is wrong.
				jobErr[s.job] = fmt.Errorf("gpu: LZ4 block rejected by the device's walk: %w", codec.ErrUnsupported)
				d.counts.walkRejected.Add(1)
				continue
			}
			st := nvStatus(int32(le.Uint32(l.staged(hout, l.statusOff+4*g))))
			got := int64(le.Uint64(l.staged(hout, l.actualOff+8*g)))
			// The stream passed the host checks, so nvCOMP's failure does not
			// make the chunk corrupt: for LZ4 the CPU decoder accepts it, and
			// for the other codecs only the CPU can tell.
			switch {
			case st != nvSuccess:
				jobErr[s.job] = fmt.Errorf("nvCOMP %s: %v on a stream the host checks passed: %w", algoSymbols[a], st, codec.ErrUnsupported)
			case got != s.n:
				jobErr[s.job] = fmt.Errorf("nvCOMP %s: decoded %d bytes of a stream the host checks passed, expected %d: %w",
					algoSymbols[a], got, s.n, codec.ErrUnsupported)
			default:
				continue
			}
			d.counts.disagreed.Add(1)
		}
		segBase += int64(len(l.segs[a]))
	}
	l.checkHashes(hout, jobErr, r.preps)
	if len(l.probes) > 0 {
		errs, escaped := l.fenceCheck(hout)
		if escaped {
			// The overrun may have reached other buffers: nothing the device
			// holds can be trusted any more.
			dead := errors.New("gpu: nvCOMP's deflate decoder wrote past the end of its output buffer")
			d.stateMu.Lock()
			d.dead = dead
			d.stateMu.Unlock()
			d.log.Error("gpu: decoding on the GPU is off until restart", "err", dead)
			return nil, nil, dead
		}
		// The fence's verdict wins over nvCOMP's status: an overrun into a
		// slot still being decoded can garble that decode too, and a good
		// chunk must then go to the CPU, not be called corrupt.
		for k, err := range errs {
			jobErr[k] = err
		}
		if len(errs) > 0 {
			d.log.Warn("gpu: nvCOMP's deflate decoder wrote past a stream's output; the fence kept it from other chunks",
				"chunks", len(errs))
		}
	}
	outs := make([][]byte, len(idx))
	r.pre = make([][]byte, len(idx))
	for k, ji := range idx {
		n := int64(len(r.jobs[ji].Dst))
		if !fl.directOut[k] {
			outs[k] = l.staged(hout, l.finalOff[k])[:n]
		}
		if at := l.preAt[k]; at >= 0 {
			r.pre[k] = l.staged(hout, at)[:n]
		}
	}
	r.times = DeviceTimes{elapsed(ev[0], ev[1]), elapsed(ev[1], ev[2]), elapsed(ev[2], ev[3]), elapsed(ev[3], ev[4])}
	r.stats = []any{"pack", fl.tPack, "device", elapsed(ev[0], ev[4]),
		"h2d", elapsed(ev[0], ev[1]), "nvcomp", elapsed(ev[1], ev[2]), "kernels", elapsed(ev[2], ev[3]), "d2h", elapsed(ev[3], ev[4]),
		"wait", tWait}
	return outs, jobErr, nil
}

// deviceFailed records a sticky error so the next round rebuilds the context.
func (d *Decoder) deviceFailed(err error) error {
	var ce *CUDAError
	if errors.As(err, &ce) && ce.Sticky() {
		d.stateMu.Lock()
		d.broken = err
		d.stateMu.Unlock()
		d.log.Warn("gpu: device error; the context will be reset", "err", err)
	}
	return err
}

// kparam is one kernel parameter: a value of size 8 (pointers, 64-bit
// counts) or 4 (32-bit counts) bytes.
type kparam struct {
	v    uint64
	size int
}

func u64(v uint64) kparam { return kparam{v, 8} }
func u32(v uint32) kparam { return kparam{uint64(v), 4} }

// launch starts kernel f (named name, for its errors) with grid (gx, gy)
// of bx threads and the parameters ps, in order.
func (d *Decoder) launch(set *bufSet, name string, f uintptr, gx, gy, bx uint32, ps ...kparam) error {
	// Argument values, 8 bytes apart, and the array of pointers to them
	// from byte 64 live in pinned host memory (C memory), so no Go pointer
	// is handed to the driver. The driver copies them at launch, so the
	// next launch may reuse the space.
	a := set.args.bytes()
	base := uint64(uintptr(set.args.p))
	for i, p := range ps {
		if p.size == 4 {
			binary.LittleEndian.PutUint32(a[8*i:], uint32(p.v))
		} else {
			binary.LittleEndian.PutUint64(a[8*i:], p.v)
		}
		binary.LittleEndian.PutUint64(a[64+8*i:], base+uint64(8*i))
	}
	return d.cu.check("cuLaunchKernel "+name, d.cu.cuLaunchKernel(f, gx, gy, 1, bx, 1, 1, 0, set.stream,
		unsafe.Add(set.args.p, 64), nil))
}

// walksLZ4 reports whether rounds walk their LZ4 blocks on the device.
func (d *Decoder) walksLZ4() bool { return d.opts.WalkOnDevice && !d.noValidate }

// parallel runs f(0..n-1) on the copy workers.
func (d *Decoder) parallel(n int, f func(i int)) { parallel.For(n, d.opts.CopyWorkers, f) }
