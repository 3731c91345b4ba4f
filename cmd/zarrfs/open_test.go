package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
)

func TestBlobAccessFlags(t *testing.T) {
	own := strconv.Itoa(os.Getegid()) // a group anyone may give their files
	for _, tc := range []struct {
		mode, group string
		want        fs.FileMode
		gid         int // -1: none
		usage       bool
	}{
		{"", "", 0, -1, false},
		{"owner", "", 0o400, -1, false},
		{"all", "", 0o444, -1, false},
		{"0640", "", 0o440, -1, false},
		{"", own, 0o440, os.Getegid(), false}, // a gid; implies group
		{"all", own, 0o444, os.Getegid(), false},
		{"0604", own, 0, -1, true}, // the mode gives the group nothing
		{"0660", "", 0, -1, true},
		{"", "no-such-group-zarrfs", 0, -1, true},
	} {
		f := layoutFlags{cacheMode: tc.mode, cacheGroup: tc.group}
		mode, gid, err := f.blobAccess()
		var ue usageError
		if tc.usage {
			if !errors.As(err, &ue) {
				t.Errorf("--cache-mode %q --cache-group %q: %v, want a usage error", tc.mode, tc.group, err)
			}
			continue
		}
		if err != nil || mode != tc.want || (gid == nil) != (tc.gid < 0) || (gid != nil && int(*gid) != tc.gid) {
			t.Errorf("--cache-mode %q --cache-group %q = %04o, %v, %v", tc.mode, tc.group, mode, gid, err)
		}
	}
	if os.Geteuid() != 0 {
		// Not a member of root's group: refused.
		f := layoutFlags{cacheGroup: "0"}
		if _, _, err := f.blobAccess(); err == nil && os.Getegid() != 0 {
			t.Error("--cache-group of a group the user is not in accepted")
		}
	}
}

// A step of a starting command is tried again while its source is not
// answering, within the budget, and not at all after another error.
func TestUntilAnswers(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	down := fmt.Errorf("s3://b/k: get: %w", objectstore.ErrSourceDown)
	calls := 0
	err := untilAnswers(context.Background(), 10*time.Second, log, "testing", func() error {
		if calls++; calls < 3 {
			return down
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("silent twice: %v after %d tries, want success on the third", err, calls)
	}
	calls = 0
	other := errors.New("invalid JSON")
	if err := untilAnswers(context.Background(), 10*time.Second, log, "testing", func() error { calls++; return other }); err != other || calls != 1 {
		t.Errorf("another error: %v after %d tries, want it at once", err, calls)
	}
	calls = 0
	start := time.Now()
	err = untilAnswers(context.Background(), 1500*time.Millisecond, log, "testing", func() error { calls++; return down })
	if !errors.Is(err, objectstore.ErrSourceDown) || !strings.HasSuffix(err.Error(), "gave up after 1s (--source-timeout 1.5s, 2 tries)") || calls != 2 || time.Since(start) > 5*time.Second {
		t.Errorf("never answers, 1.5s budget: %v after %d tries in %v", err, calls, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := untilAnswers(ctx, 10*time.Second, log, "testing", func() error { return down }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}
