package memory

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestBudget(t *testing.T) {
	b := New(100)
	ctx := context.Background()
	if _, err := b.Acquire(ctx, 101); !errors.Is(err, ErrExceeded) {
		t.Fatalf("acquire beyond the budget: %v", err)
	}
	r1, err := b.Acquire(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	// 50 does not fit now: it waits, and a later small request waits
	// behind it (arrival order), until 60 is released.
	got := make(chan string, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		r, err := b.Acquire(ctx, 50)
		if err == nil {
			got <- "50"
			r()
		}
	}()
	time.Sleep(20 * time.Millisecond)
	go func() {
		defer wg.Done()
		r, err := b.Acquire(ctx, 10)
		if err == nil {
			got <- "10"
			r()
		}
	}()
	select {
	case g := <-got:
		t.Fatalf("%s granted while 60 of 100 are held ahead of it", g)
	case <-time.After(50 * time.Millisecond):
	}
	r1()
	r1() // idempotent
	if a, c := <-got, <-got; a+c != "5010" && a+c != "1050" {
		t.Errorf("granted %s and %s, want 50 and 10", a, c)
	}
	wg.Wait()
	if b.Used() != 0 || b.Peak() != 60 {
		t.Errorf("used %d, peak %d", b.Used(), b.Peak())
	}

	// A waiter whose context ends gives up and unblocks those behind it.
	r, _ := b.Acquire(ctx, 90)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(cctx, 20); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("acquire after the deadline: %v", err)
	}
	r2, err := b.Acquire(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	r2()
	r()

	// nil is unlimited.
	var none *Budget
	if rel, err := none.Acquire(ctx, 1<<62); err != nil {
		t.Fatal(err)
	} else {
		rel()
	}
	if New(0) != nil || none.Total() != 0 || !none.Fits(1<<62) {
		t.Error("zero budget is not unlimited")
	}
}

func TestDefaultBudget(t *testing.T) {
	if Available() <= 0 {
		t.Skip("memory size unknown here")
	}
	if d := DefaultBudget(); d < 512<<20 || d > Available() {
		t.Errorf("default budget %d of %d available", d, Available())
	}
}
