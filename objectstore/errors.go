package objectstore

import (
	"context"
	"errors"
	"io/fs"
)

// Error classes beyond ErrNotFound and ErrInvalidKey. They are part of the
// Store contract so that decorators (retry, cache fill) decide what to do
// with a failure without knowing which backend produced it: a backend
// classifies its errors where it knows the most, at the source.

// ErrPermission is returned (wrapped) when the source refuses access: HTTP
// 403 from S3 (a rejected or insufficient credential), EACCES from a local
// file. It is never retried and never read as a missing key. It is
// fs.ErrPermission, so errors.Is works for local and remote stores alike.
var ErrPermission = fs.ErrPermission

// ErrRange is returned (wrapped) when a requested byte range runs past the
// end of the object. Callers know the sizes they ask for, so this is a
// permanent error (a bug or a store that changed under us), not a retry.
var ErrRange = errors.New("range past end of object")

// ErrTruncated is returned (wrapped, and marked transient) when a response
// body ends before the length the server announced or the range asked for.
// Such a body is never returned as data.
var ErrTruncated = errors.New("truncated response")

// transientError marks a failure that may succeed if the same request is
// made again: a 5xx, throttling, a reset connection, a truncated body, a
// request that ran past its timeout.
type transientError struct{ err error }

func (e *transientError) Error() string   { return e.err.Error() }
func (e *transientError) Unwrap() error   { return e.err }
func (e *transientError) Transient() bool { return true }

// Transient marks err as transient (worth retrying). It returns nil for nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err: err}
}

// IsTransient reports whether err may go away when the request is repeated:
// some error in its chain has a Transient() method returning true, and none
// of the permanent classes (not found, invalid key, permission, range, a
// cancelled context) is in the chain. Whatever a backend did not mark is
// permanent, so an unknown failure is never retried in a loop.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidKey) ||
		errors.Is(err, ErrPermission) || errors.Is(err, ErrRange) ||
		errors.Is(err, context.Canceled) {
		return false
	}
	var t transienter
	return errors.As(err, &t) && t.Transient()
}

// transienter is an error that says whether it may pass (transientError).
type transienter interface {
	Transient() bool
}

var _ transienter = (*transientError)(nil)

// IsPermission reports whether err means the source refused access.
func IsPermission(err error) bool { return errors.Is(err, ErrPermission) }

// ErrNoListing is returned (wrapped) by List and ListVersions of a store
// that cannot list its keys (an HTTP server): its tree must come from
// consolidated metadata, and versions from the responses that read objects.
// It is permanent, and never a missing key.
var ErrNoListing = errors.New("the store cannot list its keys")
