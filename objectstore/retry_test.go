package objectstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
)

// scripted is a Store whose Get returns the scripted errors in turn, then
// data; it counts calls.
type scripted struct {
	objectstore.Store // nil: only Get is used
	mu                sync.Mutex
	errs              []error
	calls             int
	block             bool // block until ctx ends, then return ctx.Err()
}

func (s *scripted) ID() string { return "mem://test" }
func (*scripted) Close() error { return nil }

func (s *scripted) Get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	s.calls++
	var err error
	if len(s.errs) > 0 {
		err, s.errs = s.errs[0], s.errs[1:]
	}
	block := s.block
	s.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, &objectstore.Error{Op: "get", Store: s.ID(), Key: key, Err: ctx.Err()}
	}
	if err != nil {
		return nil, &objectstore.Error{Op: "get", Store: s.ID(), Key: key, Err: err}
	}
	return []byte("data"), nil
}

// fakeClock advances only when the retry layer sleeps.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

var errBoom = objectstore.Transient(errors.New("HTTP 503 ServiceUnavailable"))

func TestRetryClasses(t *testing.T) {
	tests := []struct {
		name      string
		errs      []error
		wantCalls int
		wantErr   func(error) bool
	}{
		{"success", nil, 1, nil},
		{"transient then success", []error{errBoom, errBoom}, 3, nil},
		{"not found", []error{objectstore.ErrNotFound}, 1, objectstore.IsNotFound},
		{"invalid key", []error{objectstore.ErrInvalidKey}, 1, func(e error) bool { return errors.Is(e, objectstore.ErrInvalidKey) }},
		{"permission", []error{fmt.Errorf("%w (HTTP 403 AccessDenied)", objectstore.ErrPermission)}, 1, objectstore.IsPermission},
		{"range", []error{objectstore.ErrRange}, 1, func(e error) bool { return errors.Is(e, objectstore.ErrRange) }},
		{"unclassified", []error{errors.New("HTTP 400 BadRequest")}, 1, func(e error) bool { return e != nil && !objectstore.IsTransient(e) }},
		{"transient then not found", []error{errBoom, objectstore.ErrNotFound}, 2, objectstore.IsNotFound},
		{"truncated", []error{objectstore.Transient(objectstore.ErrTruncated)}, 2, nil},
		{"exhausted", []error{errBoom, errBoom, errBoom, errBoom, errBoom}, 4, objectstore.IsTransient},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inner := &scripted{errs: tc.errs}
			clock := &fakeClock{now: time.Unix(0, 0)}
			r := must(objectstore.WithRetry(inner, objectstore.RetryOptions{
				MaxAttempts: 4, Now: clock.Now, Sleep: clock.Sleep, Jitter: func() float64 { return 0 },
			}))
			b, err := r.Get(context.Background(), "k")
			if inner.calls != tc.wantCalls {
				t.Errorf("%d calls, want %d", inner.calls, tc.wantCalls)
			}
			if tc.wantErr == nil {
				if err != nil || string(b) != "data" {
					t.Fatalf("Get = %q, %v", b, err)
				}
				return
			}
			if !tc.wantErr(err) {
				t.Fatalf("Get: err = %v, wrong class", err)
			}
			var e *objectstore.Error
			if !errors.As(err, &e) || e.Key != "k" {
				t.Errorf("error %v does not carry the key", err)
			}
		})
	}
}

func TestRetryBackoff(t *testing.T) {
	for _, tc := range []struct {
		jitter float64
		want   []time.Duration
	}{
		// Waits double from 100ms up to the 1s cap; jitter picks between
		// half and all of each.
		{0, []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond}},
		{0.5, []time.Duration{75 * time.Millisecond, 150 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond, 750 * time.Millisecond, 750 * time.Millisecond}},
	} {
		inner := &scripted{errs: []error{errBoom, errBoom, errBoom, errBoom, errBoom, errBoom, errBoom}}
		clock := &fakeClock{now: time.Unix(0, 0)}
		r := must(objectstore.WithRetry(inner, objectstore.RetryOptions{
			MaxAttempts: 7, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second,
			Now: clock.Now, Sleep: clock.Sleep, Jitter: func() float64 { return tc.jitter },
		}))
		_, err := r.Get(context.Background(), "k")
		if !objectstore.IsTransient(err) {
			t.Errorf("jitter %v: err = %v, want transient", tc.jitter, err)
		}
		if fmt.Sprint(clock.sleeps) != fmt.Sprint(tc.want) {
			t.Errorf("jitter %v: waits %v, want %v", tc.jitter, clock.sleeps, tc.want)
		}
	}
}

func TestRetryBudget(t *testing.T) {
	inner := &scripted{errs: make([]error, 100)}
	for i := range inner.errs {
		inner.errs[i] = errBoom
	}
	clock := &fakeClock{now: time.Unix(0, 0)}
	r := must(objectstore.WithRetry(inner, objectstore.RetryOptions{
		MaxAttempts: 100, Budget: time.Second, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second,
		Now: clock.Now, Sleep: clock.Sleep, Jitter: func() float64 { return 0.999 },
	}))
	_, err := r.Get(context.Background(), "k")
	if !objectstore.IsTransient(err) {
		t.Fatalf("err = %v, want transient", err)
	}
	// ~100 + 200 + 400ms slept; the next ~800ms wait would pass the budget.
	if inner.calls != 4 {
		t.Errorf("%d calls (waits %v), want 4 within a 1s budget", inner.calls, clock.sleeps)
	}
	if clock.now.Sub(time.Unix(0, 0)) >= time.Second {
		t.Errorf("slept %v, past the budget", clock.now.Sub(time.Unix(0, 0)))
	}
}

func TestRetryCancelledWhileWaiting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	inner := &scripted{errs: []error{errBoom, errBoom}}
	r := must(objectstore.WithRetry(inner, objectstore.RetryOptions{
		Sleep: func(ctx context.Context, d time.Duration) error {
			cancel() // the caller gives up during the first wait
			<-ctx.Done()
			return ctx.Err()
		},
	}))
	_, err := r.Get(ctx, "k")
	if !errors.Is(err, context.Canceled) || objectstore.IsTransient(err) {
		t.Fatalf("err = %v, want context.Canceled and not transient", err)
	}
	if inner.calls != 1 {
		t.Errorf("%d calls after cancellation, want 1", inner.calls)
	}
	// An already cancelled context makes no call at all.
	inner.calls = 0
	if _, err := r.Get(ctx, "k"); !errors.Is(err, context.Canceled) || inner.calls != 0 {
		t.Errorf("cancelled ctx: %d calls, err %v", inner.calls, err)
	}
}

// An attempt that never answers is cut at AttemptTimeout and retried, and
// the call ends with a transient error once the attempts are spent.
func TestRetryAttemptTimeout(t *testing.T) {
	inner := &scripted{block: true}
	r := must(objectstore.WithRetry(inner, objectstore.RetryOptions{
		MaxAttempts: 3, AttemptTimeout: 20 * time.Millisecond, InitialBackoff: time.Millisecond,
	}))
	_, err := r.Get(context.Background(), "k")
	if !objectstore.IsTransient(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a transient timeout", err)
	}
	if inner.calls != 3 {
		t.Errorf("%d calls, want 3", inner.calls)
	}
}

func TestIsTransient(t *testing.T) {
	tr := objectstore.Transient
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("x"), false},
		{tr(errors.New("x")), true},
		{fmt.Errorf("wrapped: %w", tr(io.ErrUnexpectedEOF)), true},
		{&objectstore.Error{Op: "get", Store: "s", Key: "k", Err: tr(syscall.ECONNRESET)}, true},
		{tr(objectstore.ErrNotFound), false},
		{tr(fmt.Errorf("%w", objectstore.ErrPermission)), false},
		{tr(context.Canceled), false},
		{tr(context.DeadlineExceeded), true},
		{context.DeadlineExceeded, false},
		{objectstore.ErrTruncated, false}, // only what the source marks
	}
	for _, tc := range tests {
		if got := objectstore.IsTransient(tc.err); got != tc.want {
			t.Errorf("IsTransient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if objectstore.Transient(nil) != nil {
		t.Error("Transient(nil) != nil")
	}
}

// queued is a store whose requests wait in a queue of one slot before
// they start, as S3's do under MaxInFlight.
type queued struct {
	scripted
	slots *objectstore.Slots
}

func (q *queued) QueueOutside() *objectstore.Slots { return q.slots }

// Time spent waiting for a slot is not a stall: the attempt timeout starts
// when the request leaves the queue. A stall after that still counts.
func TestRetryQueueNotAStall(t *testing.T) {
	q := &queued{slots: objectstore.NewSlots(1)}
	r := must(objectstore.WithRetry(q, objectstore.RetryOptions{MaxAttempts: 2, AttemptTimeout: 30 * time.Millisecond, InitialBackoff: time.Millisecond}))
	// Another request holds the one slot for longer than the attempt
	// timeout.
	if err := q.slots.Take(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(150*time.Millisecond, q.slots.Give)
	began := time.Now()
	if b, err := r.Get(context.Background(), "k"); err != nil || string(b) != "data" {
		t.Fatalf("Get after a queue longer than the attempt timeout = %q, %v", b, err)
	}
	if waited := time.Since(began); waited < 140*time.Millisecond {
		t.Errorf("the request was sent after %v, while the queue's one slot was taken for 150ms", waited)
	}
	if q.calls != 1 {
		t.Errorf("%d calls, want 1", q.calls)
	}
	q.block, q.calls = true, 0
	_, err := r.Get(context.Background(), "k")
	if !objectstore.IsTransient(err) || !errors.Is(err, context.DeadlineExceeded) || q.calls != 2 {
		t.Fatalf("stall after the queue: %d calls, err %v; want 2 attempts ending in a transient timeout", q.calls, err)
	}
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// stallQueued is a store of one slot whose reads of "stall" wait until
// their caller gives up, as a source that stopped answering does.
type stallQueued struct {
	scripted
	slots *objectstore.Slots
	sent  atomic.Int64 // reads of other keys that reached the store
}

func (q *stallQueued) QueueOutside() *objectstore.Slots { return q.slots }

func (q *stallQueued) Get(ctx context.Context, key string) ([]byte, error) {
	if key == "stall" {
		<-ctx.Done()
		return nil, &objectstore.Error{Op: "get", Store: q.ID(), Key: key, Err: ctx.Err()}
	}
	q.sent.Add(1)
	return []byte("data"), nil
}

// A request queued behind a stalled one is refused at once, without being
// sent, when the breaker opened while it waited: the breaker admits it
// when it leaves the queue, whether the Breaker or a Retry outside it
// waits in that queue.
func TestBreakerAdmitsWhenLeavingTheQueue(t *testing.T) {
	for _, retry := range []bool{false, true} {
		q := &stallQueued{slots: objectstore.NewSlots(1)}
		b := must(objectstore.WithBreaker(q, objectstore.BreakerOptions{Failures: 1, Silence: time.Nanosecond, Probe: time.Hour}))
		var s objectstore.Store = b
		if retry {
			s = must(objectstore.WithRetry(b, objectstore.RetryOptions{MaxAttempts: 1}))
		}
		stalled := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			_, err := s.Get(ctx, "stall")
			stalled <- err
		}()
		time.Sleep(30 * time.Millisecond) // the stalled read holds the slot
		_, err := s.Get(context.Background(), "k")
		if !errors.Is(err, objectstore.ErrSourceDown) || q.sent.Load() != 0 {
			t.Errorf("retry %v: a read queued behind a stalled one: %v, %d sent; want refused, none sent", retry, err, q.sent.Load())
		}
		if err := <-stalled; !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("retry %v: the stalled read: %v", retry, err)
		}
		if !b.Open() {
			t.Errorf("retry %v: the breaker did not open", retry)
		}
		b.Close()
	}
}
