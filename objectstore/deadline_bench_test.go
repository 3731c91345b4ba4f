package objectstore_test

import (
	"context"
	"testing"

	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/objectstore"
)

// BenchmarkDeadlineStat measures what the deadline adds to a local stat,
// the call a warm check makes per chunk.
func BenchmarkDeadlineStat(b *testing.B) {
	p, d := posixAndDeadline(b, map[string][]byte{"a/b/c/d": []byte("x")})
	ctx := context.Background()
	for _, c := range []struct {
		name string
		s    objectstore.VersionStater
	}{{"posix", p}, {"deadline", d}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.s.StatVersion(ctx, "a/b/c/d"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDeadlineRead measures what the deadline adds to reading a
// chunk-sized local file (7.5 MB, in the page cache) into a reused
// buffer, the read a fill makes per chunk: into a buffer of the caller's
// own (copied a piece at a time from memory of the read's), and into one
// the deadline's lender lent (read straight into, held by the read), as a
// fill's compressed chunks are.
func BenchmarkDeadlineRead(b *testing.B) {
	data := make([]byte, 7_500_000)
	for i := range data {
		data[i] = byte(i)
	}
	p, d := posixAndDeadline(b, map[string][]byte{"c/0": data})
	arena := memory.NewArena(64 << 20)
	defer arena.Close()
	lent, err := objectstore.WithDeadline(p, objectstore.DeadlineOptions{Memory: arena})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		s    objectstore.Versioned
		buf  []byte
	}{{"posix", p, make([]byte, len(data))}, {"deadline", d, make([]byte, len(data))}, {"deadline-lent", lent, arena.HostAlloc(len(data))}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := c.s.GetVersion(ctx, "c/0", c.buf, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// posixAndDeadline is a Posix store of files, and the Deadline over it.
func posixAndDeadline(b *testing.B, files map[string][]byte) (*objectstore.Posix, *objectstore.Deadline) {
	dir := b.TempDir()
	writeTree(b, dir, files)
	p, err := objectstore.OpenPosix(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	d, _ := objectstore.WithDeadline(p, objectstore.DeadlineOptions{})
	return p, d
}
