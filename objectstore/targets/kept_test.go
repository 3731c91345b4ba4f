package targets

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// Concurrent callers of one key share one load; a caller that gives up
// fails alone, not the others waiting on the load it started; a failed
// load is not kept; Max keeps the newest values.
func TestKept(t *testing.T) {
	k := Kept[int]{Max: 2}
	var loads atomic.Int32
	gate := make(chan struct{})
	load := func(ctx context.Context) (int, error) {
		loads.Add(1)
		<-gate
		return 7, ctx.Err()
	}
	first, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() { _, err := k.Get(first, "a", load); errs <- err }()
	for loads.Load() == 0 {
	}
	var wg sync.WaitGroup
	var bad atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := k.Get(context.Background(), "a", load); v != 7 || err != nil {
				bad.Add(1)
			}
		}()
	}
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: %v", err)
	}
	close(gate)
	wg.Wait()
	if bad.Load() != 0 || loads.Load() != 1 {
		t.Errorf("%d callers failed, %d loads; want 0 and 1 (the first caller's cancellation failed the others?)", bad.Load(), loads.Load())
	}

	fail := errors.New("boom")
	n := 0
	flaky := func(context.Context) (int, error) {
		n++
		if n == 1 {
			return 0, fail
		}
		return n, nil
	}
	ctx := context.Background()
	if _, err := k.Get(ctx, "b", flaky); !errors.Is(err, fail) {
		t.Fatalf("b: %v", err)
	}
	if v, err := k.Get(ctx, "b", flaky); v != 2 || err != nil {
		t.Fatalf("b again: %d, %v; a failed load was kept", v, err)
	}
	k.Get(ctx, "c", func(context.Context) (int, error) { return 3, nil })
	again := 0
	k.Get(ctx, "a", func(context.Context) (int, error) { again++; return 8, nil })
	if again != 1 {
		t.Error("a still kept after two newer values with Max 2")
	}
	if got := k.Drain(); len(got) != 2 {
		t.Errorf("Drain = %v, want the 2 kept", got)
	}
}
