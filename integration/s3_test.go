package integration

import (
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/integration/miniotest"
)

// s3Env points the daemon's credential chain at the MinIO server.
func s3Env(t *testing.T, srv *miniotest.Server) {
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_REGION", "us-east-1")
}

// The fixture stores uploaded to MinIO mount exactly like the local stores:
// every file matches the reference, also through a proxy that breaks a
// share of the requests; the secret never shows in the daemon's output, and
// chunks land in the cache's chunk tier.
func TestS3Mount(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	fx := fixturesDir(t)
	srv := miniotest.Start(t)
	bucket := srv.NewBucket(t)
	for _, store := range []string{"public_a.zarr", "public_b.zarr"} {
		srv.UploadDir(t, bucket, "era5/"+store, filepath.Join(fx, store))
	}
	s3Env(t, srv)

	t.Run("direct", func(t *testing.T) {
		for _, store := range []string{"public_a.zarr", "public_b.zarr"} {
			cacheDir := t.TempDir()
			d := mountAt(t, "s3://"+bucket+"/era5/"+store, t.TempDir(), cacheDir,
				"--s3-endpoint", srv.Endpoint, "--log-level", "debug")
			if r := runCheck(t, checkTensorstore, d.mnt, fx, store); r.Files == 0 {
				t.Fatal("checked no files")
			}
			if n := countFiles(filepath.Join(cacheDir, "chunks")); n == 0 {
				t.Error("no source chunk reached the cache's chunk tier")
			}
			d.stop(t)
			if out := d.line + d.stderr.String(); strings.Contains(out, srv.SecretKey) {
				t.Fatal("the secret key appears in the daemon's output")
			}
		}
	})

	t.Run("faults", func(t *testing.T) {
		p, err := faultproxy.New(srv.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		kinds := []faultproxy.Fault{
			{Kind: faultproxy.Status, Status: 503},
			{Kind: faultproxy.Status, Status: 500},
			{Kind: faultproxy.Reset, After: 7},
			{Kind: faultproxy.Truncate, After: 11},
			{Kind: faultproxy.Status, Status: 429, Code: "SlowDown"},
		}
		// Every third object GET fails, cycling through the kinds.
		p.SetRule(faultproxy.Every(3, faultproxy.ObjectGets, kinds...))
		d := mountAt(t, "s3://"+bucket+"/era5/public_a.zarr", t.TempDir(), t.TempDir(), "--s3-endpoint", p.URL)
		if r := runCheck(t, checkTensorstore, d.mnt, fx, "public_a.zarr"); r.Files == 0 {
			t.Fatal("checked no files")
		}
		if p.Faults() == 0 {
			t.Fatal("the proxy injected no fault")
		}
		t.Logf("%d faults injected over %d requests", p.Faults(), p.Requests())
	})

	t.Run("bad credentials", func(t *testing.T) {
		t.Setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-0123456789")
		out, err := exec.Command(zarrfsBin(t), "inspect", "s3://"+bucket+"/era5/public_a.zarr", "--s3-endpoint", srv.Endpoint).CombinedOutput()
		if err == nil {
			t.Fatalf("inspect with a wrong secret succeeded:\n%s", out)
		}
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
			t.Errorf("want exit 1 with one line, got %v:\n%s", err, out)
		}
		if strings.Contains(string(out), "not-the-secret") {
			t.Error("the secret appears in the error")
		}
	})

	t.Run("no credentials", func(t *testing.T) {
		t.Setenv("AWS_ACCESS_KEY_ID", "")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "")
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
		t.Setenv("HOME", t.TempDir())
		start := time.Now()
		out, err := exec.Command(zarrfsBin(t), "inspect", "s3://"+bucket+"/era5/public_a.zarr", "--s3-endpoint", srv.Endpoint).CombinedOutput()
		if err == nil {
			t.Fatalf("inspect without credentials succeeded (anonymous fallback?):\n%s", out)
		}
		t.Logf("refused in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	})
}

func countFiles(dir string) int {
	n := 0
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			n++
		}
		return nil
	})
	return n
}
