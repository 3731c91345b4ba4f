package objectstore

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
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
	sem     chan struct{} // one slot per request in flight (MaxInFlight)
	tr      http.RoundTripper
	// read reads a whole object (ranged false; into buf when it is large
	// enough) or length bytes at off (off < 0: the last length bytes) of a
	// key already cleaned, and returns the version of the response.
	read func(ctx context.Context, k string, off, length int64, ranged bool, buf []byte) ([]byte, string, error)
}

// ID names the store (its URL).
func (r *remote) ID() string { return r.id }

// QueuesRequests reports that requests wait for one of MaxInFlight slots;
// the store calls StartAttempt when a request gets one (see QueueingStore).
func (r *remote) QueuesRequests() bool { return true }

// Close releases the idle connections kept for reuse. Calls made after it
// still work (they dial again).
func (r *remote) Close() error {
	if t, ok := r.tr.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
	return nil
}

func (r *remote) acquire(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *remote) release() { <-r.sem }

// Get reads a whole object.
func (r *remote) Get(ctx context.Context, key string) ([]byte, error) {
	b, _, err := r.GetVersion(ctx, key, nil)
	return b, err
}

// GetInto is Get reading into buf when it is large enough.
func (r *remote) GetInto(ctx context.Context, key string, buf []byte) ([]byte, error) {
	b, _, err := r.GetVersion(ctx, key, buf)
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
func (r *remote) GetVersion(ctx context.Context, key string, buf []byte) ([]byte, string, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return nil, "", &Error{Op: "get", Store: r.id, Key: key, Err: err}
	}
	b, v, err := r.read(ctx, k, 0, 0, false, buf)
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
	b, v, err := r.read(ctx, k, off, length, true, nil)
	if err != nil {
		return nil, "", &Error{Op: "get range", Store: r.id, Key: k, Err: err}
	}
	return b, v, nil
}
