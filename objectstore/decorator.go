package objectstore

import "context"

// decorator is embedded by every decorator of the package (Retry,
// Breaker, Deadline, TrustMetadata's): it holds the store decorated and
// forwards to it what a decorator does not change, so that none hides an
// upgrade of the store it wraps by forgetting to forward it:
//
//   - Unwrap, the store wrapped, through which IsLocal, ObjectsPerListing
//     and DescribeVersions see the store at the bottom of a chain;
//   - Identity (Identifier);
//   - QueueOutside (QueueingStore), so that a Retry or Breaker outside
//     takes over the queue below and starts its timers when a request
//     leaves it;
//   - Close, which closes the store wrapped: closing the outermost store
//     of a chain closes all of it;
//   - versioned and statesVersions, which tell AsVersioned and
//     AsVersionStater whether the store wrapped can tell versions: a
//     decorator has the Versioned and VersionStater methods whatever it
//     wraps.
//
// Reads (Get, GetInto, GetRange, List and the versioned ones) are each
// decorator's own.
type decorator struct{ Store }

// Unwrap returns the store decorated.
func (d decorator) Unwrap() Store { return d.Store }

// Identity forwards the decorated store's identity.
func (d decorator) Identity() string { return Identity(d.Store) }

// QueueOutside hands over the decorated store's queue.
func (d decorator) QueueOutside() *Slots { return queueOutside(d.Store) }

// Close closes the decorated store.
func (d decorator) Close() error { return d.Store.Close() }

func (d decorator) versioned() bool      { _, ok := AsVersioned(d.Store); return ok }
func (d decorator) statesVersions() bool { _, ok := AsVersionStater(d.Store); return ok }

// getInto reads a whole object through the decorated store's GetInto, or
// its Get when it has none.
func (d decorator) getInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	return GetLimit(ctx, d.Store, key, limit)
}
