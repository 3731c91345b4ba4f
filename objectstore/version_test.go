package objectstore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/miniotest"
	"github.com/zarrfs/zarrfs/objectstore"
)

// An object rewritten in place with bytes of the same length gets a new
// version, in a read and in a listing alike.
func TestVersionChangesOnRewrite(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, s objectstore.Store, rewrite func()) {
		v, ok := objectstore.AsVersioned(s)
		if !ok {
			t.Fatal("not versioned")
		}
		_, before, err := v.GetVersion(ctx, "t/c/0", nil)
		if err != nil {
			t.Fatal(err)
		}
		rewrite()
		b, after, err := v.GetVersion(ctx, "t/c/0", nil)
		if err != nil || string(b) != "chunk B" {
			t.Fatalf("read after rewrite: %q %v", b, err)
		}
		listed := ""
		v.ListVersions(ctx, "t", func(k, ver string) {
			if k == "t/c/0" {
				listed = ver
			}
		})
		if after == before || listed != after {
			t.Errorf("versions: before %q, after %q, listed %q", before, after, listed)
		}
	}
	t.Run("posix", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, "t", "c", "0")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("chunk A"), 0o644)
		mtime := time.Now().Add(-time.Hour)
		os.Chtimes(p, mtime, mtime)
		s, err := objectstore.OpenPosix(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		check(t, objectstore.WithRetry(s, objectstore.RetryOptions{}), func() {
			os.WriteFile(p, []byte("chunk B"), 0o644)
		})
	})
	t.Run("s3", func(t *testing.T) {
		srv := miniotest.Start(t)
		bucket := srv.NewBucket(t)
		srv.UploadFiles(t, bucket, "", map[string][]byte{"t/c/0": []byte("chunk A")})
		s := openS3(t, srv.Endpoint, bucket, "", objectstore.S3Options{Credentials: staticCreds(srv)})
		check(t, s, func() { srv.UploadFiles(t, bucket, "", map[string][]byte{"t/c/0": []byte("chunk B")}) })
	})
}

// The decorators a source is wrapped in keep telling versions: a store
// that loses them would make every cached blob unverifiable.
func TestDecoratorsKeepVersions(t *testing.T) {
	s, err := objectstore.OpenPosix(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	br := objectstore.WithBreaker(s, objectstore.BreakerOptions{})
	defer br.Close()
	for name, st := range map[string]objectstore.Store{
		"retry":         objectstore.WithRetry(s, objectstore.RetryOptions{}),
		"breaker":       br,
		"retry+breaker": objectstore.WithRetry(br, objectstore.RetryOptions{}),
	} {
		if _, ok := objectstore.AsVersioned(st); !ok {
			t.Errorf("%s: not versioned", name)
		}
	}
}
