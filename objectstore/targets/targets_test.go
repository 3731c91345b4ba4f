package targets

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
)

// gateStore serves ranges of a counting byte pattern, recording each
// request; the first request waits for the gate.
type gateStore struct {
	mu    sync.Mutex
	reqs  []string
	gate  chan struct{}
	first sync.Once
}

func (g *gateStore) ID() string { return "gate://x" }
func (*gateStore) Close() error { return nil }
func (g *gateStore) Get(context.Context, string) ([]byte, error) {
	return nil, objectstore.ErrNotFound
}
func (g *gateStore) List(context.Context, string) ([]string, error) { return nil, nil }
func (g *gateStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	g.first.Do(func() { <-g.gate })
	g.mu.Lock()
	g.reqs = append(g.reqs, fmt.Sprintf("%s %d+%d", key, off, n))
	g.mu.Unlock()
	if off+n > 1000 {
		return nil, fmt.Errorf("%w: %d+%d", objectstore.ErrRange, off, n)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(off + int64(i))
	}
	return b, nil
}

// Concurrent reads of one target, the same range twice among them, each
// get their own bytes, in a buffer of their own; a range past the end
// fails alone.
func TestConcurrentReads(t *testing.T) {
	g := &gateStore{gate: make(chan struct{})}
	r, err := New(Options{Openers: Openers{"s3": func(context.Context, string) (objectstore.Store, error) { return g, nil }},
		Scope: Scope{Places: []Place{{Prefix: "s3://b/", Name: "the bucket"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tg, err := r.Resolve(ctx, "s3://b/f.nc")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := r.Resolve(ctx, "s3://b/g.nc")
	type res struct {
		off, n int64
		b      []byte
		err    error
	}
	out := make(chan res, 10)
	read := func(t Target, off, n int64) {
		b, _, err := r.Read(ctx, t, off, n, 0)
		out <- res{off, n, b, err}
	}
	ranges := [][2]int64{{0, 10}, {120, 30}, {100, 20}, {100, 20}, {150, 10}, {400, 5}, {995, 10}}
	for _, rg := range ranges {
		go read(tg, rg[0], rg[1])
	}
	go read(other, 100, 20)
	close(g.gate)
	var same [][]byte
	for range len(ranges) + 1 {
		x := <-out
		if x.off+x.n > 1000 {
			if x.err == nil {
				t.Errorf("%d+%d past the end read", x.off, x.n)
			}
			continue
		}
		if x.err != nil || int64(len(x.b)) != x.n || x.b[0] != byte(x.off) || cap(x.b) != len(x.b) {
			t.Errorf("%d+%d: %d bytes (cap %d), %v", x.off, x.n, len(x.b), cap(x.b), x.err)
		}
		if x.off == 100 {
			same = append(same, x.b)
		}
	}
	for i := range same {
		for j := range i {
			if &same[i][0] == &same[j][0] {
				t.Error("two reads of one range share a buffer: a caller that reuses its own would write into the other's")
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.reqs) != len(ranges)+1 {
		t.Errorf("requests %v, want one per read", g.reqs)
	}
}

func waitFor(t *testing.T, f func() bool) {
	t.Helper()
	for start := time.Now(); !f(); time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("timed out")
		}
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	r, _ := New(Options{Base: dir, Aliases: map[string]string{"gcs": "gs"},
		Scope:   Scope{Places: []Place{{Prefix: dir, Name: "the reference set's folder"}, {Prefix: "gs://bucket/", Name: "--ref-allow"}}},
		Openers: Openers{"gs": func(_ context.Context, root string) (objectstore.Store, error) { return &gateStore{}, nil }}})
	ctx := context.Background()
	for raw, want := range map[string]string{
		"a/b.nc":               "file://" + dir + "/a/b.nc",
		"file://" + dir + "/x": "file://" + dir + "/x",
		"gcs://bucket/k/x.nc":  "gs://bucket/k/x.nc",
	} {
		tg, err := r.Resolve(ctx, raw)
		if err != nil || tg.URL != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", raw, tg.URL, err, want)
		}
	}
	for _, raw := range []string{"az://c/x", "s3://b/x", "gs://user@b/x", "gs://bucket/../x", "/etc/passwd", dir + "/../x", ""} {
		if _, err := r.Resolve(ctx, raw); err == nil {
			t.Errorf("Resolve(%q) succeeded", raw)
		}
	}
	none, _ := New(Options{})
	if _, err := none.Resolve(ctx, "/tmp/x"); err == nil {
		t.Error("a resolver without a local place read a local file")
	}
}
