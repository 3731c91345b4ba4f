package objectstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrSourceDown is returned (wrapped) by a Breaker for requests it refuses
// while the source is not answering. It is permanent for the request: the
// retry layer gives up at once instead of waiting out its budget.
var ErrSourceDown = errors.New("source not answering")

// DefaultProbe is how often an open breaker asks the source whether it
// answers again, unless BreakerOptions.Probe says otherwise.
const DefaultProbe = time.Second

// BreakerOptions configures WithBreaker. Every zero value means a
// documented default.
type BreakerOptions struct {
	// Failures is how many requests in a row must go unanswered (a
	// timeout waiting for a response or for more of one, a connection that
	// cannot be made) before the breaker opens, provided nothing has
	// answered for Silence either: a source that answers most requests
	// while a few stall is slow, not down. 0: 3.
	Failures int
	// Silence: see Failures. 0: 10s, the stall timeout zarrfs uses by
	// default.
	Silence time.Duration
	// Quiet opens the breaker before Failures when nothing has answered
	// for this long since the first request of the unanswered run was sent
	// (a lone reader then waits for two timeouts, not three). 0: 20s, twice
	// the stall timeout zarrfs uses by default.
	Quiet time.Duration
	// Probe is how often an open breaker asks the source whether it
	// answers again, with one small request of its own (the first byte of
	// the last object a read got, or a listing of the store's root), each
	// bounded by ProbeTimeout. 0: DefaultProbe.
	Probe time.Duration
	// ProbeTimeout bounds one probe. 0: 5s.
	ProbeTimeout time.Duration
	// Logger receives one warning when the breaker opens and one line when
	// the source answers again; nil: discard.
	Logger *slog.Logger
	// Now replaces the clock in tests; nil: time.Now.
	Now func() time.Time
}

// Prober is an optional upgrade of a Store that cannot list (HTTP): Probe
// sends one small request and reports how it ended, so that a breaker
// that has no key to read yet can tell whether the source answers. Any
// answer, even an error status, is an answer.
type Prober interface {
	Probe(ctx context.Context) error
}

// Breaker is a Store that stops sending requests to a source that has
// stopped answering (a circuit breaker). While it is open every request
// fails at once with ErrSourceDown, so that readers get their error in
// milliseconds instead of each waiting out timeouts and retries; a probe of
// its own finds out when the source answers again, and the breaker closes
// by itself. Only silence counts: a source that answers with errors (5xx,
// not found, a reset in the middle of a body) is answering, and the retry
// layer deals with those. Put it inside the retry layer
// (WithRetry(WithBreaker(s, ...), ...)). It is safe for concurrent use
// when the inner Store is.
type Breaker struct {
	decorator
	opts BreakerOptions
	log  *slog.Logger

	mu       sync.Mutex
	open     bool
	fails    int       // unanswered requests in a row
	answered time.Time // last answer of any kind
	since    time.Time // when the first request of the unanswered run was sent
	lastFail time.Time // when the last unanswered request failed
	lastKey  string    // a key a read got an answer for, for the probe
	cause    error     // why the last unanswered request failed
	opened   time.Time
	refused  int64 // requests refused while open
	stop     chan struct{}
	closed   bool

	// slots is the queue of the store below (QueueingStore), which every
	// call and probe waits in; nil when it does not queue. A Retry
	// outside takes it over (handed): calls then hold the Retry's slot.
	slots  *Slots
	handed atomic.Bool
}

var (
	_ Store   = (*Breaker)(nil)
	_ Wrapper = (*Breaker)(nil)
)

// WithBreaker wraps inner; see BreakerOptions for the defaults. A
// negative value is refused (see WithRetry).
func WithBreaker(inner Store, opts BreakerOptions) (*Breaker, error) {
	if err := refuseNegative("BreakerOptions", map[string]int64{"Failures": int64(opts.Failures), "Silence": int64(opts.Silence),
		"Quiet": int64(opts.Quiet), "Probe": int64(opts.Probe), "ProbeTimeout": int64(opts.ProbeTimeout)}); err != nil {
		return nil, err
	}
	if opts.Failures == 0 {
		opts.Failures = 3
	}
	if opts.Silence == 0 {
		opts.Silence = 10 * time.Second
	}
	if opts.Quiet == 0 {
		opts.Quiet = 20 * time.Second
	}
	if opts.Probe == 0 {
		opts.Probe = DefaultProbe
	}
	if opts.ProbeTimeout == 0 {
		opts.ProbeTimeout = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Breaker{decorator: decorator{inner}, opts: opts, log: log, slots: queueOutside(inner)}, nil
}

// QueueOutside hands the queue calls wait in to a decorator outside (a
// Retry, which then waits in it before each attempt); probes still wait
// in it.
func (b *Breaker) QueueOutside() *Slots {
	b.handed.Store(true)
	return b.slots
}

// Open reports whether the breaker is refusing requests now.
func (b *Breaker) Open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// Close stops the probing of an open breaker, for good, and closes the
// inner store.
func (b *Breaker) Close() error {
	b.mu.Lock()
	b.closed = true
	if b.stop != nil {
		close(b.stop)
		b.stop = nil
	}
	b.mu.Unlock()
	return b.decorator.Close()
}

// isSilence reports whether err means the source did not answer at all.
func isSilence(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// admit lets a request through unless the breaker is open.
func (b *Breaker) admit() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return nil
	}
	b.refused++
	return fmt.Errorf("%w for %v (%s)", ErrSourceDown,
		b.opts.Now().Sub(b.since).Round(100*time.Millisecond), silenceCause(b.cause))
}

// silenceCause words why a request went unanswered, without the request
// (the refusal that quotes it names its own): "connection refused", "no
// route to host", "no response in time".
func silenceCause(err error) string {
	var errno syscall.Errno
	var op *net.OpError
	switch {
	case err == nil:
		return "no answer"
	case errors.As(err, &errno):
		return errno.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return "no response in time"
	case errors.As(err, &op) && op.Err != nil:
		return op.Err.Error()
	}
	return err.Error()
}

// record notes how an admitted request for key, sent at sent, ended.
func (b *Breaker) record(key string, sent time.Time, err error) {
	switch {
	case err == nil || !isSilence(err):
		if errors.Is(err, context.Canceled) || errors.Is(err, ErrSourceDown) || errors.Is(err, ErrInvalidKey) {
			return // the caller gave up, or no request was sent: says nothing of the source
		}
		b.mu.Lock()
		b.fails = 0
		b.answered = b.opts.Now()
		if err == nil && key != "" {
			b.lastKey = key
		}
		b.mu.Unlock()
	default:
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.fails > 0 && sent.Sub(b.lastFail) > b.opts.Quiet {
			// Nothing was asked for a while: an idle source is not a
			// silent one, so this is a new run.
			b.fails = 0
		}
		if b.fails == 0 {
			b.since = sent
		}
		b.fails++
		b.cause = err
		now := b.opts.Now()
		b.lastFail = now
		quiet := now.Sub(b.since) >= b.opts.Quiet && b.answered.Before(b.since)
		silent := b.fails >= b.opts.Failures && now.Sub(b.answered) >= b.opts.Silence
		if !b.open && (silent || quiet) {
			b.open, b.opened, b.refused = true, now, 0
			b.log.Warn("source not answering; failing reads at once until it answers again",
				"store", b.ID(), "unanswered", b.fails, "for", now.Sub(b.since).Round(time.Millisecond), "cause", err)
			if !b.closed {
				b.stop = make(chan struct{})
				go b.probe(b.stop)
			}
		}
	}
}

// ask sends one probe: for key (a read's, as readers ask: a source may
// answer listings and not reads), else the store's Probe or a listing. It
// waits in the queue of the store below, as any request does.
func (b *Breaker) ask(ctx context.Context, key string) error {
	if b.slots != nil {
		if err := b.slots.Take(ctx); err != nil {
			return err
		}
		defer b.slots.Give()
	}
	if p, ok := b.Store.(Prober); ok && key == "" {
		return p.Probe(ctx)
	}
	if key != "" {
		_, err := b.Store.GetRange(ctx, key, 0, 1)
		return err
	}
	_, err := b.Store.List(ctx, "")
	return err
}

// probe asks the source whether it answers, every Probe, until it does.
func (b *Breaker) probe(stop chan struct{}) {
	t := time.NewTicker(b.opts.Probe)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.ProbeTimeout)
		b.mu.Lock()
		key := b.lastKey
		b.mu.Unlock()
		err := b.ask(ctx, key)
		cancel()
		if err != nil && isSilence(err) {
			continue
		}
		b.mu.Lock()
		now := b.opts.Now()
		b.log.Info("source answering again; reads resume", "store", b.ID(),
			"down_for", now.Sub(b.opened).Round(time.Millisecond), "refused", b.refused)
		b.open, b.fails, b.answered = false, 0, now
		if b.stop == stop {
			b.stop = nil
		}
		b.mu.Unlock()
		return
	}
}

// do runs f (one call to the inner store) through the breaker, which
// admits it once it leaves the queue of the store below (the Breaker's,
// or a Retry's outside), so that requests queued behind stalled ones fail
// at once when the breaker opens meanwhile.
func (b *Breaker) do(ctx context.Context, op, key string, f func(ctx context.Context) error) error {
	if b.slots != nil && !b.handed.Load() {
		if err := b.slots.Take(ctx); err != nil {
			return &Error{Op: op, Store: b.ID(), Key: key, Err: err}
		}
		defer b.slots.Give()
	}
	if err := b.admit(); err != nil {
		return &Error{Op: op, Store: b.ID(), Key: key, Err: err}
	}
	sent := b.opts.Now()
	err := f(ctx)
	if op == "list" {
		key = ""
	}
	b.record(key, sent, err)
	return err
}

// Get implements Store.
func (b *Breaker) Get(ctx context.Context, key string) ([]byte, error) {
	var out []byte
	err := b.do(ctx, "get", key, func(ctx context.Context) (err error) {
		out, err = b.Store.Get(ctx, key)
		return err
	})
	return out, err
}

var _ GetterInto = (*Breaker)(nil)

// GetInto forwards to the inner store's GetInto (or Get).
func (b *Breaker) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	var out []byte
	err := b.do(ctx, "get", key, func(ctx context.Context) (err error) {
		out, err = b.getInto(ctx, key, buf, limit)
		return err
	})
	return out, err
}

// GetRange implements Store.
func (b *Breaker) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	var out []byte
	err := b.do(ctx, "get range", key, func(ctx context.Context) (err error) {
		out, err = b.Store.GetRange(ctx, key, off, length)
		return err
	})
	return out, err
}

// List implements Store.
func (b *Breaker) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	err := b.do(ctx, "list", prefix, func(ctx context.Context) (err error) {
		out, err = b.Store.List(ctx, prefix)
		return err
	})
	return out, err
}
