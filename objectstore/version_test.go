package objectstore_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/miniotest"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
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
		_, before, err := v.GetVersion(ctx, "t/c/0", nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		rewrite()
		b, after, err := v.GetVersion(ctx, "t/c/0", nil, 0)
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
		check(t, must(objectstore.WithRetry(s, objectstore.RetryOptions{})), func() {
			os.WriteFile(p, []byte("chunk B"), 0o644)
		})
	})
	// The same length, the modification time restored (cp -p, tar x,
	// rsync -t): the change time tells, as a stat does too.
	t.Run("posix mtime restored", func(t *testing.T) {
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
		check(t, s, func() {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte("chunk B"), 0)
			f.Close()
			os.Chtimes(p, mtime, mtime)
		})
		_, read, _ := s.GetVersion(ctx, "t/c/0", nil, 0)
		if stated, err := s.StatVersion(ctx, "t/c/0"); err != nil || stated != read {
			t.Errorf("stat says %q (%v), a read %q", stated, err, read)
		}
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
	br := must(objectstore.WithBreaker(s, objectstore.BreakerOptions{}))
	defer br.Close()
	for name, st := range map[string]objectstore.Store{
		"retry":         must(objectstore.WithRetry(s, objectstore.RetryOptions{})),
		"breaker":       br,
		"retry+breaker": must(objectstore.WithRetry(br, objectstore.RetryOptions{})),
	} {
		if _, ok := objectstore.AsVersioned(st); !ok {
			t.Errorf("%s: not versioned", name)
		}
		// A local store is asked version by version: listing it whole
		// would walk every directory.
		if _, ok := objectstore.AsVersionStater(st); !ok {
			t.Errorf("%s: cannot ask one version", name)
		}
		if tr := objectstore.TrustMetadata(st); isVersioned(tr) {
			t.Errorf("%s: TrustMetadata still tells versions", name)
		}
	}
}

func isVersioned(s objectstore.Store) bool {
	_, v := objectstore.AsVersioned(s)
	_, st := objectstore.AsVersionStater(s)
	return v || st
}

// A decorator asks one version only of a store that can (S3 lists), and
// keeps the listing page size of the store it wraps (GCS).
func TestDecoratorsStatVersions(t *testing.T) {
	s3, err := objectstore.OpenS3(context.Background(), "s3://b/x", objectstore.S3Options{Endpoint: "http://127.0.0.1:1", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := objectstore.AsVersionStater(must(objectstore.WithRetry(s3, objectstore.RetryOptions{}))); ok {
		t.Error("a retried S3 store claims to ask one version")
	}
	gcs, err := objectstore.OpenGCS(context.Background(), "gs://b/x", objectstore.GCSOptions{Endpoint: "http://127.0.0.1:1", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	defer gcs.Close()
	br := must(objectstore.WithBreaker(gcs, objectstore.BreakerOptions{}))
	defer br.Close()
	wrapped := must(objectstore.WithRetry(br, objectstore.RetryOptions{}))
	if _, ok := objectstore.AsVersionStater(wrapped); !ok {
		t.Error("a retried GCS store cannot ask one version")
	}
	if n := objectstore.ObjectsPerListing(wrapped); n != 1000 {
		t.Errorf("ObjectsPerListing through the decorators = %d, want 1000", n)
	}
	if n := objectstore.ObjectsPerListing(must(objectstore.WithRetry(s3, objectstore.RetryOptions{}))); n != 0 {
		t.Errorf("ObjectsPerListing of S3 = %d, want 0", n)
	}
	if isVersioned(objectstore.TrustMetadata(wrapped)) {
		t.Error("TrustMetadata over GCS still tells versions")
	}
}

// inspect's line on versions names what a store's versions are and what
// they cost, through the decorators.
func TestDescribeVersions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "zarr.json"), []byte("{}"), 0o644)
	px, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	s3, _ := objectstore.OpenS3(ctx, "s3://b/x", objectstore.S3Options{Endpoint: "http://127.0.0.1:1", Anonymous: true})
	gcs, _ := objectstore.OpenGCS(ctx, "gs://b/x", objectstore.GCSOptions{Endpoint: "http://127.0.0.1:1", Anonymous: true})
	defer gcs.Close()
	srv := webtest.Start(t, dir)
	web := openHTTP(t, srv.URL, objectstore.HTTPOptions{})
	wrap := func(s objectstore.Store) objectstore.Store {
		return must(objectstore.WithRetry(must(objectstore.WithBreaker(s, objectstore.BreakerOptions{})), objectstore.RetryOptions{}))
	}
	check := func(name string, s objectstore.Store, want ...string) {
		t.Helper()
		got := objectstore.DescribeVersions(s)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", name, got, w)
			}
		}
	}
	check("posix", px, "modification time", "stat")
	check("s3", wrap(s3), "ETag", "listing")
	check("gcs", wrap(gcs), "generation", "1000", "one metadata request", "--chunk-versions metadata")
	check("gcs trusted", objectstore.TrustMetadata(wrap(gcs)), "metadata", "not noticed")
	check("http before any read", wrap(web), "ETag or Last-Modified", "HEAD")
	web.Get(ctx, "zarr.json")
	check("http, file server", wrap(web), "Last-Modified", "second")
	srv.ETags.Store(true)
	web.Get(ctx, "zarr.json")
	check("http, both", wrap(web), "etag+last-modified")
}
