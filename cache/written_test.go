package cache

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A blob written in place (root ignores the read-only mode: a write
// through a direct mode link) is never served: an open whose file's size
// or modification time is not the one recorded fills it again, whether
// the same size was written or not, and an open Handle reports the write.
func TestWrittenBlobFilledAgain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(p string, size int) error
	}{
		{"same size", func(p string, size int) error {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("broken"), 100)
			return err
		}},
		{"truncated", func(p string, _ int) error { return os.WriteFile(p, []byte("x\n"), 0o600) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustOpen(t, Options{Dir: t.TempDir()})
			defer c.Close()
			const path = "t/05.npy"
			data := content(path, sizeOf(path))
			k := BlobKey{Layout: "L", Path: path, Identity: "v1"}
			fills := 0
			fill := func(ctx context.Context, f Writer) error { fills++; return writeFill(data)(ctx, f) }
			h, _, err := c.GetBlob(context.Background(), k, int64(len(data)), fill, nil)
			if err != nil {
				t.Fatal(err)
			}
			if h.Changed() {
				t.Error("a blob just filled reports a write")
			}
			h2, _, err := c.GetBlob(context.Background(), k, int64(len(data)), fill, nil)
			if err != nil || fills != 1 {
				t.Fatalf("second open: %v, %d fills; want a hit", err, fills)
			}
			h2.Close()
			// The write lands in a later tick of the filesystem's clock
			// than the fill (timestamps are coarser than a nanosecond).
			time.Sleep(20 * time.Millisecond)
			p := c.BlobPath(k)
			if err := os.Chmod(p, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := tc.write(p, len(data)); err != nil {
				t.Fatal(err)
			}
			if !h.Changed() {
				t.Error("a Handle on a blob written in place does not report it")
			}
			h.Close()
			if c.HasBlob(k) {
				t.Error("HasBlob holds a blob written in place")
			}
			h, _, err = c.GetBlob(context.Background(), k, int64(len(data)), fill, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			if got := readAll(t, h); fills != 2 || !bytes.Equal(got, data) {
				t.Errorf("after a write in place: %d fills, bytes equal %v; want 2 fills and the blob's bytes", fills, bytes.Equal(got, data))
			}
			if b, _ := os.ReadFile(filepath.Clean(p)); !bytes.Equal(b, data) {
				t.Errorf("the file at %s is not the blob filled again", p)
			}
		})
	}
}
