package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/storetest"
)

// writeTree writes files (keys with "/" separators) below dir.
func writeTree(t testing.TB, dir string, files map[string][]byte) {
	t.Helper()
	for k, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(k))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func newPosix(t *testing.T, files map[string][]byte) objectstore.Store {
	dir := t.TempDir()
	writeTree(t, dir, files)
	s, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPosixConformance(t *testing.T) {
	storetest.Run(t, newPosix)
}

func TestPosixThroughRetryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, files map[string][]byte) objectstore.Store {
		return must(objectstore.WithRetry(newPosix(t, files), objectstore.RetryOptions{}))
	})
}

// A symbolic link inside the store must not reach files outside it, neither
// as an object nor as a directory to list.
func TestPosixSymlinkEscapeRefused(t *testing.T) {
	outside := t.TempDir()
	secret := []byte("outside the store")
	writeTree(t, outside, map[string][]byte{"secret": secret})
	dir := t.TempDir()
	writeTree(t, dir, map[string][]byte{"zarr.json": []byte("{}"), "in/x": []byte("x")})
	for name, target := range map[string]string{
		"abs":    filepath.Join(outside, "secret"),
		"rel":    "../" + filepath.Base(outside) + "/secret",
		"dirabs": outside,
		"in/up":  "../../" + filepath.Base(outside),
	} {
		if err := os.Symlink(target, filepath.Join(dir, filepath.FromSlash(name))); err != nil {
			t.Fatal(err)
		}
	}
	// A link that stays inside is fine.
	if err := os.Symlink("in/x", filepath.Join(dir, "inside")); err != nil {
		t.Fatal(err)
	}
	s, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, k := range []string{"abs", "rel", "dirabs/secret", "in/up/secret"} {
		b, err := s.Get(ctx, k)
		if !errors.Is(err, objectstore.ErrOutsideStore) || objectstore.IsTransient(err) || objectstore.IsNotFound(err) {
			t.Errorf("Get(%q) = %q, %v through a link leaving the root, want a permanent ErrOutsideStore", k, b, err)
		}
		if b, err := s.GetRange(ctx, k, -1, 3); err == nil {
			t.Errorf("GetRange(%q) = %q through a link leaving the root, want an error", k, b)
		}
		if v, err := s.StatVersion(ctx, k); err == nil {
			t.Errorf("StatVersion(%q) = %q through a link leaving the root, want an error", k, v)
		}
	}
	if v, err := s.StatVersion(ctx, "inside"); err != nil || v == "" {
		t.Errorf("StatVersion(inside) = %q, %v; a link inside the store must work", v, err)
	}
	for _, k := range []string{"dirabs", "in/up"} {
		if names, err := s.List(ctx, k); err == nil {
			t.Errorf("List(%q) = %q through a link leaving the root, want an error", k, names)
		}
	}
	if b, err := s.Get(ctx, "inside"); err != nil || string(b) != "x" {
		t.Errorf("Get(inside) = %q, %v; a link inside the store must work", b, err)
	}
	// A linked directory is listed as one, wherever it points, so that
	// what lies below is left out with a reason rather than silently.
	if names, err := s.List(ctx, ""); err != nil || !slices.Contains(names, "dirabs/") {
		t.Errorf("List(root) = %q, %v; want dirabs/ listed", names, err)
	}

	// Following links reads through them; keys still cannot leave.
	f, err := objectstore.OpenPosixOptions(dir, objectstore.PosixOptions{FollowSymlinks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, k := range []string{"abs", "rel", "dirabs/secret", "in/up/secret"} {
		if b, err := f.Get(ctx, k); err != nil || !bytes.Equal(b, secret) {
			t.Errorf("following: Get(%q) = %q, %v", k, b, err)
		}
	}
	if names, err := f.List(ctx, "dirabs"); err != nil || !slices.Equal(names, []string{"secret"}) {
		t.Errorf("following: List(dirabs) = %q, %v", names, err)
	}
	if _, err := f.Get(ctx, "../"+filepath.Base(outside)+"/secret"); !errors.Is(err, objectstore.ErrInvalidKey) {
		t.Errorf("following: a key leaving the store: %v", err)
	}
}

func TestOpenPosixErrors(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	writeTree(t, filepath.Dir(f), map[string][]byte{"file": nil})
	for _, dir := range []string{filepath.Join(t.TempDir(), "missing"), f} {
		if _, err := objectstore.OpenPosix(dir); err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("OpenPosix(%q): err = %v, want an error naming the path", dir, err)
		}
	}
	s, err := objectstore.OpenPosix("file://" + filepath.Dir(f))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.HasPrefix(s.ID(), "file:///") {
		t.Errorf("ID = %q", s.ID())
	}
}

// A FIFO planted in a store is refused at once instead of blocking the
// reader forever.
func TestPosixRefusesFIFO(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "chunk"), 0o644); err != nil {
		t.Skip("mkfifo:", err)
	}
	p, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { _, err := p.Get(context.Background(), "chunk"); done <- err }()
	go func() { _, err := p.GetRange(context.Background(), "chunk", 0, 1); done <- err }()
	for range 2 {
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("got %v, want a not-a-regular-file error", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("reading a FIFO blocked")
		}
	}
}
