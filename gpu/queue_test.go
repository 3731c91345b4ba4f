package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/codec"
)

// These tests run the queue of callers (queue.go) over a fake device that
// decodes on the CPU, on any machine: which callers share a round, what a
// caller that gives up gets, and that the decoder never touches its memory
// afterwards. The GPU tests (TestGPUConcurrent*, TestGPUCancelled*) check
// the same over nvCOMP.

// fakeRounds is a device that decodes rounds with codec.Decode. It copies
// the compressed bytes at submit, as packing does, and decodes them in
// collect, which waits for a value on gate when gate is set.
type fakeRounds struct {
	t       *testing.T
	gate    chan struct{}
	submits chan *round // every submitted round, in order
	fail    func(r *round) error
	// hold, when set, keeps prepare waiting until it is closed: a driver
	// call that blocks behind a kernel that never ends.
	hold chan struct{}
	// prepareErr, when set, is what prepare returns for r (nil: ready).
	prepareErr func(r *round) error
	// holdStart, when set, keeps start waiting until it is closed: the
	// nvCOMP call that never returns behind a looping kernel.
	holdStart chan struct{}
	// direct: the device writes the Dst of every other job itself, in
	// finishDirect, as it does for pinned memory; directCalls counts them.
	direct      bool
	directCalls []int
	// emulated: rounds go through the emulated device pipeline (emulate,
	// nvCOMP stood in for by Go decoders of each format) rather than
	// codec.Decode.
	emulated bool

	trims atomic.Int64

	mu        sync.Mutex
	inFlight  map[int]bool
	srcs      map[*round][][]byte
	decoded   map[*round][][]byte // the direct jobs' bytes, for finishDirect
	closed    bool
	abandoned bool
}

func newFake(t *testing.T, gated bool) *fakeRounds {
	f := &fakeRounds{t: t, submits: make(chan *round, 1000), srcs: map[*round][][]byte{}, inFlight: map[int]bool{},
		decoded: map[*round][][]byte{}}
	if gated {
		f.gate = make(chan struct{})
	}
	return f
}

func (f *fakeRounds) needsIdle() bool { return false }

func (f *fakeRounds) trim() { f.trims.Add(1) }

func (f *fakeRounds) prepare(r *round) error {
	if f.hold != nil {
		<-f.hold
	}
	if f.prepareErr != nil {
		return f.prepareErr(r)
	}
	return nil
}

// pack copies the compressed bytes, as packing into staging does.
func (f *fakeRounds) pack(r *round) {
	srcs := make([][]byte, len(r.jobs))
	for k, j := range r.jobs {
		srcs[k] = bytes.Clone(j.Src)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.srcs[r] = srcs
}

func (f *fakeRounds) start(r *round) error {
	if f.holdStart != nil {
		<-f.holdStart
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inFlight[r.set] {
		f.t.Errorf("round submitted on set %d while its last round is in flight", r.set)
	}
	f.inFlight[r.set] = true
	f.submits <- r
	return nil
}

func (f *fakeRounds) collect(r *round, cancel <-chan struct{}) ([][]byte, []error, error) {
	if f.gate != nil {
		t := time.NewTimer(time.Until(r.deadline))
		defer t.Stop()
		select {
		case <-f.gate:
		case <-t.C:
			return nil, nil, errRoundTimeout
		case <-cancel:
			return nil, nil, errRetiredWait
		}
	}
	f.mu.Lock()
	srcs := f.srcs[r]
	delete(f.srcs, r)
	f.inFlight[r.set] = false
	f.mu.Unlock()
	if f.fail != nil {
		if err := f.fail(r); err != nil {
			return nil, nil, err
		}
	}
	if f.emulated {
		jobs := make([]codec.Job, len(r.jobs))
		for k, j := range r.jobs {
			jobs[k] = codec.Job{Codec: j.Codec, Src: srcs[k], Dst: make([]byte, len(j.Dst))}
		}
		outs, pres, errs := emulateRound(jobs, alignCases[0].aligns, r.elemSize, false, nil)
		r.pre = pres
		return f.directly(r, outs), errs, nil
	}
	outs := make([][]byte, len(r.jobs))
	errs := make([]error, len(r.jobs))
	for k, j := range r.jobs {
		outs[k] = make([]byte, len(j.Dst))
		if errs[k] = codec.Decode(j.Codec, outs[k], srcs[k]); errs[k] == nil && r.elemSize > 1 {
			swapInPlace(outs[k], r.elemSize)
		}
	}
	return f.directly(r, outs), errs, nil
}

// directly keeps, with f.direct, every other job's bytes for finishDirect
// and returns nil for them, as the device does for a pinned Dst.
func (f *fakeRounds) directly(r *round, outs [][]byte) [][]byte {
	if !f.direct {
		return outs
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := make([][]byte, len(outs))
	for k := range outs {
		if k%2 == 0 {
			kept[k], outs[k] = outs[k], nil
		}
	}
	f.decoded[r] = kept
	return outs
}

func (f *fakeRounds) finishDirect(r *round, which []int, deadline time.Time, cancel <-chan struct{}) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range which {
		if f.decoded[r][k] == nil {
			f.t.Errorf("finishDirect of job %d, which the device did not keep", k)
			continue
		}
		copy(r.jobs[k].Dst, f.decoded[r][k])
		f.directCalls = append(f.directCalls, k)
	}
	delete(f.decoded, r)
	return nil
}

func (f *fakeRounds) abandon() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.abandoned = true
}

func (f *fakeRounds) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		f.t.Error("device closed twice")
	}
	f.closed = true
}

func swapInPlace(b []byte, size int) {
	for i := 0; i+size <= len(b); i += size {
		for k := range size / 2 {
			b[i+k], b[i+size-1-k] = b[i+size-1-k], b[i+k]
		}
	}
}

// newFakeDecoder is a Decoder over f; the test closes it.
func newFakeDecoder(f *fakeRounds, opts Options) *Decoder {
	opts, log := opts.withDefaults()
	d := &Decoder{opts: opts, log: log}
	d.start(f)
	return d
}

// caller is one DecodeBatchSwap call's jobs and what they must decode to.
type caller struct {
	jobs     []codec.Job
	want     [][]byte
	elemSize int
	ctx      context.Context
	cancel   context.CancelFunc
	err      chan error
}

// newCaller makes n jobs of the codecs the fake decodes, seeded by id.
func newCaller(id, n, elemSize int) *caller {
	c := &caller{elemSize: elemSize, err: make(chan error, 1)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for k := range n {
		data := field(12, 16+k, uint64(id*100+k))
		var src []byte
		name := codec.Zstd
		switch k % 3 {
		case 1:
			name = codec.LZ4
		case 2:
			name = codec.Blosc
			src = bloscCompress(data, 4, 256, codec.ByteShuffle, "lz4")
		}
		if src == nil {
			src = compress(name, data)
		}
		want := bytes.Clone(data)
		if elemSize > 1 {
			swapInPlace(want, elemSize)
		}
		c.jobs = append(c.jobs, codec.Job{Codec: name, Src: src, Dst: make([]byte, len(data))})
		c.want = append(c.want, want)
	}
	return c
}

func (c *caller) run(d *Decoder) {
	go func() { c.err <- d.DecodeBatchSwap(c.ctx, c.jobs, c.elemSize) }()
}

// check waits for the call and compares every job with what it must hold.
func (c *caller) check(t *testing.T, name string) {
	t.Helper()
	if err := <-c.err; err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for k, j := range c.jobs {
		if j.Err != nil {
			t.Fatalf("%s job %d: %v", name, k, j.Err)
		}
		if !bytes.Equal(j.Dst, c.want[k]) {
			t.Fatalf("%s job %d: wrong bytes", name, k)
		}
	}
}

// owns reports whether round r holds job k of c.
func (c *caller) owns(r *round) int {
	n := 0
	for _, j := range r.jobs {
		for _, cj := range c.jobs {
			if &j.Dst[0] == &cj.Dst[0] {
				n++
			}
		}
	}
	return n
}

// enqueued is the number of requests queued so far.
func enqueued(d *Decoder) int {
	d.qmu.Lock()
	defer d.qmu.Unlock()
	return int(d.seq)
}

// waitQueued waits until n more requests than base have been queued.
// While every buffer set is busy, queued requests wait for the next round.
func waitQueued(d *Decoder, base, n int) {
	for enqueued(d) < base+n {
		runtime.Gosched()
	}
}

// busy fills every buffer set with one-job rounds that wait on the gate.
func busy(t *testing.T, d *Decoder, f *fakeRounds) []*caller {
	var cs []*caller
	for i := range d.opts.Streams {
		c := newCaller(900+i, 1, 0)
		c.run(d)
		if r := <-f.submits; c.owns(r) != 1 || len(r.jobs) != 1 {
			t.Fatalf("round %d: %d jobs, want the one of its caller", i, len(r.jobs))
		}
		cs = append(cs, c)
	}
	return cs
}

func TestQueueMergesWaitingCallers(t *testing.T) {
	f := newFake(t, true)
	d := newFakeDecoder(f, Options{})
	defer d.Close()
	first := busy(t, d, f)
	base := enqueued(d)
	var waiting []*caller
	for i := range 4 {
		c := newCaller(i, 3, 0)
		c.run(d)
		waiting = append(waiting, c)
	}
	waitQueued(d, base, len(waiting))
	f.gate <- struct{}{} // the first round finishes, a set frees up
	r := <-f.submits
	if r.callers != len(waiting) || len(r.jobs) != 3*len(waiting) {
		t.Fatalf("the waiting callers' round has %d jobs of %d callers, want %d of %d",
			len(r.jobs), r.callers, 3*len(waiting), len(waiting))
	}
	for i, c := range waiting {
		if n := c.owns(r); n != 3 {
			t.Fatalf("caller %d has %d jobs in the merged round, want 3", i, n)
		}
	}
	close(f.gate)
	for i, c := range append(first, waiting...) {
		c.check(t, fmt.Sprintf("caller %d", i))
	}
}

func TestQueueRoundBounds(t *testing.T) {
	f := newFake(t, true)
	// Each job costs one to three KB (compressed bytes, about 1 KB decoded,
	// alignment, blosc's shuffle scratch): half of an 8 KiB memory bound
	// holds one to three a round.
	d := newFakeDecoder(f, Options{MaxBatchBytes: 8 << 10, Streams: 2})
	defer d.Close()
	first := busy(t, d, f)
	base := enqueued(d)
	c := newCaller(1, 6, 0)
	c.run(d)
	waitQueued(d, base, 1)
	close(f.gate)
	total := 0
	for total < len(c.jobs) {
		r := <-f.submits
		var cost int64
		for k := range r.jobs {
			cost += r.preps[k].cost(int64(len(r.jobs[k].Dst)))
		}
		if len(r.jobs) > 1 && cost > d.opts.share() {
			t.Fatalf("round of %d jobs costs %d bytes, over its share %d of the bound", len(r.jobs), cost, d.opts.share())
		}
		total += c.owns(r)
	}
	for i, c := range append(first, c) {
		c.check(t, fmt.Sprintf("caller %d", i))
	}
}

func TestQueueElemSizesNotMerged(t *testing.T) {
	f := newFake(t, true)
	d := newFakeDecoder(f, Options{})
	defer d.Close()
	first := busy(t, d, f)
	base := enqueued(d)
	p, q, r := newCaller(1, 2, 4), newCaller(2, 2, 2), newCaller(3, 2, 4)
	for i, c := range []*caller{p, q, r} {
		c.run(d)
		waitQueued(d, base, i+1) // one at a time, so the queue's order is known
	}
	close(f.gate)
	r1, r2 := <-f.submits, <-f.submits
	if r1.elemSize != 4 || p.owns(r1) != 2 || r.owns(r1) != 2 || q.owns(r1) != 0 {
		t.Fatalf("first round (elemSize %d) should hold the two 4-byte callers only", r1.elemSize)
	}
	if r2.elemSize != 2 || q.owns(r2) != 2 || len(r2.jobs) != 2 {
		t.Fatalf("second round (elemSize %d) should hold the 2-byte caller only", r2.elemSize)
	}
	for i, c := range append(first, p, q, r) {
		c.check(t, fmt.Sprintf("caller %d", i))
	}
}

// sentinel fills b with a byte no decoded chunk here is made of.
func sentinel(b []byte) {
	for i := range b {
		b[i] = 0xAB
	}
}

func untouched(b []byte) bool {
	for _, x := range b {
		if x != 0xAB {
			return false
		}
	}
	return true
}

func TestQueueCancelInFlight(t *testing.T) {
	f := newFake(t, true)
	d := newFakeDecoder(f, Options{})
	first := busy(t, d, f)
	base := enqueued(d)
	x, y := newCaller(1, 2, 0), newCaller(2, 3, 0)
	x.run(d)
	y.run(d)
	waitQueued(d, base, 2)
	f.gate <- struct{}{}
	r := <-f.submits
	if x.owns(r) != 2 || y.owns(r) != 3 {
		t.Fatalf("x and y should share the round: %d and %d of its %d jobs", x.owns(r), y.owns(r), len(r.jobs))
	}
	// Their round is in flight (the completer waits at the gate for the
	// second round): x gives up and must return now.
	x.cancel()
	if err := <-x.err; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller returned %v", err)
	}
	var errs []string
	for k, j := range x.jobs {
		if !errors.Is(j.Err, codec.ErrUnsupported) || !errors.Is(j.Err, context.Canceled) {
			t.Fatalf("cancelled caller's job %d: %v, want ErrUnsupported and context.Canceled", k, j.Err)
		}
		errs = append(errs, j.Err.Error())
		sentinel(j.Dst)
	}
	close(f.gate)
	for i, c := range append(first, y) {
		c.check(t, fmt.Sprintf("caller %d", i))
	}
	d.Close() // every round settled
	for k, j := range x.jobs {
		if !untouched(j.Dst) || j.Err.Error() != errs[k] {
			t.Fatalf("cancelled caller's job %d was written after its call returned", k)
		}
	}
}

func TestQueueCancelQueued(t *testing.T) {
	f := newFake(t, true)
	d := newFakeDecoder(f, Options{})
	first := busy(t, d, f)
	base := enqueued(d)
	x, y := newCaller(1, 2, 0), newCaller(2, 2, 0)
	x.run(d)
	y.run(d)
	waitQueued(d, base, 2)
	x.cancel()
	if err := <-x.err; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller returned %v", err)
	}
	close(f.gate)
	for i, c := range append(first, y) {
		c.check(t, fmt.Sprintf("caller %d", i))
	}
	d.Close()
	close(f.submits)
	for r := range f.submits {
		if x.owns(r) > 0 {
			t.Fatal("the jobs of a caller that gave up while queued reached the device")
		}
	}
}

func TestQueueRoundFailure(t *testing.T) {
	f := newFake(t, true)
	errDevice := errors.New("device lost")
	bad := newCaller(1, 2, 0)
	f.fail = func(r *round) error {
		if bad.owns(r) > 0 {
			return errDevice
		}
		return nil
	}
	d := newFakeDecoder(f, Options{})
	defer d.Close()
	bad.run(d)
	<-f.submits
	good := newCaller(2, 2, 0)
	good.run(d)
	<-f.submits
	close(f.gate)
	if err := <-bad.err; !errors.Is(err, errDevice) {
		t.Fatalf("caller of the failed round returned %v", err)
	}
	for k, j := range bad.jobs {
		if !errors.Is(j.Err, codec.ErrUnsupported) || !errors.Is(j.Err, errDevice) {
			t.Fatalf("failed round's job %d: %v", k, j.Err)
		}
	}
	good.check(t, "caller of the other round")
	later := newCaller(3, 2, 0)
	later.run(d)
	later.check(t, "caller after the failure")
}

func TestQueueJobErrorsStayPerJob(t *testing.T) {
	f := newFake(t, false)
	d := newFakeDecoder(f, Options{})
	defer d.Close()
	c := newCaller(1, 3, 0)
	c.jobs[1].Src = bytes.Clone(c.jobs[1].Src)
	// A valid LZ4 header with a damaged block: the host checks reject it.
	for i := 4; i < len(c.jobs[1].Src); i++ {
		c.jobs[1].Src[i] = 0xFF
	}
	if err := d.DecodeBatch(context.Background(), c.jobs); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(c.jobs[1].Err, codec.ErrCorrupt) {
		t.Fatalf("damaged job: %v", c.jobs[1].Err)
	}
	for _, k := range []int{0, 2} {
		if c.jobs[k].Err != nil || !bytes.Equal(c.jobs[k].Dst, c.want[k]) {
			t.Fatalf("good job %d next to a damaged one: %v", k, c.jobs[k].Err)
		}
	}
}

// TestQueueStats: Stats counts each job by its outcome, whichever path
// gave it: decoded, corrupt (the host checks), left to the CPU (a codec
// refused, a zstd frame without checksum under default Options).
func TestQueueStats(t *testing.T) {
	f := newFake(t, false)
	d := newFakeDecoder(f, Options{})
	defer d.Close()
	data := field(20, 30, 1)
	lz := compress(codec.LZ4, data)
	damaged := bytes.Clone(lz)
	damaged = damaged[:len(damaged)-3]
	jobs := []codec.Job{
		{Codec: codec.LZ4, Src: lz, Dst: make([]byte, len(data))},
		{Codec: codec.Zstd, Src: compress(codec.Zstd, data), Dst: make([]byte, len(data))}, // with a checksum
		{Codec: codec.LZ4, Src: damaged, Dst: make([]byte, len(data))},
		{Codec: codec.Zstd, Src: zstdNoCRC(data), Dst: make([]byte, len(data))}, // without
		{Codec: codec.Gzip, Src: compress(codec.Gzip, data), Dst: make([]byte, len(data))},
	}
	if err := d.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	got := d.Stats()
	if want := (Stats{Chunks: 2, Bytes: got.Bytes, Corrupt: 1, Refused: 2, Rounds: got.Rounds}); got != want || got.Bytes != 2*int64(len(data)) || got.Rounds == 0 {
		t.Fatalf("Stats %+v, want %+v (jobs: %v %v %v %v %v)", got, want, jobs[0].Err, jobs[1].Err, jobs[2].Err, jobs[3].Err, jobs[4].Err)
	}
}

// TestCorruptEmulated runs the GPU's damaged-chunk test (corruptRounds)
// over the emulated device, whose stand-ins for nvCOMP are Go decoders of
// each format: what it shows is the test's own bookkeeping (Stats against
// the jobs, which good chunks go where under each Options) and that the
// host checks keep from the device what those decoders would accept and
// the CPU decoder rejects, without a GPU. Since the stand-ins decode what
// the CPU decodes, a chunk accepted by the GPU only fails it under every
// Options: with Deflate on, that is the host's Adler-32 check of blosc
// zlib streams (they decode into scratch the host sees only because the
// round copies it back) and zlib's mismatch going to the CPU (bytes after
// a zlib trailer, which the CPU decoder accepts).
func TestCorruptEmulated(t *testing.T) {
	filter := regexp.MustCompile(`^(zstd|lz4|gzip|zlib|blosc-(lz4|zstd|zlib)-|blosc-raw).*/`)
	for _, c := range []struct {
		name string
		opts Options
	}{{"default", Options{}}, {"unverified", Options{Unverified: true}}, {"deflate", Options{Deflate: true}},
		{"deflate+unverified", Options{Deflate: true, Unverified: true}}} {
		opts := c.opts
		t.Run(c.name, func(t *testing.T) {
			logs := &warnCounter{n: map[string]int{}}
			opts.Logger = slog.New(logs)
			f := newFake(t, false)
			f.emulated = true
			d := newFakeDecoder(f, opts)
			defer d.Close()
			corruptRounds(t, d, opts, logs, filter, 2, nil)
		})
	}
}

func TestQueueClose(t *testing.T) {
	f := newFake(t, true)
	d := newFakeDecoder(f, Options{})
	first := busy(t, d, f)
	base := enqueued(d)
	w := newCaller(1, 2, 0)
	w.run(d)
	waitQueued(d, base, 1)
	closed := make(chan struct{})
	go func() { d.Close(); close(closed) }()
	for {
		d.qmu.Lock()
		c := d.closing
		d.qmu.Unlock()
		if c {
			break
		}
		runtime.Gosched()
	}
	close(f.gate)
	<-closed
	for i, c := range first {
		c.check(t, fmt.Sprintf("round in flight at Close %d", i))
	}
	if err := <-w.err; !errors.Is(err, codec.ErrClosed) {
		t.Fatalf("caller queued at Close: %v", err)
	}
	for k, j := range w.jobs {
		if !errors.Is(j.Err, codec.ErrUnsupported) {
			t.Fatalf("caller queued at Close, job %d: %v", k, j.Err)
		}
	}
	late := newCaller(2, 1, 0)
	if err := d.DecodeBatch(context.Background(), late.jobs); !errors.Is(err, codec.ErrClosed) || !errors.Is(late.jobs[0].Err, codec.ErrUnsupported) {
		t.Fatalf("DecodeBatch after Close: %v, job: %v", err, late.jobs[0].Err)
	}
	d.Close() // idempotent
}

// TestQueueStress runs many callers at once, some giving up at random
// moments, over a fake device without a gate. Callers that finish get
// every byte right; those that give up keep, after their call returns,
// exactly what they had (the race detector watches the rest).
func TestQueueStress(t *testing.T) {
	f := newFake(t, false)
	d := newFakeDecoder(f, Options{MaxBatchBytes: 64 << 10})
	type gaveUp struct {
		jobs []codec.Job
		errs []error
	}
	var mu sync.Mutex
	var quit []gaveUp
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for it := range 8 {
				c := newCaller(g*10+it, 1+r.IntN(6), []int{0, 2, 4}[r.IntN(3)])
				ctx, cancel := context.WithCancel(context.Background())
				giveUp := r.IntN(3) == 0
				if giveUp {
					spins := r.IntN(50)
					go func() {
						for range spins {
							runtime.Gosched()
						}
						cancel()
					}()
				}
				err := d.DecodeBatchSwap(ctx, c.jobs, c.elemSize)
				cancel()
				switch {
				case err == nil:
					for k, j := range c.jobs {
						if j.Err != nil || !bytes.Equal(j.Dst, c.want[k]) {
							t.Errorf("caller %d/%d job %d: %v", g, it, k, j.Err)
						}
					}
				case errors.Is(err, context.Canceled) && giveUp:
					gu := gaveUp{jobs: c.jobs}
					for k, j := range c.jobs {
						if j.Err == nil && !bytes.Equal(j.Dst, c.want[k]) {
							t.Errorf("caller %d/%d job %d (%s, elem %d, %d bytes, zero %v): finished before the cancel, wrong bytes", g, it, k, j.Codec, c.elemSize, len(j.Dst), bytes.Count(j.Dst, []byte{0}) == len(j.Dst))
						}
						if j.Err == nil {
							continue
						}
						if !errors.Is(j.Err, codec.ErrUnsupported) {
							t.Errorf("caller %d/%d job %d: %v", g, it, k, j.Err)
						}
						sentinel(j.Dst)
					}
					for _, j := range c.jobs {
						gu.errs = append(gu.errs, j.Err)
					}
					mu.Lock()
					quit = append(quit, gu)
					mu.Unlock()
				default:
					t.Errorf("caller %d/%d: %v", g, it, err)
				}
			}
		})
	}
	wg.Wait()
	d.Close()
	for _, gu := range quit {
		for k, j := range gu.jobs {
			if j.Err != gu.errs[k] || (j.Err != nil && !untouched(j.Dst)) {
				t.Fatal("a job of a caller that gave up was written after its call returned")
			}
		}
	}
	t.Logf("%d callers gave up mid-way", len(quit))
}

// A round whose buffers do not fit the device's bounds beside the other
// sets' buffers waits for every set, has their buffers freed and is
// readied again alone, and later rounds are cut: its chunks decode on the
// GPU, not the CPU. With one set there is nothing to free, and the round's
// jobs fail as refused (ErrUnsupported, for the CPU).
func TestQueueBudgetRetriedAlone(t *testing.T) {
	budget := func(r *round) error {
		if !r.exclusive {
			return fmt.Errorf("device memory: %w: 1 bytes more", ErrBudget)
		}
		return nil
	}
	f := newFake(t, false)
	f.prepareErr = budget
	d := newFakeDecoder(f, Options{Streams: 2})
	c := newCaller(1, 4, 0)
	c.run(d)
	c.check(t, "caller")
	d.Close()
	// Buffers are freed only to ready a round alone.
	if f.trims.Load() == 0 {
		t.Fatal("no buffers freed: the round was not readied alone")
	}
	// Rounds to come are cut, so that they fit beside each other.
	if d.roundLimit() >= d.opts.share() {
		t.Fatalf("round limit %d after a retry, share %d: rounds not cut", d.roundLimit(), d.opts.share())
	}

	f = newFake(t, false)
	f.prepareErr = budget
	d = newFakeDecoder(f, Options{Streams: 1})
	defer d.Close()
	c = newCaller(2, 2, 0)
	c.run(d)
	err := <-c.err
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("one set: %v, want the budget's error", err)
	}
	for k, j := range c.jobs {
		if !errors.Is(j.Err, codec.ErrUnsupported) {
			t.Fatalf("one set: job %d: %v, want it left to the CPU", k, j.Err)
		}
	}
	if f.trims.Load() != 0 {
		t.Fatal("one set: buffers freed with nothing to gain")
	}
}

// Rounds cut after one did not fit beside the others grow back, doubling
// after growAfter rounds in a row fitted at the cut size, until the cut is
// lifted; a miss meanwhile cuts them again.
func TestQueueRoundsGrowBack(t *testing.T) {
	var miss atomic.Bool
	miss.Store(true)
	f := newFake(t, false)
	f.prepareErr = func(r *round) error {
		if miss.Load() && !r.exclusive {
			return fmt.Errorf("device memory: %w: 1 bytes more", ErrBudget)
		}
		return nil
	}
	d := newFakeDecoder(f, Options{Streams: 2, MaxBatchBytes: 256 << 20})
	defer d.Close()
	run := func(n int) {
		for i := range n {
			c := newCaller(i, 2, 0)
			c.run(d)
			c.check(t, "caller")
		}
	}
	run(1)
	cut := d.roundLimit()
	if cut >= d.opts.share() {
		t.Fatalf("round limit %d after a miss, share %d: rounds not cut", cut, d.opts.share())
	}
	miss.Store(false)
	run(growAfter - 1)
	if got := d.roundLimit(); got != cut {
		t.Fatalf("round limit %d after %d rounds that fitted, want the cut %d kept until %d", got, growAfter-1, cut, growAfter)
	}
	run(1)
	if got := d.roundLimit(); got != 2*cut {
		t.Fatalf("round limit %d after %d rounds that fitted, want it doubled from %d", got, growAfter, cut)
	}
	// A miss while growing cuts again, and the streak starts over.
	miss.Store(true)
	run(1)
	if got := d.roundLimit(); got != cut {
		t.Fatalf("round limit %d after a second miss at %d, want %d", got, 2*cut, cut)
	}
	miss.Store(false)
	for d.roundLimit() < d.opts.share() {
		before := d.roundLimit()
		run(growAfter)
		if d.roundLimit() <= before {
			t.Fatalf("round limit stuck at %d after %d rounds that fitted", before, growAfter)
		}
	}
	if d.roundCap.Load() != 0 {
		t.Fatalf("cut %d left in place at the share", d.roundCap.Load())
	}
}
