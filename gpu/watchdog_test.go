package gpu

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/codec"
)

// These tests run the watchdog (watchdog.go) over the fake device of
// queue_test.go: a round that never completes, and a device call that
// never returns while a round is readied, must each release every caller
// with jobs for the CPU, retire the Decoder for good, and leave Close
// unblocked and the device's resources untouched.

// released waits for c's call and checks that every job came back for the
// CPU because the device hung.
func released(t *testing.T, c *caller, name string, within time.Duration) {
	t.Helper()
	select {
	case err := <-c.err:
		if !errors.Is(err, ErrHung) {
			t.Fatalf("%s: DecodeBatch returned %v, want ErrHung", name, err)
		}
	case <-time.After(within):
		t.Fatalf("%s: still waiting %v after the round's deadline: a hung device holds up its callers", name, within)
	}
	for k, j := range c.jobs {
		if !errors.Is(j.Err, codec.ErrUnsupported) || !errors.Is(j.Err, ErrHung) {
			t.Fatalf("%s job %d: %v, want ErrUnsupported and ErrHung (the CPU decodes it)", name, k, j.Err)
		}
	}
}

// closesPromptly closes d and checks that the device was abandoned, not
// torn down.
func closesPromptly(t *testing.T, d *Decoder, f *fakeRounds) {
	t.Helper()
	done := make(chan struct{})
	go func() { d.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close of a retired Decoder waits for its hung device")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		t.Error("a hung device was torn down (freeing what it may still use would wait for it)")
	}
}

func TestWatchdogRoundNeverCompletes(t *testing.T) {
	f := newFake(t, true) // the gate never opens: rounds never complete
	d := newFakeDecoder(f, Options{RoundTimeout: 50 * time.Millisecond, Streams: 2})
	first := busy(t, d, f) // both sets hold a round that never completes
	base := enqueued(d)
	queued := newCaller(1, 3, 0) // waits for a set
	queued.run(d)
	waitQueued(d, base, 1)
	t0 := time.Now()
	for _, c := range first {
		released(t, c, "caller of a hung round", 5*time.Second)
	}
	released(t, queued, "caller queued behind hung rounds", 5*time.Second)
	if dt := time.Since(t0); dt > 3*time.Second {
		t.Errorf("callers released after %v, their rounds' deadline is about 50 ms", dt)
	}
	if err := d.Retired(); !errors.Is(err, ErrHung) {
		t.Fatalf("Retired: %v, want ErrHung", err)
	}
	// Later batches go to the CPU at once: nothing reaches the device.
	n := len(f.submits)
	late := newCaller(2, 2, 0)
	if err := d.DecodeBatch(context.Background(), late.jobs); !errors.Is(err, ErrHung) {
		t.Fatalf("DecodeBatch after the hang: %v", err)
	}
	for k, j := range late.jobs {
		if !errors.Is(j.Err, codec.ErrUnsupported) {
			t.Fatalf("job %d after the hang: %v", k, j.Err)
		}
	}
	if len(f.submits) != n {
		t.Error("a batch reached the device after it was retired")
	}
	if s := d.Stats(); s.Chunks != 0 || s.Refused != int64(len(first)+3+2) {
		t.Errorf("Stats %+v: want every job refused (for the CPU)", s)
	}
	closesPromptly(t, d, f)
	// The submitter, once out of its last round, abandons the device.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		f.mu.Lock()
		abandoned := f.abandoned
		f.mu.Unlock()
		if abandoned {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hung device was never abandoned")
		}
	}
}

func TestWatchdogPrepareNeverReturns(t *testing.T) {
	f := newFake(t, false)
	f.hold = make(chan struct{}) // prepare blocks, as cuMemFree behind a looping kernel
	defer close(f.hold)
	d := newFakeDecoder(f, Options{RoundTimeout: 50 * time.Millisecond})
	a, b := newCaller(1, 2, 0), newCaller(2, 4, 0)
	a.run(d)
	b.run(d)
	released(t, a, "caller whose round is being readied", 5*time.Second)
	released(t, b, "second caller", 5*time.Second)
	if err := d.Retired(); !errors.Is(err, ErrHung) {
		t.Fatalf("Retired: %v, want ErrHung", err)
	}
	closesPromptly(t, d, f)
}

// The nvCOMP call that starts a round never returns (seen on an H200 with a
// damaged blosc zstd chunk under Options.Unverified), while the submitter
// holds its callers' locks: the watchdog still releases every caller.
func TestWatchdogStartNeverReturns(t *testing.T) {
	f := newFake(t, false)
	f.holdStart = make(chan struct{})
	defer close(f.holdStart)
	d := newFakeDecoder(f, Options{RoundTimeout: 50 * time.Millisecond})
	a := newCaller(1, 2, 0)
	a.run(d)
	released(t, a, "caller whose round is being started", 5*time.Second)
	if err := d.Retired(); !errors.Is(err, ErrHung) {
		t.Fatalf("Retired: %v, want ErrHung", err)
	}
	b := newCaller(2, 2, 0)
	b.run(d)
	released(t, b, "caller after the retirement", 5*time.Second)
}

// A round that takes a while, within its deadline, is no hang.
func TestWatchdogSlowRoundIsNoHang(t *testing.T) {
	f := newFake(t, true)
	d := newFakeDecoder(f, Options{RoundTimeout: 300 * time.Millisecond})
	defer d.Close()
	c := newCaller(1, 3, 0)
	c.run(d)
	<-f.submits
	time.Sleep(100 * time.Millisecond)
	close(f.gate)
	c.check(t, "slow round")
	time.Sleep(400 * time.Millisecond) // past the deadline: the settled round's timer must not fire
	if err := d.Retired(); err != nil {
		t.Fatalf("a round done within its deadline retired the device: %v", err)
	}
	newCaller(2, 2, 0).run(d)
}

// Jobs whose Dst the device writes itself (pinned memory) get their bytes
// in finishDirect, and a caller that gave up before it is never written.
func TestQueueDirectOutput(t *testing.T) {
	f := newFake(t, true)
	f.direct = true
	d := newFakeDecoder(f, Options{})
	first := busy(t, d, f)
	base := enqueued(d)
	x, y := newCaller(1, 4, 0), newCaller(2, 4, 0)
	x.run(d)
	y.run(d)
	waitQueued(d, base, 2)
	f.gate <- struct{}{} // a set frees up: x and y share the next round
	if r := <-f.submits; x.owns(r) != 4 || y.owns(r) != 4 {
		t.Fatalf("x and y should share the round: %d and %d of its %d jobs", x.owns(r), y.owns(r), len(r.jobs))
	}
	// Their round is in flight: x gives up, and its Dst must stay as it
	// leaves them.
	x.cancel()
	if err := <-x.err; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}
	for _, j := range x.jobs {
		sentinel(j.Dst)
	}
	close(f.gate)
	for _, c := range append(first, y) {
		c.check(t, "caller with direct outputs")
	}
	d.Close()
	for k, j := range x.jobs {
		if !untouched(j.Dst) {
			t.Fatalf("job %d of a caller that gave up was written", k)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.directCalls) == 0 {
		t.Fatal("no job went through finishDirect")
	}
}

func TestRoundTimeoutRefusesNegative(t *testing.T) {
	if _, err := New(Options{RoundTimeout: -time.Second}); err == nil || errors.Is(err, ErrNoGPU) {
		t.Fatalf("New with a negative RoundTimeout: %v, want it refused", err)
	}
}

// A caller that gives up while its round's start hangs returns at once:
// the start's driver calls hold no caller's lock.
func TestWatchdogGiveUpWhileStartHangs(t *testing.T) {
	f := newFake(t, false)
	f.holdStart = make(chan struct{})
	defer close(f.holdStart)
	d := newFakeDecoder(f, Options{RoundTimeout: time.Hour})
	a := newCaller(1, 2, 0)
	a.run(d)
	for packed := 0; packed == 0; time.Sleep(time.Millisecond) {
		f.mu.Lock() // until the round is packed and its start hangs
		packed = len(f.srcs)
		f.mu.Unlock()
	}
	a.cancel()
	select {
	case err := <-a.err:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("DecodeBatch: %v, want the caller's cancellation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a caller that gave up while its round's start hung is still waiting")
	}
}

// Over the fake GPU (the whole Decoder), nvCOMP's call never returns while
// a caller's jobs in pinned memory are on the device: that caller gives
// up, and returns once the device is retired (its round is never
// collected); the watchdog releases the caller queued behind it; and
// neither's Dst is written.
func TestWatchdogHungNvcompPinned(t *testing.T) {
	f := newFakeGPU()
	f.hold = make(chan struct{})
	defer close(f.hold)
	d := f.decoder(t, Options{RoundTimeout: 50 * time.Millisecond})
	all, _, names := genJobs(t, 40, 60)
	var jobs []codec.Job // codecs the GPU takes by default
	for i, n := range names {
		if n == "zstd" || n == "lz4" || strings.HasPrefix(n, "blosc-lz4-") {
			jobs = append(jobs, all[i])
		}
	}
	var callers []*caller
	for i := range 2 {
		c := &caller{err: make(chan error, 1)}
		c.ctx, c.cancel = context.WithCancel(context.Background())
		for _, j := range jobs[:3] {
			src := d.HostAllocWait(len(j.Src), 10*time.Second)
			copy(src, j.Src)
			dst := d.HostAllocWait(len(j.Dst), 10*time.Second)
			if !d.pinned(src) || !d.pinned(dst) {
				t.Fatal("HostAllocWait lent memory that is not pinned")
			}
			sentinel(dst)
			c.jobs = append(c.jobs, codec.Job{Codec: j.Codec, Src: src, Dst: dst})
		}
		c.run(d)
		callers = append(callers, c)
		if i == 0 {
			time.Sleep(20 * time.Millisecond) // the first round is on the device
		}
	}
	// The first caller's round is packed and nvCOMP hangs on it; it gives
	// up. The second waits in the queue behind it.
	callers[0].cancel()
	released(t, callers[1], "caller queued behind a round nvCOMP never finishes", 5*time.Second)
	select {
	case <-callers[0].err:
	case <-time.After(5 * time.Second):
		t.Fatal("a caller that gave up on a hung device is still waiting for it")
	}
	if err := d.Retired(); !errors.Is(err, ErrHung) {
		t.Fatalf("Retired: %v, want ErrHung", err)
	}
	for i, c := range callers {
		for k, j := range c.jobs {
			if !untouched(j.Dst) {
				t.Errorf("caller %d job %d: a hung device wrote its Dst", i, k)
			}
		}
	}
}

// A round readied alone after the budget (TestQueueBudgetRetriedAlone)
// first waits for the other rounds; that wait is not its readying, so its
// watch starts again once it holds every set. Here the other round takes
// longer than the waiting round's own limit, within its own (its bytes buy
// it time): the GPU must not be retired as hung, and both callers decode.
func TestWatchdogBudgetWaitNotHung(t *testing.T) {
	f := newFake(t, true)
	big := make([]byte, 16<<20) // 16 MiB decoded: a quarter of a second on top of RoundTimeout
	f.prepareErr = func(r *round) error {
		for _, j := range r.jobs {
			if len(j.Dst) == len(big) {
				return nil
			}
		}
		if !r.exclusive {
			return fmt.Errorf("device memory: %w: 1 bytes more", ErrBudget)
		}
		return nil
	}
	d := newFakeDecoder(f, Options{RoundTimeout: 100 * time.Millisecond, Streams: 2})
	defer d.Close()
	long := &caller{err: make(chan error, 1), jobs: []codec.Job{{Codec: codec.Zstd, Src: compress(codec.Zstd, big), Dst: make([]byte, len(big))}},
		want: [][]byte{big}}
	long.ctx, long.cancel = context.WithCancel(context.Background())
	long.run(d)
	<-f.submits // the long round is on the device, in collect behind the gate
	short := newCaller(1, 3, 0)
	short.run(d)
	// The short round misses the budget and waits for the long one's set
	// past its own limit (about 100 ms).
	time.Sleep(300 * time.Millisecond)
	if err := d.Retired(); err != nil {
		t.Fatalf("retired while a round waited for the others' sets: %v", err)
	}
	f.gate <- struct{}{} // the long round completes, within its own limit
	long.check(t, "the long round's caller")
	select {
	case <-f.submits:
	case <-time.After(5 * time.Second):
		t.Fatal("the round readied alone never reached the device")
	}
	f.gate <- struct{}{}
	short.check(t, "the caller whose round was readied alone")
	if err := d.Retired(); err != nil {
		t.Fatalf("Retired: %v", err)
	}
	if f.trims.Load() == 0 {
		t.Fatal("the short round was not readied alone")
	}
}
