package cache

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// content is the deterministic body of a test blob or chunk, so any copy
// can be checked without remembering what was written.
func content(key string, size int) []byte {
	h := fnv.New64a()
	io.WriteString(h, key)
	r := rand.New(rand.NewPCG(h.Sum64(), uint64(size)))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// sizeOf gives every test key a size of its own between 1 and 12 KiB.
func sizeOf(key string) int {
	h := fnv.New32a()
	io.WriteString(h, key)
	return 1024 + int(h.Sum32()%(11*1024))
}

// writeFill returns a fill that writes data in small pieces, so a kill can
// land in the middle of it.
func writeFill(data []byte) func(context.Context, Writer) error {
	return func(ctx context.Context, f Writer) error {
		for off := 0; off < len(data); off += 1000 {
			end := min(off+1000, len(data))
			if _, err := f.Write(data[off:end]); err != nil {
				return err
			}
		}
		return nil
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func mustOpen(t testing.TB, opts Options) *Cache {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	c, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// readAll reads a handle's blob through its descriptor from offset 0.
func readAll(t testing.TB, h *Handle) []byte {
	t.Helper()
	b := make([]byte, h.Size())
	if _, err := h.File().ReadAt(b, 0); err != nil && err != io.EOF {
		t.Fatalf("read %s: %v", h.Path(), err)
	}
	return b
}

// getBlob fills or opens key in layout "L", checks its contents and closes it.
func getBlob(t testing.TB, c *Cache, path string) {
	t.Helper()
	k := BlobKey{Layout: "L", Path: path}
	data := content(path, sizeOf(path))
	h, _, err := c.GetBlob(context.Background(), k, int64(len(data)), writeFill(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got := readAll(t, h); !bytes.Equal(got, data) {
		t.Fatalf("blob %s: wrong contents", path)
	}
}

// diskUsage sums the sizes of regular files under the data directories,
// temp files included: what the budget is about. A file counts once even
// while it has two names (the moment between link and temp removal).
func diskUsage(t testing.TB, dir string) (bytes int64, files int) {
	t.Helper()
	seen := map[uint64]bool{}
	for _, d := range []string{tmpDir, blobsDir, chunksDir} {
		filepath.WalkDir(filepath.Join(dir, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() || strings.HasSuffix(p, ".lock") {
				return nil
			}
			if fi, err := e.Info(); err == nil {
				ino := fi.Sys().(*syscall.Stat_t).Ino
				if seen[ino] {
					return nil
				}
				seen[ino] = true
				if d != tmpDir {
					files++
				}
				bytes += fi.Size()
			}
			return nil
		})
	}
	return bytes, files
}

// tempFiles lists the files under Dir/tmp other than instance lock files.
func tempFiles(t testing.TB, dir string) []string {
	var out []string
	filepath.WalkDir(filepath.Join(dir, tmpDir), func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() && !strings.HasSuffix(p, ".lock") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func key(i int) string { return fmt.Sprintf("t/%04d.npy", i) }

type slogLogger = slog.Logger

// newTeeLogger logs to the test log and into sb, for tests that check what
// recovery reported.
func newTeeLogger(t testing.TB, sb *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, &lockedBuilder{sb: sb}), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type lockedBuilder struct {
	mu sync.Mutex
	sb *strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sb.Write(p)
}
