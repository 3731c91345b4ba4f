package ratelog

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A flood of one message writes Burst lines and one summary with the
// count; other messages and debug lines are not held back by it.
func TestFloodSummarised(t *testing.T) {
	var out lockedBuf
	log := slog.New(must(New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}), Options{Burst: 3, Window: 100 * time.Millisecond})))
	for i := range 1000 {
		log.With("store", "s3://b").Warn("store request failed, giving up", "key", i)
		log.Debug("retrying", "key", i)
	}
	log.Error("cannot fill file", "file", "t/00.npy")
	time.Sleep(250 * time.Millisecond)
	s := out.String()
	if n := strings.Count(s, "giving up"); n != 4 {
		t.Errorf("%d lines of the flood, want 3 and a summary:\n%s", n, s)
	}
	if !strings.Contains(s, "repeated=997") {
		t.Errorf("no summary of the 997 held back:\n%s", s)
	}
	if n := strings.Count(s, "retrying"); n != 1000 {
		t.Errorf("%d debug lines, want all 1000", n)
	}
	if !strings.Contains(s, "cannot fill file") {
		t.Error("another message was held back")
	}
	// A later window passes lines again.
	log.Warn("store request failed, giving up", "key", "late")
	if !strings.Contains(out.String(), "key=late") {
		t.Error("a line in a new window was held back")
	}
}

// Records logged with an Unlimited context all pass, and do not count
// against the burst of the same message logged without one.
func TestUnlimited(t *testing.T) {
	var out lockedBuf
	log := slog.New(must(New(slog.NewTextHandler(&out, nil), Options{Burst: 3, Window: time.Minute})))
	ctx := Unlimited(context.Background())
	for i := range 50 {
		log.WarnContext(ctx, "array left out", "array", i)
	}
	for i := range 5 {
		log.Warn("array left out", "other", i)
	}
	s := out.String()
	if n := strings.Count(s, "array="); n != 50 {
		t.Errorf("%d of 50 unlimited lines passed", n)
	}
	if n := strings.Count(s, "other="); n != 3 {
		t.Errorf("%d limited lines passed, want the burst of 3", n)
	}
}

func TestNegativeOptionsRefused(t *testing.T) {
	for _, o := range []Options{{Burst: -1}, {Window: -time.Second}} {
		if _, err := New(slog.DiscardHandler, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
