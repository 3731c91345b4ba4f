package objectstore

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync/atomic"
	"time"
)

// RetryOptions configures WithRetry. Every zero value means a documented
// default.
type RetryOptions struct {
	// MaxAttempts bounds the attempts of one call, the first included.
	// 0: 6.
	MaxAttempts int
	// AttemptTimeout bounds each attempt; an attempt that runs past it is a
	// transient failure (a stall). 0: 60s. A store's own request timeout
	// may be shorter. For a QueueingStore it runs from the moment the
	// request leaves the store's queue.
	AttemptTimeout time.Duration
	// Budget bounds the whole call from its first attempt, backoff
	// included: no attempt starts, and no attempt runs, past it.
	// 0: 2 minutes.
	Budget time.Duration
	// InitialBackoff is the wait before the second attempt; it doubles per
	// attempt up to MaxBackoff, and each wait is jittered to between half
	// and all of it so that many readers failing together do not retry in
	// lockstep. 0: 100ms.
	InitialBackoff time.Duration
	// MaxBackoff caps one wait. 0: 5s.
	MaxBackoff time.Duration
	// Logger receives a warning per call given up and a debug line per
	// retry; nil: discard.
	Logger *slog.Logger

	// Now, Sleep and Jitter replace the clock, the wait and the random
	// source in tests. Sleep must return ctx.Err() when ctx ends first;
	// Jitter returns a number in [0, 1). nil: the real ones.
	Now    func() time.Time
	Sleep  func(ctx context.Context, d time.Duration) error
	Jitter func() float64
}

// Retry is a Store that repeats calls to the inner Store that fail with a
// transient error (IsTransient), with jittered exponential backoff, a
// timeout per attempt and bounds on attempts and total time. Not-found,
// invalid-key, permission and range errors return at once. It is safe for
// concurrent use when the inner Store is.
type Retry struct {
	decorator
	opts RetryOptions
	log  *slog.Logger
	// slots is the queue of the store below, which Retry waits in before
	// each attempt (QueueingStore); nil when it does not queue, or when a
	// decorator outside took it over (handed: Retry then waits in none).
	slots  *Slots
	handed atomic.Bool
}

var (
	_ Store   = (*Retry)(nil)
	_ Wrapper = (*Retry)(nil)
)

// WithRetry wraps inner with retries; see RetryOptions for the defaults.
// A negative value is refused with an error naming it, not turned into
// the default.
func WithRetry(inner Store, opts RetryOptions) (*Retry, error) {
	if err := refuseNegative("RetryOptions", map[string]int64{"MaxAttempts": int64(opts.MaxAttempts),
		"AttemptTimeout": int64(opts.AttemptTimeout), "Budget": int64(opts.Budget),
		"InitialBackoff": int64(opts.InitialBackoff), "MaxBackoff": int64(opts.MaxBackoff)}); err != nil {
		return nil, err
	}
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = 6
	}
	if opts.AttemptTimeout == 0 {
		opts.AttemptTimeout = 60 * time.Second
	}
	if opts.Budget == 0 {
		opts.Budget = 2 * time.Minute
	}
	if opts.InitialBackoff == 0 {
		opts.InitialBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Sleep == nil {
		opts.Sleep = sleepCtx
	}
	if opts.Jitter == nil {
		opts.Jitter = rand.Float64
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Retry{decorator: decorator{inner}, opts: opts, log: log, slots: queueOutside(inner)}, nil
}

// QueueOutside hands the queue Retry waits in to a decorator outside.
func (r *Retry) QueueOutside() *Slots {
	r.handed.Store(true)
	return r.slots
}

// refuseNegative returns an error naming the first negative field of an
// options struct (in name order, so the message does not depend on map
// order), nil when none is.
func refuseNegative(what string, fields map[string]int64) error {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if fields[k] < 0 {
			return fmt.Errorf("objectstore: %s.%s %d: want 0 (the default) or more", what, k, fields[k])
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// backoff returns the wait after the given failed attempt (1-based).
func (r *Retry) backoff(attempt int) time.Duration {
	d := r.opts.InitialBackoff
	for i := 1; i < attempt && d < r.opts.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.opts.MaxBackoff)
	half := d / 2
	return half + time.Duration(r.opts.Jitter()*float64(d-half))
}

// QueueingStore is implemented by stores whose requests wait for one of a
// bounded number of slots (S3's MaxInFlight), and forwarded by
// decorators. A decorator that must act when a request leaves that queue
// (Retry starts an attempt's timeout and the call's budget there, so that
// a deep queue of reads is not mistaken for a stall; Breaker asks there
// whether the source is down, so that requests queued behind stalled ones
// fail at once when it opens meanwhile) takes the queue over when it wraps
// the store, with QueueOutside: from then on the store sends each request
// at once, and the decorator waits for a slot before each call and holds
// it until the call returns. The store is then used only through it.
type QueueingStore interface {
	Store
	// QueueOutside hands the store's queue to its caller and returns it;
	// nil when the store does not queue.
	QueueOutside() *Slots
}

// Slots is the queue of a store's requests: at most as many at once as
// it has slots.
type Slots struct{ c chan struct{} }

// NewSlots returns a queue of n slots.
func NewSlots(n int) *Slots { return &Slots{c: make(chan struct{}, n)} }

// Take waits for a slot, as long as ctx allows.
func (s *Slots) Take(ctx context.Context) error {
	select {
	case s.c <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Give gives a slot Take took back.
func (s *Slots) Give() { <-s.c }

// queueOutside takes the queue of s over (QueueingStore), nil when s does
// not queue.
func queueOutside(s Store) *Slots {
	if q, ok := s.(QueueingStore); ok {
		return q.QueueOutside()
	}
	return nil
}

// do runs f until it succeeds, fails permanently, or the bounds are spent.
// The error it returns keeps the last attempt's error in its chain, so its
// class (IsTransient, IsNotFound, ...) is what the caller sees.
func (r *Retry) do(ctx context.Context, op, key string, f func(ctx context.Context) error) error {
	slots := r.slots
	if r.handed.Load() {
		slots = nil // a decorator outside waits in the queue
	}
	var start time.Time // when the first attempt started (left the queue)
	began := false
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return &Error{Op: op, Store: r.ID(), Key: key, Err: err}
		}
		if slots != nil {
			// The attempt's timeout and the budget start once it has a
			// slot: waiting in the queue is not a stall.
			if err := slots.Take(ctx); err != nil {
				return &Error{Op: op, Store: r.ID(), Key: key, Err: err}
			}
		}
		now := r.opts.Now()
		if !began {
			start, began = now, true
		}
		limit := min(r.opts.AttemptTimeout, start.Add(r.opts.Budget).Sub(now))
		actx, cancel := context.WithCancel(ctx)
		var timedOut atomic.Bool
		timer := time.AfterFunc(limit, func() {
			timedOut.Store(true)
			cancel()
		})
		err := f(actx)
		if slots != nil {
			slots.Give()
		}
		timer.Stop()
		stalled := timedOut.Load() && ctx.Err() == nil
		cancel()
		if err == nil {
			if attempt > 1 {
				r.log.Info("store request succeeded after retries", "op", op, "key", key, "attempts", attempt)
			}
			return nil
		}
		if stalled && !IsTransient(err) {
			// The inner store saw our per-attempt timer as its caller giving
			// up; for us it is a stall worth another attempt.
			err = &Error{Op: op, Store: r.ID(), Key: key,
				Err: Transient(fmt.Errorf("attempt timed out after %v: %w", limit, context.DeadlineExceeded))}
		}
		if !IsTransient(err) {
			return err
		}
		if ctx.Err() != nil {
			return err
		}
		elapsed := r.opts.Now().Sub(start)
		if attempt >= r.opts.MaxAttempts {
			r.log.Warn("store request failed, giving up", "op", op, "key", key, "attempts", attempt, "elapsed", elapsed, "err", err)
			return fmt.Errorf("gave up after %d attempts in %v: %w", attempt, elapsed.Round(time.Millisecond), err)
		}
		wait := r.backoff(attempt)
		if elapsed+wait >= r.opts.Budget {
			r.log.Warn("store request failed, retry budget spent", "op", op, "key", key, "attempts", attempt, "elapsed", elapsed, "err", err)
			return fmt.Errorf("gave up after %d attempts in %v (budget %v): %w", attempt, elapsed.Round(time.Millisecond), r.opts.Budget, err)
		}
		r.log.Debug("store request failed, retrying", "op", op, "key", key, "attempt", attempt, "wait", wait, "err", err)
		if serr := r.opts.Sleep(ctx, wait); serr != nil {
			// Cancelled while waiting: report the cancellation (not
			// transient), with the failure that led here for the log.
			return &Error{Op: op, Store: r.ID(), Key: key, Err: fmt.Errorf("%w while waiting to retry after: %v", serr, err)}
		}
	}
}

var _ GetterInto = (*Retry)(nil)

// GetInto retries the inner store's GetInto (or Get, when it has none).
func (r *Retry) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	var b []byte
	err := r.do(ctx, "get", key, func(ctx context.Context) (err error) {
		b, err = r.getInto(ctx, key, buf, limit)
		return err
	})
	return b, err
}

// Get implements Store.
func (r *Retry) Get(ctx context.Context, key string) ([]byte, error) {
	var b []byte
	err := r.do(ctx, "get", key, func(ctx context.Context) (err error) {
		b, err = r.Store.Get(ctx, key)
		return err
	})
	return b, err
}

// GetRange implements Store.
func (r *Retry) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	var b []byte
	err := r.do(ctx, "get range", key, func(ctx context.Context) (err error) {
		b, err = r.Store.GetRange(ctx, key, off, length)
		return err
	})
	return b, err
}

// List implements Store.
func (r *Retry) List(ctx context.Context, prefix string) ([]string, error) {
	var names []string
	err := r.do(ctx, "list", prefix, func(ctx context.Context) (err error) {
		names, err = r.Store.List(ctx, prefix)
		return err
	})
	return names, err
}
