// Package ratelog keeps a daemon's log readable when something fails over
// and over: an slog.Handler that passes at most Burst records of each
// message (and level) per Window, and reports how many it held back in one
// line when the window ends. A source outage that fails thousands of
// requests then writes a few lines and a count, not megabytes.
//
// Records below slog.LevelInfo pass unlimited: debug output is asked for;
// so do records logged with a context from Unlimited, for lines that must
// each be seen however many there are (every array left out of a mount
// named once: their number has a bound of its own).
// A Handler and those derived from it (WithAttrs, WithGroup) share their
// counts, and are safe for concurrent use.
package ratelog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Options configures New. Zero values mean the defaults.
type Options struct {
	// Burst is how many records of one message pass per Window. 0: 10.
	Burst int
	// Window is the period the burst is counted over. 0: 10s.
	Window time.Duration
}

// Handler is the rate-limiting slog.Handler.
type Handler struct {
	next slog.Handler
	s    *state
}

type key struct {
	level slog.Level
	msg   string
}

type count struct {
	start   time.Time
	n       int // records seen in this window
	held    int // of them, held back
	handler slog.Handler
	timer   *time.Timer
}

type state struct {
	opts Options
	mu   sync.Mutex
	keys map[key]*count
}

var _ slog.Handler = (*Handler)(nil)

// New wraps next. A negative Burst or Window is refused, not turned into
// the default.
func New(next slog.Handler, opts Options) (*Handler, error) {
	if opts.Burst < 0 || opts.Window < 0 {
		return nil, fmt.Errorf("ratelog: Options burst %d, window %v: want 0 (the default) or more", opts.Burst, opts.Window)
	}
	if opts.Burst == 0 {
		opts.Burst = 10
	}
	if opts.Window == 0 {
		opts.Window = 10 * time.Second
	}
	return &Handler{next: next, s: &state{opts: opts, keys: map[key]*count{}}}, nil
}

func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), s: h.s}
}

func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), s: h.s}
}

type unlimitedKey struct{}

// Unlimited returns ctx marked so that records logged with it (slog's
// ...Context methods) are never held back.
func Unlimited(ctx context.Context) context.Context {
	return context.WithValue(ctx, unlimitedKey{}, true)
}

// maxKeys bounds the messages tracked at once; past it, counts start over.
const maxKeys = 4096

func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo || ctx.Value(unlimitedKey{}) != nil {
		return h.next.Handle(ctx, r)
	}
	s := h.s
	k := key{r.Level, r.Message}
	now := r.Time
	if now.IsZero() {
		now = time.Now()
	}
	s.mu.Lock()
	c := s.keys[k]
	if c == nil || now.Sub(c.start) >= s.opts.Window {
		if c != nil && c.held > 0 {
			// A new window began before the timer's summary: it goes now.
			c.timer.Stop()
			s.summaryLocked(k, c)
		}
		if len(s.keys) >= maxKeys {
			clear(s.keys)
		}
		c = &count{start: now}
		s.keys[k] = c
	}
	c.n++
	if c.n <= s.opts.Burst {
		s.mu.Unlock()
		return h.next.Handle(ctx, r)
	}
	c.held++
	if c.held == 1 {
		c.handler = h.next
		c.timer = time.AfterFunc(c.start.Add(s.opts.Window).Sub(now), func() {
			s.mu.Lock()
			if s.keys[k] == c && c.held > 0 {
				s.summaryLocked(k, c)
			}
			s.mu.Unlock()
		})
	}
	s.mu.Unlock()
	return nil
}

// summaryLocked writes the one line that stands for the records c held
// back, and zeroes the count.
func (s *state) summaryLocked(k key, c *count) {
	r := slog.NewRecord(time.Now(), k.level, k.msg, 0)
	r.AddAttrs(slog.Int("repeated", c.held), slog.Duration("within", s.opts.Window),
		slog.String("note", "similar lines held back"))
	c.held = 0
	c.handler.Handle(context.Background(), r)
}
