package objectstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/zarrfs/zarrfs/integration/miniotest"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/storetest"
)

// ParseS3URL and ParseGSURL (one parser, parseBucketURL) split a bucket
// URL and refuse what a store URL must not hold, never repeating a secret.
func TestParseBucketURLs(t *testing.T) {
	tests := []struct {
		parse          func(string) (string, string, error)
		in             string
		bucket, prefix string
		wantErr        string
	}{
		{objectstore.ParseS3URL, "s3://b/era5.zarr", "b", "era5.zarr", ""},
		{objectstore.ParseS3URL, "s3://b/a/b.zarr/", "b", "a/b.zarr", ""},
		{objectstore.ParseS3URL, "s3://b", "b", "", ""},
		{objectstore.ParseS3URL, "s3://b/", "b", "", ""},
		{objectstore.ParseS3URL, "s3://", "", "", "no bucket"},
		{objectstore.ParseS3URL, "http://b/x", "", "", "not an s3"},
		{objectstore.ParseS3URL, "s3://b/../x", "", "", "bad prefix"},
		{objectstore.ParseS3URL, "s3://AKIAKEY:hunter2secret@b/x", "", "", "must not hold credentials"},
		{objectstore.ParseS3URL, "s3://b/x?versionId=1", "", "", "not supported"},
		{objectstore.ParseGSURL, "gs://gcp-public-data-arco-era5/ar/full_37-1h-0p25deg-chunk-1.zarr-v3", "gcp-public-data-arco-era5", "ar/full_37-1h-0p25deg-chunk-1.zarr-v3", ""},
		{objectstore.ParseGSURL, "gs://b/a/b.zarr/", "b", "a/b.zarr", ""},
		{objectstore.ParseGSURL, "gs://b", "b", "", ""},
		{objectstore.ParseGSURL, "gs://", "", "", "no bucket"},
		{objectstore.ParseGSURL, "s3://b/x", "", "", "not a gs"},
		{objectstore.ParseGSURL, "gs://b/../x", "", "", "bad prefix"},
		{objectstore.ParseGSURL, "gs://user:hunter2secret@b/x", "", "", "must not hold credentials"},
		{objectstore.ParseGSURL, "gs://b/x?generation=1", "", "", "not supported"},
	}
	for _, tc := range tests {
		b, p, err := tc.parse(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parse(%q) = %q, %q, %v; want error %q", tc.in, b, p, err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2secret") {
				t.Errorf("parse(%q) error repeats the secret: %v", tc.in, err)
			}
			continue
		}
		if err != nil || b != tc.bucket || p != tc.prefix {
			t.Errorf("parse(%q) = %q, %q, %v; want %q, %q", tc.in, b, p, err, tc.bucket, tc.prefix)
		}
	}
}

func TestOpenS3Options(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		endpoint string
		ok       bool
	}{
		{"", true},
		{"http://127.0.0.1:9000", true},
		{"https://s3.example.com", true},
		{"minio.local:9000", true},
		{"ftp://x", false},
		{"http://host:9000/path", false},
		{"http://user:pw@host:9000", false},
	}
	for _, tc := range tests {
		s, err := objectstore.OpenS3(ctx, "s3://bucket/pre/fix", objectstore.S3Options{Endpoint: tc.endpoint, Anonymous: true})
		if (err == nil) != tc.ok {
			t.Errorf("endpoint %q: err = %v, want ok=%v", tc.endpoint, err, tc.ok)
		}
		if err != nil && strings.Contains(err.Error(), "pw@") {
			t.Errorf("endpoint error repeats credentials: %v", err)
		}
		if err == nil && s.ID() != "s3://bucket/pre/fix" {
			t.Errorf("ID = %q", s.ID())
		}
	}
}

// clearAWSEnv leaves the default chain with nothing to find, and keeps it
// away from the instance metadata service (not reachable from tests).
func clearAWSEnv(t *testing.T) {
	home := t.TempDir()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY",
		"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
		"AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", home)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(home, "no-such-credentials"))
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(home, "no-such-config"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// With no credential anywhere OpenS3 fails; it never falls back to
// anonymous access on its own.
func TestOpenS3NoCredentials(t *testing.T) {
	clearAWSEnv(t)
	ctx := context.Background()
	_, err := objectstore.OpenS3(ctx, "s3://bucket/x", objectstore.S3Options{Endpoint: "http://127.0.0.1:1"})
	if !errors.Is(err, objectstore.ErrNoCredentials) {
		t.Fatalf("err = %v, want ErrNoCredentials", err)
	}
	// Half a key is no key.
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAONLYHALF")
	if _, err := objectstore.OpenS3(ctx, "s3://bucket/x", objectstore.S3Options{Endpoint: "http://127.0.0.1:1"}); !errors.Is(err, objectstore.ErrNoCredentials) {
		t.Fatalf("access key without secret: err = %v, want ErrNoCredentials", err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	// A named profile that does not exist is an error, not a reason to go on.
	file := filepath.Join(t.TempDir(), "credentials")
	os.WriteFile(file, []byte("[other]\naws_access_key_id = AKIAOTHER\naws_secret_access_key = othersecretvalue\n"), 0o600)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
	t.Setenv("AWS_PROFILE", "missing")
	_, err = objectstore.OpenS3(ctx, "s3://bucket/x", objectstore.S3Options{Endpoint: "http://127.0.0.1:1"})
	if !errors.Is(err, objectstore.ErrNoCredentials) || !strings.Contains(err.Error(), `"missing"`) {
		t.Fatalf("missing profile: err = %v, want ErrNoCredentials naming the profile", err)
	}
	if strings.Contains(err.Error(), "othersecretvalue") {
		t.Fatalf("error leaks a secret: %v", err)
	}
	// Anonymous access must be asked for.
	if _, err := objectstore.OpenS3(ctx, "s3://bucket/x", objectstore.S3Options{Endpoint: "http://127.0.0.1:1", Anonymous: true}); err != nil {
		t.Fatalf("anonymous: %v", err)
	}
}

func staticCreds(s *miniotest.Server) *credentials.Credentials {
	return credentials.NewStaticV4(s.AccessKey, s.SecretKey, "")
}

func openS3(t testing.TB, endpoint, bucket, prefix string, opts objectstore.S3Options) *objectstore.S3 {
	t.Helper()
	opts.Endpoint = endpoint
	u := "s3://" + bucket
	if prefix != "" {
		u += "/" + prefix
	}
	s, err := objectstore.OpenS3(context.Background(), u, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestS3Conformance(t *testing.T) {
	srv := miniotest.Start(t)
	for _, prefix := range []string{"", "stores/era5.zarr"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, files map[string][]byte) objectstore.Store {
				bucket := srv.NewBucket(t)
				srv.UploadFiles(t, bucket, prefix, files)
				// A neighbour sharing the prefix's name must not show through.
				if prefix != "" {
					srv.UploadFiles(t, bucket, "", map[string][]byte{prefix + ".bak/zarr.json": []byte("{}"), prefix + "x": []byte("{}")})
				}
				s := openS3(t, srv.Endpoint, bucket, prefix, objectstore.S3Options{Credentials: staticCreds(srv), MaxInFlight: 8})
				t.Cleanup(func() { s.Close() })
				return s
			})
		})
	}
	t.Run("retry", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, files map[string][]byte) objectstore.Store {
			bucket := srv.NewBucket(t)
			srv.UploadFiles(t, bucket, "s", files)
			return must(objectstore.WithRetry(openS3(t, srv.Endpoint, bucket, "s", objectstore.S3Options{Credentials: staticCreds(srv)}), objectstore.RetryOptions{}))
		})
	})
}

// The same fixture read from a directory and from MinIO gives the same
// bytes and listings (UploadDir turns a local store into an S3 one).
func TestS3MatchesPosix(t *testing.T) {
	srv := miniotest.Start(t)
	dir := t.TempDir()
	files := storetest.Files()
	writeTree(t, dir, files)
	bucket := srv.NewBucket(t)
	srv.UploadDir(t, bucket, "x.zarr", dir)
	s3 := openS3(t, srv.Endpoint, bucket, "x.zarr", objectstore.S3Options{Credentials: staticCreds(srv)})
	px, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	ctx := context.Background()
	for _, p := range []string{"", "a", "a/c", "a/c/0", "b/deep"} {
		a, err1 := s3.List(ctx, p)
		b, err2 := px.List(ctx, p)
		if err1 != nil || err2 != nil || fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("List(%q): s3 %q %v, posix %q %v", p, a, err1, b, err2)
		}
	}
	for k := range files {
		a, err1 := s3.Get(ctx, k)
		b, err2 := px.Get(ctx, k)
		if err1 != nil || err2 != nil || string(a) != string(b) {
			t.Errorf("Get(%q): s3 %d bytes %v, posix %d bytes %v", k, len(a), err1, len(b), err2)
		}
	}
}

func TestS3Credentials(t *testing.T) {
	srv := miniotest.Start(t)
	bucket := srv.NewBucket(t)
	srv.UploadFiles(t, bucket, "z", map[string][]byte{"zarr.json": []byte(`{"zarr_format":3}`)})
	ctx := context.Background()
	read := func(t *testing.T, opts objectstore.S3Options) error {
		t.Helper()
		opts.Endpoint = srv.Endpoint
		s, err := objectstore.OpenS3(ctx, "s3://"+bucket+"/z", opts)
		if err != nil {
			return err
		}
		b, err := s.Get(ctx, "zarr.json")
		if err == nil && string(b) != `{"zarr_format":3}` {
			t.Fatalf("read %q", b)
		}
		return err
	}

	t.Run("environment", func(t *testing.T) {
		clearAWSEnv(t)
		t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
		t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
		if err := read(t, objectstore.S3Options{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("profile", func(t *testing.T) {
		clearAWSEnv(t)
		file := filepath.Join(t.TempDir(), "credentials")
		ini := fmt.Sprintf("[default]\naws_access_key_id = wrong\naws_secret_access_key = wrongwrong\n\n[zarr]\naws_access_key_id = %s\naws_secret_access_key = %s\n", srv.AccessKey, srv.SecretKey)
		if err := os.WriteFile(file, []byte(ini), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
		t.Setenv("AWS_PROFILE", "zarr")
		if err := read(t, objectstore.S3Options{}); err != nil {
			t.Fatal(err)
		}
		t.Setenv("AWS_PROFILE", "") // default profile: a key the server rejects
		if err := read(t, objectstore.S3Options{}); !objectstore.IsPermission(err) {
			t.Fatalf("default profile with a wrong key: err = %v, want a permission error", err)
		}
	})
	t.Run("container role", func(t *testing.T) {
		clearAWSEnv(t)
		// The role endpoint of a container (ECS task role); on loopback,
		// as minio-go requires for plain http.
		role := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(map[string]any{
				"AccessKeyId": srv.AccessKey, "SecretAccessKey": srv.SecretKey,
				"Expiration": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
			})
		}))
		defer role.Close()
		t.Setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", role.URL+"/creds")
		if err := read(t, objectstore.S3Options{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("rejected key", func(t *testing.T) {
		for _, c := range []*credentials.Credentials{
			credentials.NewStaticV4(srv.AccessKey, "not-the-secret-key", ""),
			credentials.NewStaticV4("nosuchuser", srv.SecretKey, ""),
		} {
			err := read(t, objectstore.S3Options{Credentials: c})
			if !objectstore.IsPermission(err) || objectstore.IsNotFound(err) || objectstore.IsTransient(err) {
				t.Fatalf("err = %v, want a permission error only", err)
			}
			if strings.Contains(err.Error(), srv.SecretKey) || strings.Contains(err.Error(), "not-the-secret-key") {
				t.Fatalf("error leaks a secret: %v", err)
			}
		}
	})
	t.Run("anonymous on a private bucket", func(t *testing.T) {
		if err := read(t, objectstore.S3Options{Anonymous: true}); !objectstore.IsPermission(err) {
			t.Fatalf("err = %v, want a permission error", err)
		}
	})
	t.Run("anonymous on a public bucket", func(t *testing.T) {
		pub := srv.NewBucket(t)
		srv.UploadFiles(t, pub, "z", map[string][]byte{"zarr.json": []byte(`{"zarr_format":3}`)})
		srv.SetPublicRead(t, pub)
		s, err := objectstore.OpenS3(ctx, "s3://"+pub+"/z", objectstore.S3Options{Endpoint: srv.Endpoint, Anonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		if b, err := s.Get(ctx, "zarr.json"); err != nil || string(b) != `{"zarr_format":3}` {
			t.Fatalf("Get = %q, %v", b, err)
		}
		if names, err := s.List(ctx, ""); err != nil || fmt.Sprint(names) != "[zarr.json]" {
			t.Fatalf("List = %q, %v", names, err)
		}
	})
	t.Run("missing bucket", func(t *testing.T) {
		s := openS3(t, srv.Endpoint, "no-such-bucket", "z", objectstore.S3Options{Credentials: staticCreds(srv)})
		_, err := s.Get(ctx, "zarr.json")
		if err == nil || objectstore.IsNotFound(err) || objectstore.IsTransient(err) {
			t.Fatalf("err = %v: a missing bucket must not read as a missing chunk", err)
		}
	})
}
