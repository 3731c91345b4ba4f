package objectstore_test

import (
	"context"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
)

// upgraded is a store with every upgrade a decorator may forward: it
// counts the GetInto calls and Closes that reach it.
type upgraded struct {
	bare
	into, closed int
	slots        *objectstore.Slots
}

func (u *upgraded) Identity() string                 { return "mem://x@elsewhere" }
func (u *upgraded) QueueOutside() *objectstore.Slots { return u.slots }
func (u *upgraded) Close() error                     { u.closed++; return nil }
func (u *upgraded) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	u.into++
	return append(buf[:0], "data"...), nil
}
func (u *upgraded) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	return append(buf[:0], "data"...), "v1", nil
}
func (u *upgraded) GetRangeVersion(ctx context.Context, key string, off, length int64) ([]byte, string, error) {
	return []byte("d"), "v1", nil
}
func (u *upgraded) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	fn("k", "v1")
	return nil
}
func (u *upgraded) StatVersion(ctx context.Context, key string) (string, error) { return "v1", nil }
func (u *upgraded) ObjectsPerListing() int                                      { return 7 }

// bare is a store with no upgrade at all.
type bare struct{}

func (bare) Get(ctx context.Context, key string) ([]byte, error) { return []byte("data"), nil }
func (bare) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	return []byte("d"), nil
}
func (bare) List(ctx context.Context, prefix string) ([]string, error) { return []string{"k"}, nil }
func (bare) ID() string                                                { return "mem://x" }
func (bare) Close() error                                              { return nil }

// Every decorator, alone or in a chain, forwards every upgrade of the
// store it wraps, and claims none the store lacks: a chain is as capable
// as the store at its bottom, and closing its outermost store closes that
// store once.
func TestDecoratorsForwardUpgrades(t *testing.T) {
	ctx := context.Background()
	chains := map[string]func(objectstore.Store) objectstore.Store{
		"retry": func(s objectstore.Store) objectstore.Store {
			return must(objectstore.WithRetry(s, objectstore.RetryOptions{}))
		},
		"breaker": func(s objectstore.Store) objectstore.Store {
			return must(objectstore.WithBreaker(s, objectstore.BreakerOptions{}))
		},
		"deadline": func(s objectstore.Store) objectstore.Store {
			d, err := objectstore.WithDeadline(s, objectstore.DeadlineOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		"retry(breaker(deadline))": func(s objectstore.Store) objectstore.Store {
			d, _ := objectstore.WithDeadline(s, objectstore.DeadlineOptions{})
			return must(objectstore.WithRetry(must(objectstore.WithBreaker(d, objectstore.BreakerOptions{})), objectstore.RetryOptions{}))
		},
		"trust(retry(breaker))": func(s objectstore.Store) objectstore.Store {
			return objectstore.TrustMetadata(must(objectstore.WithRetry(must(objectstore.WithBreaker(s, objectstore.BreakerOptions{})), objectstore.RetryOptions{})))
		},
	}
	for name, wrap := range chains {
		t.Run(name, func(t *testing.T) {
			trusts := name[:5] == "trust"
			inner := &upgraded{slots: objectstore.NewSlots(1)}
			s := wrap(inner)
			bottom := s
			for u := objectstore.Unwrap(bottom); u != nil; u = objectstore.Unwrap(bottom) {
				bottom = u
			}
			if bottom != objectstore.Store(inner) {
				t.Errorf("Unwrap leads to %T, not the store decorated", bottom)
			}
			if got := objectstore.Identity(s); got != inner.Identity() {
				t.Errorf("Identity = %q, want the inner store's %q", got, inner.Identity())
			}
			if q, ok := s.(objectstore.QueueingStore); !ok || q.QueueOutside() != inner.slots {
				t.Error("the inner store's queue is hidden (QueueOutside)")
			}
			if objectstore.ObjectsPerListing(s) != 7 {
				t.Errorf("ObjectsPerListing = %d, want the inner store's 7", objectstore.ObjectsPerListing(s))
			}
			gi, ok := s.(objectstore.GetterInto)
			if !ok {
				t.Fatal("not a GetterInto")
			}
			if b, err := gi.GetInto(ctx, "k", make([]byte, 0, 8), 0); err != nil || string(b) != "data" || inner.into != 1 {
				t.Errorf("GetInto = %q, %v; %d GetInto calls reached the inner store, want 1", b, err, inner.into)
			}
			if _, ok := objectstore.AsVersioned(s); ok == trusts {
				t.Errorf("AsVersioned = %v, want %v", ok, !trusts)
			}
			if _, ok := objectstore.AsVersionStater(s); ok == trusts {
				t.Errorf("AsVersionStater = %v, want %v", ok, !trusts)
			}
			if err := s.Close(); err != nil || inner.closed != 1 {
				t.Errorf("Close = %v: the inner store was closed %d times, want 1", err, inner.closed)
			}

			plain := wrap(bare{})
			if q, ok := plain.(objectstore.QueueingStore); ok && q.QueueOutside() != nil {
				t.Error("over a store that does not queue: QueueOutside hands a queue over")
			}
			if _, ok := objectstore.AsVersioned(plain); ok {
				t.Error("over a store without versions: AsVersioned is true")
			}
			if _, ok := objectstore.AsVersionStater(plain); ok {
				t.Error("over a store without StatVersion: AsVersionStater is true")
			}
			if objectstore.Identity(plain) != "mem://x" || objectstore.ObjectsPerListing(plain) != 0 {
				t.Errorf("over a bare store: Identity %q, ObjectsPerListing %d", objectstore.Identity(plain), objectstore.ObjectsPerListing(plain))
			}
			if b, err := plain.(objectstore.GetterInto).GetInto(ctx, "k", nil, 0); err != nil || string(b) != "data" {
				t.Errorf("GetInto over a store without it: %q, %v", b, err)
			}
			if err := plain.Close(); err != nil {
				t.Errorf("Close over a bare store: %v", err)
			}
		})
	}
}
