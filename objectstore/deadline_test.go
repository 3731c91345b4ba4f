package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/storetest"
)

// hungStore blocks every call while hung, as a read of a file on a
// filesystem that stopped answering blocks in the kernel (its context is
// of no help), and answers once released: GetInto writes into the buffer
// it was given, the way a read system call does.
type hungStore struct {
	mu      sync.Mutex
	release chan struct{}
	calls   atomic.Int64
	fnCalls atomic.Int64 // ListVersions callbacks made
}

func newHung() *hungStore { return &hungStore{release: make(chan struct{})} }

func (h *hungStore) wait() {
	h.calls.Add(1)
	h.mu.Lock()
	ch := h.release
	h.mu.Unlock()
	<-ch
}

// answer releases every blocked call, and lets later calls through.
func (h *hungStore) answer() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.release)
}

func (h *hungStore) ID() string { return "file:///hung" }
func (*hungStore) Close() error { return nil }
func (h *hungStore) Get(ctx context.Context, key string) ([]byte, error) {
	h.wait()
	return []byte("data"), nil
}
func (h *hungStore) GetInto(ctx context.Context, key string, buf []byte, limit int64) ([]byte, error) {
	h.wait()
	if cap(buf) < 4 {
		buf = make([]byte, 4)
	}
	buf = buf[:4]
	copy(buf, "late")
	return buf, nil
}
func (h *hungStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	return h.Get(ctx, key)
}
func (h *hungStore) List(ctx context.Context, prefix string) ([]string, error) {
	h.wait()
	return []string{"k"}, nil
}
func (h *hungStore) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	b, err := h.GetInto(ctx, key, buf, limit)
	return b, "v1", err
}
func (h *hungStore) GetRangeVersion(ctx context.Context, key string, off, n int64) ([]byte, string, error) {
	b, err := h.Get(ctx, key)
	return b, "v1", err
}
func (h *hungStore) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	h.wait()
	h.fnCalls.Add(1)
	fn("k", "v1")
	return nil
}
func (h *hungStore) StatVersion(ctx context.Context, key string) (string, error) {
	h.wait()
	return "v1", nil
}

// A call to a store that does not return fails once its deadline passes,
// with a transient error that a breaker reads as silence; past MaxBlocked
// calls left waiting, new calls fail at once; when the store answers, the
// blocked calls return and calls pass again. A call left behind writes
// neither into the buffer its caller passed nor into the caller's
// listing callback.
func TestDeadline(t *testing.T) {
	h := newHung()
	d, err := objectstore.WithDeadline(h, objectstore.DeadlineOptions{Timeout: 50 * time.Millisecond, MaxBlocked: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	buf := bytes.Repeat([]byte{0xaa}, 16)
	start := time.Now()
	b, err := d.GetInto(ctx, "k", buf, 0)
	if b != nil || !errors.Is(err, context.DeadlineExceeded) || !objectstore.IsTransient(err) || time.Since(start) > 2*time.Second {
		t.Fatalf("GetInto of a hung store: %q, %v after %v; want a transient deadline error after 50ms", b, err, time.Since(start))
	}
	called := false
	if err := d.ListVersions(ctx, "", func(k, v string) { called = true }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ListVersions: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	if _, err := d.StatVersion(cctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("StatVersion with its context cancelled: %v", err)
	}
	if n := d.Blocked(); n != 3 {
		t.Fatalf("%d calls blocked, want 3", n)
	}
	calls := h.calls.Load()
	start = time.Now()
	_, err = d.Get(ctx, "k")
	if !errors.Is(err, objectstore.ErrSourceDown) || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Millisecond {
		t.Fatalf("get at the bound: %v after %v; want ErrSourceDown at once", err, time.Since(start))
	}
	if h.calls.Load() != calls {
		t.Error("a call at the bound reached the store")
	}

	h.answer()
	for deadline := time.Now().Add(5 * time.Second); d.Blocked() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls still blocked after the store answered", d.Blocked())
		}
	}
	if !bytes.Equal(buf, bytes.Repeat([]byte{0xaa}, 16)) {
		t.Errorf("a call left behind wrote into its caller's buffer: % x", buf)
	}
	if called || h.fnCalls.Load() != 1 {
		t.Errorf("a listing left behind called its caller's fn (%v)", called)
	}
	b, err = d.GetInto(ctx, "k", buf, 0)
	if err != nil || string(b) != "late" || &b[0] != &buf[0] {
		t.Errorf("GetInto after the store answered: %q, %v (into the caller's buffer: %v)", b, err, err == nil && &b[0] == &buf[0])
	}
	if v, err := d.StatVersion(ctx, "k"); err != nil || v != "v1" {
		t.Errorf("StatVersion: %q, %v", v, err)
	}
	n := 0
	if err := d.ListVersions(ctx, "", func(k, v string) { n++ }); err != nil || n != 1 {
		t.Errorf("ListVersions: %d, %v", n, err)
	}
	if _, err := objectstore.WithDeadline(h, objectstore.DeadlineOptions{Timeout: -time.Second}); err == nil {
		t.Error("a negative timeout was accepted")
	}
}

// Behind a breaker, a hung local store is found silent at the first
// deadline (nothing answered for Quiet) and fails every read at once; the
// breaker's probes, bounded by the deadline too, find it answering again.
func TestDeadlineBehindBreaker(t *testing.T) {
	h := newHung()
	d, _ := objectstore.WithDeadline(h, objectstore.DeadlineOptions{Timeout: 50 * time.Millisecond, MaxBlocked: 4})
	br := must(objectstore.WithBreaker(d, objectstore.BreakerOptions{Silence: 20 * time.Millisecond, Quiet: 40 * time.Millisecond,
		Probe: 10 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond}))
	defer br.Close()
	ctx := context.Background()
	if _, err := br.GetRange(ctx, "k", 0, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first read: %v", err)
	}
	if !br.Open() {
		t.Fatal("breaker closed after a read ran past its deadline with nothing answered")
	}
	start := time.Now()
	if _, err := br.Get(ctx, "k"); !errors.Is(err, objectstore.ErrSourceDown) || time.Since(start) > 10*time.Millisecond {
		t.Fatalf("read with the breaker open: %v after %v", err, time.Since(start))
	}
	time.Sleep(300 * time.Millisecond) // probes pile up to the bound, no further
	if n := d.Blocked(); n > 4 {
		t.Errorf("%d calls blocked, past the bound of 4", n)
	}
	h.answer()
	for deadline := time.Now().Add(5 * time.Second); br.Open(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("breaker still open 5s after the store answered")
		}
	}
	if b, err := br.Get(ctx, "k"); err != nil || string(b) != "data" {
		t.Fatalf("read after the store answered: %q, %v", b, err)
	}
	if _, ok := objectstore.AsVersionStater(br); !ok {
		t.Error("the breaker hides the store's StatVersion")
	}
	if _, ok := objectstore.AsVersionStater(must(objectstore.WithBreaker(&silentStore{}, objectstore.BreakerOptions{}))); ok {
		t.Error("a breaker over a store without StatVersion claims one")
	}
}

func TestPosixThroughDeadlineConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, files map[string][]byte) objectstore.Store {
		d, err := objectstore.WithDeadline(newPosix(t, files), objectstore.DeadlineOptions{})
		if err != nil {
			t.Fatal(err)
		}
		br := must(objectstore.WithBreaker(d, objectstore.BreakerOptions{}))
		t.Cleanup(func() { br.Close() })
		if !objectstore.IsLocal(br) {
			t.Error("IsLocal is false through the decorators")
		}
		return br
	})
}
