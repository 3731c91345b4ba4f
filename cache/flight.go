package cache

import (
	"context"
	"errors"
)

// errRetry tells a caller of join that the key became indexed meanwhile.
var errRetry = errors.New("cache: look again")

// flight is one fill or fetch shared by every caller that asked for the same
// key while it ran. It runs in its own goroutine under a context that is
// cancelled when the last interested caller gives up or the Cache closes,
// so one caller's cancellation never fails the others, and work nobody
// wants any more stops.
type flight[T any] struct {
	done   chan struct{}
	val    T
	err    error
	refs   int // callers waiting or consuming; guarded by Cache.mu
	total  int // callers that ever joined; final once done
	cancel context.CancelFunc
}

// join runs run once per key among concurrent callers and hands each
// caller consume(result). consume runs while the caller still holds its
// reference, so release (called once, after the last reference goes, with
// the shared result) cannot race with it. shared tells consume whether
// other callers got the same result. ready, called with c.mu held, reports
// whether what run would make is already indexed.
func join[T, R any](c *Cache, flights map[string]*flight[T], key string, ctx context.Context,
	ready func() bool,
	run func(ctx context.Context) (T, error),
	consume func(v T, shared bool) (R, error),
	release func(T),
) (R, error) {
	var zero R
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return zero, ErrClosed
	}
	f := flights[key]
	if f == nil && ready() {
		// A flight for key finished between the caller's look at the index
		// and now: look again rather than fill twice.
		c.mu.Unlock()
		return zero, errRetry
	}
	if f == nil {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		stop := context.AfterFunc(c.base, cancel)
		f = &flight[T]{done: make(chan struct{}), cancel: cancel}
		flights[key] = f
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer stop()
			defer cancel()
			v, err := run(fctx)
			c.mu.Lock()
			f.val, f.err = v, err
			if flights[key] == f { // not abandoned and replaced meanwhile
				delete(flights, key)
			}
			close(f.done)
			orphan := f.refs == 0
			c.mu.Unlock()
			if orphan && err == nil && release != nil {
				release(v)
			}
		}()
	}
	f.refs++
	f.total++
	c.mu.Unlock()

	select {
	case <-f.done:
	case <-ctx.Done():
		c.mu.Lock()
		f.refs--
		last := f.refs == 0
		finished := isDone(f.done)
		if last && !finished && flights[key] == f {
			// Nobody wants this run any more: a caller arriving now must
			// start afresh, not join a run that is being cancelled.
			delete(flights, key)
		}
		c.mu.Unlock()
		if last {
			if finished {
				if f.err == nil && release != nil {
					release(f.val)
				}
			} else {
				f.cancel()
			}
		}
		return zero, ctx.Err()
	}
	var v R
	err := f.err
	if err == nil {
		v, err = consume(f.val, f.total > 1)
	}
	c.mu.Lock()
	f.refs--
	last := f.refs == 0
	c.mu.Unlock()
	if last && f.err == nil && release != nil {
		release(f.val)
	}
	return v, err
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
