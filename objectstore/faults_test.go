package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/objectstore"
)

// The fault checks every remote store (S3, GCS, HTTP) runs through a fault
// proxy in front of its server, on an object "big" of 2 MiB of random bytes.

// randomBytes returns n bytes of a seeded random source.
func randomBytes(n int, seed1, seed2 uint64) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed1, seed2))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// fastRetry fills what retry leaves zero with short waits and a budget
// that keeps every fault test well under a minute.
func fastRetry(retry objectstore.RetryOptions, log *slog.Logger) objectstore.RetryOptions {
	if retry.MaxAttempts == 0 {
		retry.MaxAttempts = 6
	}
	if retry.InitialBackoff == 0 {
		retry.InitialBackoff = 5 * time.Millisecond
	}
	if retry.MaxBackoff == 0 {
		retry.MaxBackoff = 50 * time.Millisecond
	}
	if retry.Budget == 0 {
		retry.Budget = 20 * time.Second
	}
	retry.Logger = log
	return retry
}

// guard bounds a call so that a hang fails the test instead of the run.
func guard(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type faultCase struct {
	name   string
	faults []faultproxy.Fault
}

func status(code int) faultproxy.Fault {
	return faultproxy.Fault{Kind: faultproxy.Status, Status: code}
}

// checkFaultsRecovered makes each read of big (whole, a range, a suffix)
// through s, a store with retries, meet each case's faults in turn: every
// read returns exactly the right bytes after them, every fault was
// injected, and each attempt was one request (the store's client re-read
// nothing behind the retry layer's back).
func checkFaultsRecovered(t *testing.T, p *faultproxy.Proxy, s objectstore.Store, big []byte, cases []faultCase) {
	reads := []struct {
		name string
		read func(ctx context.Context) ([]byte, error)
		want []byte
	}{
		{"get", func(ctx context.Context) ([]byte, error) { return s.Get(ctx, "big") }, big},
		{"range", func(ctx context.Context) ([]byte, error) { return s.GetRange(ctx, "big", 12345, 100_000) }, big[12345:112345]},
		{"suffix", func(ctx context.Context) ([]byte, error) { return s.GetRange(ctx, "big", -1, 4096) }, big[len(big)-4096:]},
	}
	for _, tc := range cases {
		for _, r := range reads {
			t.Run(tc.name+"/"+r.name, func(t *testing.T) {
				before, reqs := p.Faults(), p.Requests()
				p.SetRule(faultproxy.Sequence(faultproxy.ObjectGets, tc.faults...))
				defer p.SetRule(nil)
				ctx := guard(t)
				b, err := r.read(ctx)
				if ctx.Err() != nil {
					t.Fatal("read did not end within the guard")
				}
				if err != nil {
					t.Fatalf("read failed after retries: %v", err)
				}
				if !bytes.Equal(b, r.want) {
					t.Fatalf("read %d bytes, want %d: content differs", len(b), len(r.want))
				}
				if got := p.Faults() - before; got != int64(len(tc.faults)) {
					t.Fatalf("%d faults injected, want %d", got, len(tc.faults))
				}
				if got := p.Requests() - reqs; got != int64(len(tc.faults))+1 {
					t.Fatalf("%d requests for %d faults, want one per attempt", got, len(tc.faults))
				}
			})
		}
	}
}

// checkFaultsPersistent makes every read of big through a store of three
// attempts (open) meet the case's fault: it ends, within the budget, in a
// transient error that names the store (its scheme) and the key and says
// the attempts were spent: never in data, never in not-found, never in a
// hang. A truncated body says so.
func checkFaultsPersistent(t *testing.T, p *faultproxy.Proxy, open func(t *testing.T, retry objectstore.RetryOptions) objectstore.Store, scheme string, cases []faultCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, objectstore.RetryOptions{MaxAttempts: 3})
			p.SetRule(faultproxy.Always(faultproxy.ObjectGets, tc.faults[0]))
			defer p.SetRule(nil)
			before := p.Requests()
			ctx := guard(t)
			b, err := s.Get(ctx, "big")
			if ctx.Err() != nil {
				t.Fatal("read did not end within the guard")
			}
			if err == nil {
				t.Fatalf("read returned %d bytes through a permanent fault", len(b))
			}
			t.Logf("error: %v", err)
			if !objectstore.IsTransient(err) || objectstore.IsNotFound(err) {
				t.Fatalf("err = %v, want a transient error", err)
			}
			if n := p.Requests() - before; n != 3 {
				t.Fatalf("%d requests, want 3 attempts", n)
			}
			if !strings.Contains(err.Error(), scheme) || !strings.Contains(err.Error(), "big") || !strings.Contains(err.Error(), "gave up after 3 attempts") {
				t.Fatalf("error %q should name the store, the key and the attempts", err)
			}
			if tc.faults[0].Kind == faultproxy.Truncate && !errors.Is(err, objectstore.ErrTruncated) {
				t.Fatalf("error %q should say the body was truncated", err)
			}
		})
	}
}

// checkFaultsConcurrent has many readers at once read ranges of big
// through s, a store with retries, behind a proxy that breaks a third of
// the requests in assorted ways: every read returns exactly the right
// bytes, within the guard.
func checkFaultsConcurrent(t *testing.T, p *faultproxy.Proxy, s objectstore.Store, big []byte) {
	p.SetRule(faultproxy.Every(3, faultproxy.ObjectGets,
		faultproxy.Fault{Kind: faultproxy.Status, Status: 503},
		faultproxy.Fault{Kind: faultproxy.Reset, After: 700},
		faultproxy.Fault{Kind: faultproxy.Truncate, After: 20},
		faultproxy.Fault{Kind: faultproxy.Status, Status: 429},
		faultproxy.Fault{Kind: faultproxy.Stall, After: 1, StallFor: time.Minute}))
	defer p.SetRule(nil)
	ctx := guard(t)
	var wg sync.WaitGroup
	errs := make(chan error, 256)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 6 {
				off := rng.Int64N(int64(len(big)) - 1)
				n := 1 + rng.Int64N(min(int64(len(big))-off, 300_000))
				b, err := s.GetRange(ctx, "big", off, n)
				if err != nil {
					errs <- err
				} else if !bytes.Equal(b, big[off:off+n]) {
					errs <- errors.New("wrong bytes returned")
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ctx.Err() != nil {
		t.Fatal("reads did not end within the guard")
	}
	if p.Faults() < 10 {
		t.Fatalf("only %d faults injected", p.Faults())
	}
}
