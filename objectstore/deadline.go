package objectstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/internal/memory"
)

// DeadlineOptions configures WithDeadline. Every zero value means a
// documented default; negative values are refused.
type DeadlineOptions struct {
	// Timeout bounds one call to the inner store: a call that has not
	// returned by then fails with a transient error wrapping
	// context.DeadlineExceeded (a silence, for a Breaker outside), and its
	// caller goes on. 0: 30s, the --source-timeout zarrfs uses by default.
	Timeout time.Duration
	// MaxBlocked bounds the calls whose caller went on (the call ran past
	// Timeout, or the caller's context ended) while they still wait on the
	// inner store: each holds a goroutine, and an OS thread in a system
	// call that no signal interrupts. At the bound, new calls fail at once
	// with ErrSourceDown until one of the blocked calls returns: the
	// source answering again. 0: 64.
	MaxBlocked int
	// Logger receives one warning when the bound is reached and one line
	// when the blocked calls have all returned; nil: discard.
	Logger *slog.Logger
	// Memory is the process's one lender: a caller's buffer it lent is
	// held (Retain) while a call reads straight into it, so that a call
	// its caller left behind still writes into memory nobody else was
	// lent; and it lends the buffers a call reads into when the caller's
	// is not one of its own. nil: every read into a caller's buffer goes
	// through memory of the call's own and is copied.
	Memory memory.Lender
}

// Deadline is a Store whose calls return within a deadline whatever the
// inner store does: for a source that cannot be interrupted, such as a
// local filesystem that stops answering (an NFS or Lustre server gone, a
// FUSE daemon stopped), where a read blocks in the kernel for as long as
// the filesystem does. Each call runs in a goroutine of its own; its caller
// waits for it, its context or the deadline, whichever comes first. A call
// its caller left goes on until the inner store returns, and its result is
// dropped. It writes only into memory nobody else is lent: a caller's
// buffer that the lender lent (DeadlineOptions.Memory), held until the
// read returns, so a read left behind may still land there but the buffer
// is not lent again before it has; otherwise memory of the call's own,
// copied into the caller's buffer only while the caller waits (GetInto and
// GetVersion read into a buffer lent for the call and copy; a local file
// is copied a piece at a time: inPieces). Its listing (ListVersions) never
// reaches the caller's fn.
//
// Put a Breaker outside it (WithBreaker(WithDeadline(s, ...), ...)), so
// that a source found silent fails reads at once, and is probed, rather
// than making every reader wait out the deadline. It is safe for
// concurrent use when the inner Store is.
type Deadline struct {
	decorator
	opts DeadlineOptions
	log  *slog.Logger

	blocked atomic.Int64 // calls left by their callers, still running
	mu      sync.Mutex   // guards full
	full    bool         // the bound was reached: logged once
}

var (
	_ Store   = (*Deadline)(nil)
	_ Wrapper = (*Deadline)(nil)
)

// WithDeadline wraps inner; see DeadlineOptions for the defaults.
func WithDeadline(inner Store, opts DeadlineOptions) (*Deadline, error) {
	if opts.Timeout < 0 || opts.MaxBlocked < 0 {
		return nil, fmt.Errorf("objectstore: negative deadline option %+v", opts)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.MaxBlocked == 0 {
		opts.MaxBlocked = 64
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Deadline{decorator: decorator{inner}, opts: opts, log: log}, nil
}

// Blocked reports how many calls are still running that their callers left.
func (d *Deadline) Blocked() int { return int(d.blocked.Load()) }

// call runs f in a goroutine and waits for it, ctx or the deadline,
// whichever comes first. f must not touch memory of the caller's, but for
// a buffer it holds (hold); done, when set, runs when f returns,
// with whether the caller had left by then: before the caller gets its
// result when it has not, to hand over what f made, and after it in any
// case, to give back what f used. A call refused before f runs (too many
// blocked, ctx done) runs done at once, with f's zero result, as left.
func call[T any](d *Deadline, ctx context.Context, op, key string, f func() (T, error), done func(v T, left bool) T) (T, error) {
	return callGated(d, ctx, op, key, f, done, nil)
}

// callGated is call with a gate, which f may write into its caller's memory
// through (see gate): the caller closes it when it leaves, and goes on
// only once no write is under way.
func callGated[T any](d *Deadline, ctx context.Context, op, key string, f func() (T, error), done func(v T, left bool) T, g *gate) (T, error) {
	var zero T
	refused := func(err error) (T, error) {
		if done != nil {
			done(zero, true) // f never runs: give back what it would have used
		}
		return zero, &Error{Op: op, Store: d.ID(), Key: key, Err: err}
	}
	if n := d.blocked.Load(); n >= int64(d.opts.MaxBlocked) {
		return refused(fmt.Errorf("%w: %d earlier requests have not returned (waiting %v each: %w)",
			ErrSourceDown, n, d.opts.Timeout, context.DeadlineExceeded))
	}
	if err := ctx.Err(); err != nil {
		return refused(err)
	}
	c := &pending[T]{ch: make(chan result[T], 1)}
	go func() {
		v, err := f()
		if c.state.CompareAndSwap(running, finished) {
			if done != nil {
				v = done(v, false)
			}
			c.ch <- result[T]{v, err}
			return
		}
		if done != nil {
			done(v, true)
		}
		d.returned()
	}()
	timer := time.NewTimer(d.opts.Timeout)
	defer timer.Stop()
	var why error
	select {
	case r := <-c.ch:
		return r.v, r.err
	case <-ctx.Done():
		why = ctx.Err()
	case <-timer.C:
		why = Transient(fmt.Errorf("no answer within %v: %w", d.opts.Timeout, context.DeadlineExceeded))
	}
	d.leave() // first, so that the goroutine's returned never precedes it
	if !c.state.CompareAndSwap(running, left) {
		// It returned meanwhile: the caller has its answer after all.
		d.unleave()
		r := <-c.ch
		return r.v, r.err
	}
	if g != nil {
		g.close()
	}
	return zero, &Error{Op: op, Store: d.ID(), Key: key, Err: why}
}

// A gate lets a call write into its caller's memory in short steps that
// never wait on the source (a copy of a piece already read): each step
// runs with the gate held and only while it is open; the caller closes it
// when it leaves, which waits for a step under way. After that nothing of
// the call touches the caller's memory, and the caller may reuse it.
type gate struct {
	mu     sync.Mutex
	closed bool
}

// errGateClosed ends a call whose caller has left.
var errGateClosed = errors.New("objectstore: the caller left")

// do runs step with the gate held, unless the caller has left.
func (g *gate) do(step func()) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errGateClosed
	}
	step()
	return nil
}

func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// The states of a pending call: its goroutine running f, f finished with
// the caller still waiting, or the caller gone.
const (
	running int32 = iota
	finished
	left
)

type result[T any] struct {
	v   T
	err error
}

type pending[T any] struct {
	state atomic.Int32
	ch    chan result[T]
}

func (d *Deadline) leave() {
	if n := d.blocked.Add(1); n >= int64(d.opts.MaxBlocked) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if !d.full {
			d.full = true
			d.log.Warn("source requests blocked past their deadline; failing new ones at once until they return",
				"store", d.ID(), "blocked", n, "deadline", d.opts.Timeout)
		}
	}
}

// unleave takes back a leave whose call returned after all.
func (d *Deadline) unleave() { d.blocked.Add(-1) }

func (d *Deadline) returned() {
	if n := d.blocked.Add(-1); n == 0 {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.full {
			d.full = false
			d.log.Info("blocked source requests returned; requests resume", "store", d.ID())
		}
	}
}

// hold takes a hold on buf for a call that reads straight into it, and
// reports whether it could: buf is memory the lender lent (and not yet
// given back), which goes back only once the call gives the hold back
// too, after its read returned.
func (d *Deadline) hold(buf []byte) bool {
	return d.opts.Memory != nil && cap(buf) > 0 && d.opts.Memory.Retain(buf)
}

// straight reads with read into buf itself, which the caller's lender
// lent, and which the call holds until read returns (hold did): a read its
// caller left may still write into it, but it is lent to nobody else
// meanwhile. A nil buf is memory of the read's own (the store allocates).
func (d *Deadline) straight(ctx context.Context, op, key string, buf []byte, held bool, read func(buf []byte) ([]byte, string, error)) ([]byte, string, error) {
	r, err := call(d, ctx, op, key, func() (versioned, error) {
		b, ver, err := read(buf)
		return versioned{b, ver}, err
	}, func(v versioned, left bool) versioned {
		if held {
			d.opts.Memory.HostFree(buf)
		}
		return v
	})
	return r.b, r.ver, err
}

// read reads key through read into buf: straight into it when the lender
// lent it or it is empty (straight), otherwise into memory of the call's
// own and copied (a local file a piece at a time: inPieces; others
// whole: into).
func (d *Deadline) read(ctx context.Context, key string, buf []byte, limit int64, read func(buf []byte) ([]byte, string, error)) ([]byte, string, error) {
	if held := d.hold(buf); held || cap(buf) == 0 {
		if !held {
			buf = nil
		}
		return d.straight(ctx, "get", key, buf, held, read)
	}
	if pr, ok := d.Store.(pieceReader); ok {
		return d.inPieces(ctx, key, buf, limit, pr)
	}
	return d.into(ctx, "get", key, buf, read)
}

// into reads with read into a buffer lent for the call (as large as buf)
// and copies the bytes into buf (grown when too small), so that a read its
// caller left never writes into memory the caller has since reused.
func (d *Deadline) into(ctx context.Context, op, key string, buf []byte, read func(tmp []byte) ([]byte, string, error)) ([]byte, string, error) {
	var tmp []byte
	if d.opts.Memory != nil {
		tmp = d.opts.Memory.HostAlloc(cap(buf))
	}
	r, err := call(d, ctx, op, key, func() (versioned, error) {
		b, ver, err := read(tmp[:0])
		return versioned{b, ver}, err
	}, func(v versioned, left bool) versioned {
		got := v.b
		v.b = nil
		if !left && got != nil {
			// Copied now, before the lent buffer goes back.
			if cap(buf) < len(got) {
				buf = make([]byte, len(got))
			}
			v.b = append(buf[:0], got...)
		}
		if d.opts.Memory != nil {
			d.opts.Memory.HostFree(tmp)
		}
		return v
	})
	return r.b, r.ver, err
}

// Get implements Store. The inner store's bytes become the caller's; a
// call left behind keeps its own.
func (d *Deadline) Get(ctx context.Context, key string) ([]byte, error) {
	return call(d, ctx, "get", key, func() ([]byte, error) { return d.Store.Get(ctx, key) }, nil)
}

var _ GetterInto = (*Deadline)(nil)

// GetInto reads through the inner store's GetInto (or Get) into buf (see
// read).
func (d *Deadline) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	gi, ok := d.Store.(GetterInto)
	if !ok {
		return call(d, ctx, "get", key, func() ([]byte, error) { return GetLimit(ctx, d.Store, key, limit) }, nil)
	}
	b, _, err := d.read(ctx, key, buf, limit, func(buf []byte) ([]byte, string, error) {
		b, err := gi.GetInto(ctx, key, buf, limit)
		return b, "", err
	})
	return b, err
}

// GetRange implements Store.
func (d *Deadline) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	return call(d, ctx, "get range", key, func() ([]byte, error) { return d.Store.GetRange(ctx, key, off, length) }, nil)
}

// List implements Store.
func (d *Deadline) List(ctx context.Context, prefix string) ([]string, error) {
	return call(d, ctx, "list", prefix, func() ([]string, error) { return d.Store.List(ctx, prefix) }, nil)
}

// GetVersion reads through the inner store's GetVersion into buf, as
// GetInto does.
func (d *Deadline) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	v, ok := AsVersioned(d.Store)
	if !ok {
		return nil, "", &Error{Op: "get", Store: d.ID(), Key: key, Err: errNotVersioned}
	}
	return d.read(ctx, key, buf, limit, func(buf []byte) ([]byte, string, error) { return v.GetVersion(ctx, key, buf, limit) })
}

// pieceReader is a store that reads a whole object and its version a
// piece at a time (Posix).
type pieceReader interface {
	// getVersionPieces reads key into piece over and over, handing each
	// piece to put with its offset and the object's size (a first call
	// with an empty piece for an empty object); an error of put ends the
	// read with it.
	getVersionPieces(ctx context.Context, key string, piece []byte, limit int64, put func(p []byte, off, size int64) error) (string, error)
}

// readPiece is what a piece read takes at a time: small enough that the
// piece is still in the core's cache when it is copied on (reading a whole
// chunk into a buffer of its own and copying it after was a visible share of a
// fill's CPU on few cores), large enough that its system calls cost little.
const readPiece = 256 << 10

// inPieces reads key into buf (grown when too small) a piece at a time:
// each piece lands in a buffer lent for the call and is copied into buf through the
// call's gate, so that a read its caller left behind stops writing into
// buf before the caller goes on.
func (d *Deadline) inPieces(ctx context.Context, key string, buf []byte, limit int64, pr pieceReader) ([]byte, string, error) {
	var piece []byte
	if d.opts.Memory != nil {
		piece = d.opts.Memory.HostAlloc(readPiece)
	} else {
		piece = make([]byte, readPiece)
	}
	p := &piece
	g := &gate{}
	var (
		dst []byte // written only through g, read once the call returned
		ok  bool   // the read ran to its end
	)
	r, err := callGated(d, ctx, "get", key, func() (versioned, error) {
		ver, err := pr.getVersionPieces(ctx, key, *p, limit, func(b []byte, off, size int64) error {
			return g.do(func() {
				if dst == nil {
					if int64(cap(buf)) < size {
						buf = make([]byte, size)
					}
					dst = buf[:size]
				}
				copy(dst[off:], b)
			})
		})
		ok = err == nil
		return versioned{ver: ver}, err
	}, func(v versioned, left bool) versioned {
		if d.opts.Memory != nil {
			d.opts.Memory.HostFree(piece)
		}
		if !left && ok {
			v.b = dst // not a part of the object with an error
		}
		return v
	}, g)
	return r.b, r.ver, err
}

type versioned struct {
	b   []byte
	ver string
}

// GetRangeVersion forwards to the inner store's GetRangeVersion.
func (d *Deadline) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	v, ok := AsVersioned(d.Store)
	if !ok {
		return nil, "", &Error{Op: "get range", Store: d.ID(), Key: key, Err: errNotVersioned}
	}
	r, err := call(d, ctx, "get range", key, func() (versioned, error) {
		b, ver, err := v.GetRangeVersion(ctx, key, off, length)
		return versioned{b, ver}, err
	}, nil)
	return r.b, r.ver, err
}

// ListVersions lists through the inner store's ListVersions, gathering
// what it finds and handing it to fn only once the listing returned in
// time: fn never runs after ListVersions has.
func (d *Deadline) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	v, ok := AsVersioned(d.Store)
	if !ok {
		return &Error{Op: "list", Store: d.ID(), Key: prefix, Err: errNotVersioned}
	}
	found, err := call(d, ctx, "list", prefix, func() ([][2]string, error) {
		var found [][2]string
		err := v.ListVersions(ctx, prefix, func(k, ver string) { found = append(found, [2]string{k, ver}) })
		return found, err
	}, nil)
	if err != nil {
		return err
	}
	for _, kv := range found {
		fn(kv[0], kv[1])
	}
	return nil
}

// StatVersion forwards to the inner store's StatVersion.
func (d *Deadline) StatVersion(ctx context.Context, key string) (string, error) {
	st, ok := AsVersionStater(d.Store)
	if !ok {
		return "", &Error{Op: "stat", Store: d.ID(), Key: key, Err: errNotVersioned}
	}
	return call(d, ctx, "stat", key, func() (string, error) { return st.StatVersion(ctx, key) }, nil)
}
