package miniotest

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/zarrfs/zarrfs/internal/testenv"
)

func TestStartUpload(t *testing.T) {
	s := Start(t)
	dir := t.TempDir()
	for name, body := range map[string]string{"zarr.json": "{}", "t/c/0/0": "chunk", "t/zarr.json": "[]"} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bucket := s.NewBucket(t)
	s.UploadDir(t, bucket, "store.zarr", dir)
	ctx := context.Background()
	var keys []string
	for obj := range s.Client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		keys = append(keys, obj.Key)
	}
	want := []string{"store.zarr/t/c/0/0", "store.zarr/t/zarr.json", "store.zarr/zarr.json"}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys %q, want %q", keys, want)
	}
	o, err := s.Client.GetObject(ctx, bucket, "store.zarr/t/c/0/0", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(o)
	if err != nil || string(b) != "chunk" {
		t.Fatalf("read back %q, %v", b, err)
	}
	if strings.Contains(s.Output(), s.SecretKey) {
		t.Fatal("Output() shows the secret key")
	}
}

// Without a binary the test is skipped (or failed under CI) with a reason.
func TestBinaryMissing(t *testing.T) {
	t.Setenv("ZARRFS_MINIO", filepath.Join(t.TempDir(), "no-minio"))
	_, err := Binary()
	if err == nil || !strings.Contains(err.Error(), "ZARRFS_MINIO") {
		t.Fatalf("Binary() err = %v", err)
	}
}

// Without a MinIO server the S3 tests skip, or fail under CI.
func TestStartWithoutServer(t *testing.T) {
	t.Setenv("ZARRFS_MINIO", filepath.Join(t.TempDir(), "no-minio"))
	for ci, want := range map[string]string{"": "skip: ", "true": "fail: "} {
		t.Setenv("CI", ci)
		if got := testenv.Outcome(func(t testing.TB) { Start(t) }); !strings.HasPrefix(got, want) || !strings.Contains(got, "no-minio") {
			t.Errorf("CI=%q: %s, want %s...", ci, got, want)
		}
	}
}
