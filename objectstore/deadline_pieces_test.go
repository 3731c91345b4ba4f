package objectstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/internal/memory"
)

// A local file read through a Deadline (GetVersion, GetInto) lands in the
// caller's buffer a piece at a time: the bytes and version of Posix's own read, the caller's
// buffer used when it is large enough, for sizes around a piece.
func TestDeadlinePiecesPosix(t *testing.T) {
	dir := t.TempDir()
	p, err := OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d, err := WithDeadline(p, DeadlineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []int{0, 1, readPiece - 1, readPiece, readPiece + 1, 3*readPiece + 5} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i*7 + i>>9)
		}
		key := fmt.Sprintf("f%d", n)
		if err := os.WriteFile(filepath.Join(dir, key), data, 0o644); err != nil {
			t.Fatal(err)
		}
		want, wantVer, err := p.GetVersion(ctx, key, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []int{0, n, n + 100} {
			buf := make([]byte, 0, c)
			got, ver, err := d.GetVersion(ctx, key, buf, 0)
			if err != nil || ver != wantVer || !bytes.Equal(got, want) || len(got) != n {
				t.Fatalf("%d bytes into a buffer of %d: %d bytes, %q, %v; want %q", n, c, len(got), ver, err, wantVer)
			}
			if n > 0 && c >= n && &got[0] != &buf[:1][0] {
				t.Errorf("%d bytes into a buffer of %d: not read into it", n, c)
			}
			if got, err := d.GetInto(ctx, key, buf, 0); err != nil || !bytes.Equal(got, want) || (n > 0 && c >= n && &got[0] != &buf[:1][0]) {
				t.Fatalf("GetInto, %d bytes into a buffer of %d: %d bytes, %v", n, c, len(got), err)
			}
		}
	}
	if _, _, err := d.GetVersion(ctx, "missing", nil, 0); !IsNotFound(err) {
		t.Errorf("a missing file: %v", err)
	}
}

// stallStore hands its first piece at once, then waits to be released
// before handing the others, as a read of a file on a filesystem that
// stops answering mid-file does.
type stallStore struct {
	Posix   // the methods a Versioned store needs; only GetVersion is read
	release chan struct{}
	puts    atomic.Int64
	stopped atomic.Value // the error put returned, if any
}

var _ pieceReader = (*stallStore)(nil)

func (s *stallStore) getVersionPieces(ctx context.Context, key string, piece []byte, limit int64, put func(b []byte, off, size int64) error) (string, error) {
	const size = 4 * readPiece
	for off := int64(0); off < size; off += readPiece {
		if off > 0 {
			<-s.release
		}
		for i := range piece {
			piece[i] = 0x11
		}
		s.puts.Add(1)
		if err := put(piece, off, size); err != nil {
			s.stopped.Store(err)
			return "", err
		}
	}
	return "v1", nil
}

// A read its caller left (deadline) writes nothing into the caller's
// buffer once the caller has its error, even when the filesystem answers
// afterwards, and stops reading at its next piece.
func TestDeadlinePiecesLeft(t *testing.T) {
	s := &stallStore{release: make(chan struct{})}
	d, err := WithDeadline(s, DeadlineOptions{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4*readPiece)
	_, _, err = d.GetVersion(context.Background(), "k", buf, 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a stalled read: %v", err)
	}
	if s.puts.Load() != 1 || buf[0] != 0x11 {
		t.Fatalf("the first piece did not land before the stall (%d pieces)", s.puts.Load())
	}
	for i := range buf {
		buf[i] = 0x55 // the caller reuses its buffer
	}
	close(s.release)
	for deadline := time.Now().Add(5 * time.Second); d.Blocked() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the left read did not return once released")
		}
	}
	if i := bytes.IndexFunc(buf, func(r rune) bool { return r != 0x55 }); i >= 0 {
		t.Fatalf("the read left behind wrote into its caller's buffer at %d", i)
	}
	if err, _ := s.stopped.Load().(error); !errors.Is(err, errGateClosed) || s.puts.Load() != 2 {
		t.Fatalf("the read went on after its caller left: %d pieces, stopped by %v", s.puts.Load(), err)
	}
}

// shortStore hands one piece of an object of two, then fails, as a file
// cut short under the read does.
type shortStore struct{ Posix }

var _ pieceReader = (*shortStore)(nil)

func (*shortStore) getVersionPieces(ctx context.Context, key string, piece []byte, limit int64, put func(b []byte, off, size int64) error) (string, error) {
	if err := put(piece, 0, 2*int64(len(piece))); err != nil {
		return "", err
	}
	return "", errors.New("unexpected EOF")
}

// A read that fails midway returns its error and none of the bytes.
func TestDeadlinePiecesShort(t *testing.T) {
	d, err := WithDeadline(&shortStore{}, DeadlineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, ver, err := d.GetVersion(context.Background(), "k", make([]byte, 0, 16), 0)
	if err == nil || b != nil || ver != "" {
		t.Fatalf("a read cut short: %d bytes, %q, %v", len(b), ver, err)
	}
}

// stallVersion writes into the buffer it reads into, then waits to be
// released before it writes again and returns: a read of a file on a
// filesystem that stops answering mid-file, straight into its caller's
// buffer.
type stallVersion struct {
	Posix
	release chan struct{}
	wrote   atomic.Int64
}

func (s *stallVersion) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	buf = buf[:cap(buf)]
	buf[0] = 0x11
	s.wrote.Add(1)
	<-s.release
	buf[len(buf)-1] = 0x22
	s.wrote.Add(1)
	return buf, "v1", nil
}

// A buffer the lender lent is read into straight, and held by the read: a
// read its caller left behind still lands in it, but the buffer is lent to
// nobody else until that read returned, however soon the caller gave it
// back.
func TestDeadlineHoldsLentBuffer(t *testing.T) {
	arena := memory.NewArena(64 << 20)
	defer arena.Close()
	dir := t.TempDir()
	data := bytes.Repeat([]byte("chunk"), 100_000)
	if err := os.WriteFile(filepath.Join(dir, "c"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d, err := WithDeadline(p, DeadlineOptions{Memory: arena})
	if err != nil {
		t.Fatal(err)
	}
	buf := arena.HostAlloc(len(data))
	got, _, err := d.GetVersion(context.Background(), "c", buf[:0], 0)
	if err != nil || !bytes.Equal(got, data) || &got[0] != &buf[0] {
		t.Fatalf("a local file into a lent buffer: %v, equal %v, in the buffer %v", err, bytes.Equal(got, data), &got[0] == &buf[0])
	}
	arena.HostFree(buf)
	if _, idle := arena.Held(); idle == 0 {
		t.Fatal("the read kept its hold after it returned")
	}

	s := &stallVersion{release: make(chan struct{})}
	d, err = WithDeadline(s, DeadlineOptions{Timeout: 50 * time.Millisecond, Memory: arena})
	if err != nil {
		t.Fatal(err)
	}
	buf = arena.HostAlloc(1 << 20)
	if _, _, err := d.GetVersion(context.Background(), "k", buf[:0], 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a stalled read: %v", err)
	}
	arena.HostFree(buf) // the caller is done with it; the read is not
	other := arena.HostAlloc(1 << 20)
	if &other[0] == &buf[0] {
		t.Fatal("a buffer a read left behind still writes into was lent again")
	}
	close(s.release)
	for deadline := time.Now().Add(5 * time.Second); d.Blocked() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the left read did not return once released")
		}
	}
	if s.wrote.Load() != 2 {
		t.Fatalf("%d writes", s.wrote.Load())
	}
	if again := arena.HostAlloc(1 << 20); &again[0] != &buf[0] {
		t.Error("the buffer did not go back once the read left behind returned")
	}
	arena.HostFree(other)
}

// A call refused before it runs (too many earlier reads blocked, or its
// context done) gives back what it took for the read: the hold on a lent
// buffer, and the buffer lent for a copy. Otherwise a source that hangs
// makes every refused read keep a buffer the lender never lends again.
func TestDeadlineRefusedGivesBack(t *testing.T) {
	arena := memory.NewArena(64 << 20)
	defer arena.Close()
	s := &stallVersion{release: make(chan struct{})}
	d, err := WithDeadline(s, DeadlineOptions{Timeout: 20 * time.Millisecond, MaxBlocked: 1, Memory: arena})
	if err != nil {
		t.Fatal(err)
	}
	first := arena.HostAlloc(1 << 20)
	if _, _, err := d.GetVersion(context.Background(), "k", first[:0], 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a stalled read: %v", err)
	}
	idle := func() int64 { _, i := arena.Held(); return i }
	lent := func() int64 { m, i := arena.Held(); return m - i }
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{{"blocked", context.Background()}, {"cancelled", cancelled()}} {
		name, ctx := c.name, c.ctx
		if name == "cancelled" {
			// Let the stalled read return: the refusal is the context's.
			close(s.release)
			for deadline := time.Now().Add(5 * time.Second); d.Blocked() > 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the left read did not return once released")
				}
			}
		}
		// Into a lent buffer (held by the call) ...
		buf := arena.HostAlloc(2 << 20)
		if _, _, err := d.GetVersion(ctx, "k", buf[:0], 0); err == nil {
			t.Fatalf("%s: a read was not refused", name)
		}
		before := idle()
		arena.HostFree(buf)
		if idle() == before {
			t.Errorf("%s: a refused read kept its hold on the lent buffer", name)
		}
		// ... and into a buffer of the caller's (copied from one lent).
		before = lent()
		if _, _, err := d.GetVersion(ctx, "k", make([]byte, 0, 3<<20), 0); err == nil {
			t.Fatalf("%s: a read was not refused", name)
		}
		if lent() != before {
			t.Errorf("%s: a refused read kept the buffer lent for its copy", name)
		}
	}
	arena.HostFree(first)
}

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
