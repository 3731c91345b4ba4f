package cache

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// buildCache fills dir with n blobs of size bytes, 1000 to a directory,
// through the public API (without fsync, which would only slow the setup).
// With kill set the instance is abandoned instead of closed, so every entry
// is left for the next Open to verify.
func buildCache(b *testing.B, dir string, n, size int, kill bool) {
	c, err := Open(Options{Dir: dir, noSync: true})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, size)
	for i := range n {
		k := BlobKey{Layout: "0123456789abcdef", Path: fmt.Sprintf("v%03d/%05d.npy", i/1000, i)}
		h, _, err := c.GetBlob(context.Background(), k, int64(size), writeFill(data), nil)
		if err != nil {
			b.Fatal(err)
		}
		h.Close()
	}
	if kill {
		c.abandon()
		return
	}
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkOpen measures restarting on a warm cache of 100,000 blobs: after
// a clean Close (one read of the journal), and after a kill (every entry
// suspicious: each file is stat'ed and hashed).
func BenchmarkOpen(b *testing.B) {
	const n = 100_000
	b.Run("clean-100k", func(b *testing.B) {
		dir := b.TempDir()
		buildCache(b, dir, n, 1024, false)
		for b.Loop() {
			c, err := Open(Options{Dir: dir})
			if err != nil {
				b.Fatal(err)
			}
			if _, files := c.Usage(); files != n {
				b.Fatalf("%d entries", files)
			}
			b.StopTimer()
			c.Close()
			b.StartTimer()
		}
	})
	// The peer: what re-indexing by a scan would cost at the least (walk
	// and stat every file, no checksums), on the same tree.
	b.Run("scan-100k", func(b *testing.B) {
		dir := b.TempDir()
		buildCache(b, dir, n, 1024, false)
		for b.Loop() {
			files := 0
			filepath.WalkDir(filepath.Join(dir, blobsDir), func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					if _, err := d.Info(); err == nil {
						files++
					}
				}
				return nil
			})
			if files != n {
				b.Fatalf("%d files", files)
			}
		}
	})
	b.Run("after-kill-100k-1KiB", func(b *testing.B) {
		dir := b.TempDir()
		buildCache(b, dir, n, 1024, true)
		jp := filepath.Join(dir, journalRel)
		killed, err := os.ReadFile(jp)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(n * 1024)
		for b.Loop() {
			c, err := Open(Options{Dir: dir})
			if err != nil {
				b.Fatal(err)
			}
			if _, files := c.Usage(); files != n {
				b.Fatalf("%d entries", files)
			}
			b.StopTimer()
			c.abandon()
			os.WriteFile(jp, killed, 0o644)
			b.StartTimer()
		}
	})
}

// BenchmarkGetBlobHit is the open path of a mounted file that is cached.
func BenchmarkGetBlobHit(b *testing.B) {
	c, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	k := BlobKey{Layout: "L", Path: "t/0.npy"}
	data := make([]byte, 1<<20)
	h, _, _ := c.GetBlob(context.Background(), k, int64(len(data)), writeFill(data), nil)
	h.Close()
	b.ReportAllocs()
	for b.Loop() {
		h, _, err := c.GetBlob(context.Background(), k, int64(len(data)), writeFill(data), nil)
		if err != nil {
			b.Fatal(err)
		}
		h.Close()
	}
}

// BenchmarkGetBlobFill is a miss: fill 1 MiB, hash, fsync, link.
func BenchmarkGetBlobFill(b *testing.B) {
	c, err := Open(Options{Dir: b.TempDir(), Size: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	data := make([]byte, 1<<20)
	fill := func(ctx context.Context, f Writer) error { _, err := f.Write(data); return err }
	b.SetBytes(int64(len(data)))
	i := 0
	for b.Loop() {
		i++
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: fmt.Sprintf("t/%d.npy", i)}, int64(len(data)), fill, nil)
		if err != nil {
			b.Fatal(err)
		}
		h.Close()
	}
}
