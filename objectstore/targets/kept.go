package targets

import (
	"context"
	"sync"
)

// Kept holds what a virtual store reads once and uses often: the stores
// its targets lie in, Icechunk manifests, Parquet record files. Concurrent
// callers of one key share one load, and the last Max values loaded are
// kept (all of them when Max is 0). A Kept is safe for concurrent use.
type Kept[V any] struct {
	// Max bounds the values kept; 0 keeps every one.
	Max int

	mu      sync.Mutex
	vals    map[string]V
	order   []string // oldest first
	loading map[string]*loading[V]
}

type loading[V any] struct {
	done chan struct{}
	v    V
	err  error
}

// Get returns the value of key, loading it with load when it is not kept.
// The load runs without the caller's cancellation, since other callers may
// wait for it (the stores bound every request's time); a caller whose ctx
// ends stops waiting at once. A failed load is not kept: the next Get
// loads again.
func (k *Kept[V]) Get(ctx context.Context, key string, load func(context.Context) (V, error)) (V, error) {
	k.mu.Lock()
	if v, ok := k.vals[key]; ok {
		k.mu.Unlock()
		return v, nil
	}
	l, ok := k.loading[key]
	if !ok {
		l = &loading[V]{done: make(chan struct{})}
		if k.loading == nil {
			k.loading = map[string]*loading[V]{}
			k.vals = map[string]V{}
		}
		k.loading[key] = l
		go k.load(context.WithoutCancel(ctx), key, l, load)
	}
	k.mu.Unlock()
	select {
	case <-l.done:
		return l.v, l.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

func (k *Kept[V]) load(ctx context.Context, key string, l *loading[V], load func(context.Context) (V, error)) {
	l.v, l.err = load(ctx)
	k.mu.Lock()
	delete(k.loading, key)
	if l.err == nil {
		k.vals[key] = l.v
		k.order = append(k.order, key)
		for k.Max > 0 && len(k.order) > k.Max {
			delete(k.vals, k.order[0])
			k.order = k.order[1:]
		}
	}
	k.mu.Unlock()
	close(l.done)
}

// Drain removes every kept value and returns them (to be closed).
func (k *Kept[V]) Drain() []V {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]V, 0, len(k.order))
	for _, key := range k.order {
		out = append(out, k.vals[key])
	}
	k.vals, k.order = map[string]V{}, nil
	return out
}
