package objectstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
)

// silentStore answers after delay, or not at all while down: then every
// request ends in a timeout after delay.
type silentStore struct {
	down  atomic.Bool
	delay time.Duration
	calls atomic.Int64
}

func (s *silentStore) answer(ctx context.Context, key string) error {
	s.calls.Add(1)
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.down.Load() {
		return objectstore.Transient(fmt.Errorf("request stalled: %w", context.DeadlineExceeded))
	}
	return nil
}

func (s *silentStore) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.answer(ctx, key); err != nil {
		return nil, &objectstore.Error{Op: "get", Store: s.ID(), Key: key, Err: err}
	}
	return []byte("data"), nil
}

func (s *silentStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	return s.Get(ctx, key)
}

func (s *silentStore) List(ctx context.Context, prefix string) ([]string, error) {
	if err := s.answer(ctx, prefix); err != nil {
		return nil, err
	}
	return []string{"k"}, nil
}

func (s *silentStore) ID() string { return "mem://silent" }
func (*silentStore) Close() error { return nil }

// A source that stops answering: after three unanswered requests the
// breaker opens, and every request fails at once with a permanent
// ErrSourceDown (the retry layer does not wait out its budget); a source
// that answers again closes it by itself, through its probe, with no
// reader involved. Errors that are answers (not found) never open it.
func TestBreaker(t *testing.T) {
	src := &silentStore{delay: 20 * time.Millisecond}
	br := must(objectstore.WithBreaker(src, objectstore.BreakerOptions{Silence: 20 * time.Millisecond, Probe: 10 * time.Millisecond, ProbeTimeout: time.Second}))
	defer br.Close()
	r := must(objectstore.WithRetry(br, objectstore.RetryOptions{MaxAttempts: 10, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Budget: time.Minute}))
	ctx := context.Background()
	if _, err := r.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	src.down.Store(true)
	start := time.Now()
	_, err := r.Get(ctx, "k")
	if !errors.Is(err, objectstore.ErrSourceDown) || objectstore.IsTransient(err) {
		t.Fatalf("get while down: %v; want a permanent ErrSourceDown", err)
	}
	if n := src.calls.Load(); n != 4 || time.Since(start) > 2*time.Second {
		t.Errorf("%d calls in %v before the breaker opened, want 3 attempts (and the first get)", n-1, time.Since(start))
	}
	// Open: fails at once, concurrently too.
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			if _, err := r.Get(ctx, "k"); !errors.Is(err, objectstore.ErrSourceDown) || time.Since(t0) > 10*time.Millisecond {
				t.Errorf("get with the breaker open: %v after %v", err, time.Since(t0))
			}
		}()
	}
	wg.Wait()
	// The source answers again: the breaker closes by itself.
	src.down.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for br.Open() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if br.Open() {
		t.Fatal("breaker still open 5s after the source answers again")
	}
	if b, err := r.Get(ctx, "k"); err != nil || string(b) != "data" {
		t.Fatalf("get after recovery: %q, %v", b, err)
	}
}

// A lone reader's run of unanswered requests opens the breaker once it has
// lasted Quiet, before Failures.
func TestBreakerQuiet(t *testing.T) {
	src := &silentStore{delay: 30 * time.Millisecond}
	br := must(objectstore.WithBreaker(src, objectstore.BreakerOptions{Failures: 100, Quiet: 50 * time.Millisecond, Probe: time.Hour}))
	defer br.Close()
	src.down.Store(true)
	br.Get(context.Background(), "k")
	if br.Open() {
		t.Fatal("open after one unanswered request of 30ms, quiet 50ms")
	}
	br.Get(context.Background(), "k")
	if !br.Open() {
		t.Fatal("not open after 60ms unanswered")
	}
}

// Unanswered requests far apart, with nothing asked in between, are not an
// outage: an idle source is not a silent one.
func TestBreakerIdleIsNotQuiet(t *testing.T) {
	src := &silentStore{delay: 10 * time.Millisecond}
	br := must(objectstore.WithBreaker(src, objectstore.BreakerOptions{Failures: 100, Quiet: 30 * time.Millisecond, Probe: time.Hour}))
	defer br.Close()
	src.down.Store(true)
	for range 3 {
		br.Get(context.Background(), "k")
		time.Sleep(50 * time.Millisecond)
	}
	if br.Open() {
		t.Fatal("open after unanswered requests 50ms apart, quiet 30ms")
	}
}

// A source that answers most requests while some stall is slow, not down:
// the breaker stays closed however many stalls end in a row, as long as
// answers keep coming within Silence.
func TestBreakerSlowIsNotDown(t *testing.T) {
	src := &silentStore{delay: 20 * time.Millisecond}
	br := must(objectstore.WithBreaker(src, objectstore.BreakerOptions{Silence: 50 * time.Millisecond, Quiet: time.Hour, Probe: time.Hour}))
	defer br.Close()
	br.Get(context.Background(), "k") // an answer
	src.down.Store(true)
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() { defer wg.Done(); br.Get(context.Background(), "k") }()
	}
	wg.Wait()
	if br.Open() {
		t.Fatal("open after 5 stalls 20ms after an answer, silence 50ms")
	}
	time.Sleep(60 * time.Millisecond)
	for range 3 {
		br.Get(context.Background(), "k")
	}
	if !br.Open() {
		t.Fatal("not open after three stalls and 60ms without an answer")
	}
}

// answeringStore stalls while down; once up, it answers every request
// with err: an error that is an answer (404, 403), not silence.
type answeringStore struct {
	silentStore
	err error
}

func (s *answeringStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if s.down.Load() {
		return s.silentStore.GetRange(ctx, key, off, n)
	}
	return nil, &objectstore.Error{Op: "get range", Store: s.ID(), Key: key, Err: s.err}
}

func (s *answeringStore) List(ctx context.Context, prefix string) ([]string, error) {
	if s.down.Load() {
		return s.silentStore.List(ctx, prefix)
	}
	return nil, &objectstore.Error{Op: "list", Store: s.ID(), Key: prefix, Err: s.err}
}

// A probe answered with an error (the probed object deleted meanwhile, a
// credential refused) is an answer: the source is back, and the breaker
// closes; reads then get the answer itself, not ErrSourceDown.
func TestBreakerProbeAnsweredWithError(t *testing.T) {
	for name, answer := range map[string]error{"not found": objectstore.ErrNotFound, "permission": objectstore.ErrPermission} {
		t.Run(name, func(t *testing.T) {
			src := &answeringStore{silentStore: silentStore{delay: 10 * time.Millisecond}, err: answer}
			br := must(objectstore.WithBreaker(src, objectstore.BreakerOptions{Quiet: 15 * time.Millisecond, Probe: 5 * time.Millisecond, ProbeTimeout: time.Second}))
			defer br.Close()
			ctx := context.Background()
			br.Get(ctx, "k") // an answer: the probe's key
			src.down.Store(true)
			for range 3 {
				br.Get(ctx, "k")
			}
			if !br.Open() {
				t.Fatal("not open after the source went silent")
			}
			src.down.Store(false)
			for deadline := time.Now().Add(5 * time.Second); br.Open(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("still open 5s after probes were answered with %v", answer)
				}
			}
			if _, err := br.GetRange(ctx, "k", 0, 1); !errors.Is(err, answer) {
				t.Errorf("read after the breaker closed: %v, want %v", err, answer)
			}
		})
	}
}
