package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// remote is what the stores that read over HTTP (S3, GCS, HTTP) share,
// embedded in each: the bound on requests in flight, the transport whose
// idle connections Close releases, and the reads of Store, GetterInto and
// Versioned, which clean the key, refuse a negative length and wrap what
// fails with the store, key and operation around the store's own read.
type remote struct {
	id      string
	log     *slog.Logger
	timeout time.Duration // RequestTimeout: how long a request may make no progress
	slots   *Slots        // one slot per request in flight (MaxInFlight)
	outside atomic.Bool   // a decorator waits in slots before each call (QueueOutside)
	tr      http.RoundTripper
	// read reads a whole object of at most limit bytes (ranged false; into
	// buf when it is large enough) or length bytes at off (off < 0: the
	// last length bytes) of a key already cleaned, and returns the version
	// of the response.
	read func(ctx context.Context, k string, off, length int64, ranged bool, buf []byte, limit int64) ([]byte, string, error)
}

// ID names the store (its URL).
func (r *remote) ID() string { return r.id }

// QueueOutside hands the queue of MaxInFlight slots to the decorator that
// wraps the store (QueueingStore): from then on its requests are sent at
// once, the decorator holding a slot for each.
func (r *remote) QueueOutside() *Slots {
	r.outside.Store(true)
	return r.slots
}

// Close releases the idle connections kept for reuse. Calls made after it
// still work (they dial again).
func (r *remote) Close() error {
	if t, ok := r.tr.(idleCloser); ok {
		t.CloseIdleConnections()
	}
	return nil
}

// idleCloser is a transport that keeps idle connections (http.Transport).
type idleCloser interface {
	CloseIdleConnections()
}

var _ idleCloser = (*http.Transport)(nil)

// attempt is one request of a remote store under way: it holds one of the
// MaxInFlight slots (or the decorator outside holds one for it), and its
// stall timer runs: ctx ends once the request
// has made no progress for RequestTimeout, since it started or since its
// last progress (a read of its body that returned data, an entry of a
// listing received), so that a stall anywhere ends it while a large object
// or a long listing that keeps flowing is never cut off.
type attempt struct {
	ctx     context.Context
	cancel  context.CancelFunc
	timer   *time.Timer
	timeout time.Duration
	fired   atomic.Bool
	slots   *Slots // the queue the attempt holds a slot of; nil: the decorator outside holds it
}

// start waits for a slot (as long as ctx allows; not when a decorator
// outside waited for it: QueueOutside) and starts the request's stall
// timer; the caller ends the attempt with end.
func (r *remote) start(ctx context.Context) (*attempt, error) {
	a := &attempt{timeout: r.timeout}
	if !r.outside.Load() {
		if err := r.slots.Take(ctx); err != nil {
			return nil, err
		}
		a.slots = r.slots
	}
	a.ctx, a.cancel = context.WithCancel(ctx)
	a.timer = time.AfterFunc(r.timeout, func() { a.fired.Store(true); a.cancel() })
	return a, nil
}

// progress re-arms the stall timer.
func (a *attempt) progress() { a.timer.Reset(a.timeout) }

// stalled reports whether the stall timer ended the request.
func (a *attempt) stalled() bool { return a.fired.Load() }

// end stops the timer and gives the slot back.
func (a *attempt) end() {
	a.timer.Stop()
	a.cancel()
	if a.slots != nil {
		a.slots.Give()
	}
}

// progressReader re-arms a request's stall timer on every read of its
// body that returns data.
type progressReader struct {
	io.ReadCloser
	a *attempt
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.ReadCloser.Read(b)
	if n > 0 {
		p.a.progress()
	}
	return n, err
}

// Get reads a whole object.
func (r *remote) Get(ctx context.Context, key string) ([]byte, error) {
	b, _, err := r.GetVersion(ctx, key, nil, 0)
	return b, err
}

// GetInto is Get reading into buf when it is large enough.
func (r *remote) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	b, _, err := r.GetVersion(ctx, key, buf, limit)
	return b, err
}

// GetRange reads length bytes at off, or the last length bytes when off < 0,
// with one range request; what the response says of the range is checked
// against the request.
func (r *remote) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	b, _, err := r.GetRangeVersion(ctx, key, off, length)
	return b, err
}

// GetVersion reads a whole object and the version of its response.
func (r *remote) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return nil, "", &Error{Op: "get", Store: r.id, Key: key, Err: err}
	}
	b, v, err := r.read(ctx, k, 0, 0, false, buf, limit)
	if err != nil {
		return nil, "", &Error{Op: "get", Store: r.id, Key: k, Err: err}
	}
	return b, v, nil
}

// GetRangeVersion reads a byte range and the version of its response.
func (r *remote) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return nil, "", &Error{Op: "get range", Store: r.id, Key: key, Err: err}
	}
	if length < 0 {
		return nil, "", &Error{Op: "get range", Store: r.id, Key: k, Err: fmt.Errorf("negative length %d", length)}
	}
	b, v, err := r.read(ctx, k, off, length, true, nil, 0)
	if err != nil {
		return nil, "", &Error{Op: "get range", Store: r.id, Key: k, Err: err}
	}
	return b, v, nil
}

// checkContentRange checks the Content-Range of a 206 answer to a request
// for length bytes at off (off < 0: the last length bytes) whose
// Content-Length is want (-1: not sent), and returns the offset the range
// starts at and the object's size.
func checkContentRange(cr string, off, length, want int64) (int64, int64, error) {
	first, last, total, err := parseContentRange(cr)
	if err != nil {
		return 0, 0, Transient(fmt.Errorf("bad Content-Range %q: %w", cr, err))
	}
	if off < 0 {
		if total < length {
			return 0, 0, fmt.Errorf("%w: last %d bytes of %d", ErrRange, length, total)
		}
		off = total - length
	}
	if off+length > total {
		return 0, 0, fmt.Errorf("%w: %d+%d, size %d", ErrRange, off, length, total)
	}
	if first != off || last != off+length-1 {
		return 0, 0, Transient(fmt.Errorf("server sent bytes %d-%d for %d-%d", first, last, off, off+length-1))
	}
	if want >= 0 && want != length {
		return 0, 0, Transient(fmt.Errorf("Content-Length %d for a range of %d bytes", want, length))
	}
	return off, total, nil
}

// readBody reads a body of want bytes (-1: of no announced length, which
// its end tells) into into when it is large enough. A body of no announced
// length is refused past limit (SizeLimit); the caller checks an announced
// length before calling. A failure is classified by bodyError.
func readBody(ctx context.Context, a *attempt, body io.Reader, want int64, into []byte, limit int64) ([]byte, error) {
	if want >= 0 {
		var buf []byte
		if int64(cap(into)) >= want {
			buf = into[:want]
		} else {
			buf = make([]byte, want)
		}
		if n, err := io.ReadFull(body, buf); err != nil {
			return nil, bodyError(ctx, a, err, int64(n), want)
		}
		return buf, nil
	}
	buf, err := io.ReadAll(io.LimitReader(body, SizeLimit(limit)+1))
	if err != nil {
		return nil, bodyError(ctx, a, err, int64(len(buf)), want)
	}
	if err := checkSize(limit, int64(len(buf))); err != nil {
		return nil, err
	}
	return buf, nil
}

// bodyError classifies a failure reading a body after n of want bytes
// (want -1: a body of no announced length).
func bodyError(ctx context.Context, a *attempt, err error, n, want int64) error {
	if perr := ctx.Err(); perr != nil {
		return perr // the caller gave up: neither transient nor ours to report
	}
	if a.stalled() {
		return Transient(fmt.Errorf("request stalled: no data for %v after %d of %d bytes: %w", a.timeout, n, want, context.DeadlineExceeded))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		if want < 0 {
			return Transient(fmt.Errorf("%w: body of no announced length cut after %d bytes", ErrTruncated, n))
		}
		return Transient(fmt.Errorf("%w: %d of %d bytes", ErrTruncated, n, want))
	}
	return Transient(fmt.Errorf("reading body after %d of %d bytes: %w", n, want, err))
}

// statusDesc names an HTTP status for errors: "HTTP 503 Service Unavailable".
func statusDesc(status int) string {
	desc := "HTTP " + strconv.Itoa(status)
	if t := http.StatusText(status); t != "" {
		desc += " " + t
	}
	return desc
}

// statusClass classifies an error status (described by desc) of which the
// store knows nothing more particular: 416 is ErrRange; 5xx, 429 and 408
// are worth another attempt; anything else is permanent.
func statusClass(status int, desc string) error {
	switch {
	case status == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%w (%s)", ErrRange, desc)
	case status >= 500 || status == http.StatusTooManyRequests || status == http.StatusRequestTimeout:
		return Transient(errors.New(desc))
	}
	return errors.New(desc)
}
