// Package miniotest runs a real MinIO server for tests: on 127.0.0.1, on a
// free port, over a temporary data directory, with random root credentials,
// stopped when the test ends. It creates buckets and uploads fixture stores
// with minio-go.
//
// The server binary comes from $ZARRFS_MINIO, else bin/minio at the module
// root (`make minio` builds it), else minio on $PATH. When it is absent,
// Start skips the test, or fails it when $CI is set: CI must build it.
//
// A Server is safe for concurrent use by the subtests of the test that
// started it.
package miniotest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/internal/testenv"
)

// Server is a running MinIO.
type Server struct {
	// Endpoint is "http://127.0.0.1:PORT".
	Endpoint string
	// Host is "127.0.0.1:PORT".
	Host string
	// AccessKey and SecretKey are the root credentials, random per server.
	AccessKey, SecretKey string
	// Client is a root minio-go client for setting up fixtures.
	Client *minio.Client

	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{}
}

// Binary returns the path of the MinIO server binary, or an error saying
// where it looked and how to build it.
func Binary() (string, error) {
	if p := os.Getenv("ZARRFS_MINIO"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("ZARRFS_MINIO=%s: %w", p, err)
		}
		return p, nil
	}
	var tried []string
	if root, err := moduleRoot(); err == nil {
		p := filepath.Join(root, "bin", "minio")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		tried = append(tried, p)
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p, nil
	}
	tried = append(tried, "$PATH")
	return "", fmt.Errorf("minio server binary not found (looked at $ZARRFS_MINIO, %s); build it with `make minio`", strings.Join(tried, ", "))
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Start starts a server for the test and stops it in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		testenv.Missing(t, "no MinIO server (make minio builds it): %v", err)
	}
	var lastErr error
	// The free port is found by binding and releasing it; another process
	// may take it in between, so try a few times.
	for range 3 {
		s, err := start(t, bin)
		if err == nil {
			return s
		}
		lastErr = err
	}
	t.Fatalf("starting minio: %v", lastErr)
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start(t testing.TB, bin string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cport, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{
		Host:      fmt.Sprintf("127.0.0.1:%d", port),
		AccessKey: "zarrfs" + randomHex(6),
		SecretKey: randomHex(20),
		out:       &syncbuf.Buffer{},
		done:      make(chan struct{}),
	}
	s.Endpoint = "http://" + s.Host
	dir := t.TempDir()
	s.cmd = exec.Command(bin, "server", "--quiet", "--address", s.Host,
		"--console-address", fmt.Sprintf("127.0.0.1:%d", cport), filepath.Join(dir, "data"))
	s.cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+s.AccessKey,
		"MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"MINIO_CI_CD=on",
		"HOME="+dir,
	)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.cmd.Wait(); close(s.done) }()

	if err := s.waitReady(30 * time.Second); err != nil {
		s.stop()
		return nil, fmt.Errorf("%w; server output:\n%s", err, s.Output())
	}
	t.Cleanup(s.stop)
	s.Client, err = minio.New(s.Host, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, "")})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("minio exited: %v", s.cmd.ProcessState)
		default:
		}
		resp, err := c.Get(s.Endpoint + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("minio not ready after %v", timeout)
}

func (s *Server) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.Thaw()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// Freeze stops the server process (SIGSTOP): it keeps its port, and the
// kernel still accepts connections, but nothing answers (a hung endpoint).
// It returns once every thread of the server has stopped.
func (s *Server) Freeze() error {
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	task := fmt.Sprintf("/proc/%d/task", s.cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		ents, err := os.ReadDir(task)
		if err != nil {
			return err
		}
		stopped := 0
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(task, e.Name(), "stat"))
			// The state follows the command name in parentheses.
			if i := strings.LastIndexByte(string(b), ')'); err == nil && i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
				stopped++
			}
		}
		if stopped == len(ents) {
			return nil
		}
	}
	return fmt.Errorf("minio not stopped 5s after SIGSTOP")
}

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() error { return s.cmd.Process.Signal(syscall.SIGCONT) }

// Output returns what the server printed so far, with the secret key
// replaced, for failure messages.
func (s *Server) Output() string {
	return strings.ReplaceAll(s.out.String(), s.SecretKey, "<secret>")
}

// MakeBucket creates a bucket.
func (s *Server) MakeBucket(t testing.TB, name string) {
	t.Helper()
	if err := s.Client.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket %s: %v", name, err)
	}
}

// NewBucket creates a bucket with a fresh random name and returns it.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	name := "b" + randomHex(8)
	s.MakeBucket(t, name)
	return name
}

// UploadFiles uploads files (keys with "/" separators) below prefix
// ("" or "dir/sub") in bucket, in parallel.
func (s *Server) UploadFiles(t testing.TB, bucket, prefix string, files map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		sem      = make(chan struct{}, 16)
	)
	for k, b := range files {
		key := k
		if prefix != "" {
			key = strings.Trim(prefix, "/") + "/" + k
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := s.Client.PutObject(ctx, bucket, key, bytes.NewReader(b), int64(len(b)),
				minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true})
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("put %s/%s: %w", bucket, key, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
}

// UploadDir uploads the regular files of the local directory tree dir below
// prefix in bucket (a fixture store on disk becomes the same store in S3).
func (s *Server) UploadDir(t testing.TB, bucket, prefix, dir string) {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.UploadFiles(t, bucket, prefix, files)
}

// SetPublicRead lets anonymous clients get and list the objects of bucket.
func (s *Server) SetPublicRead(t testing.TB, bucket string) {
	t.Helper()
	policy := fmt.Sprintf(`{"Version":"2012-10-17","Statement":[
{"Effect":"Allow","Principal":{"AWS":["*"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::%[1]s/*"]},
{"Effect":"Allow","Principal":{"AWS":["*"]},"Action":["s3:ListBucket","s3:GetBucketLocation"],"Resource":["arn:aws:s3:::%[1]s"]}]}`, bucket)
	if err := s.Client.SetBucketPolicy(context.Background(), bucket, policy); err != nil {
		t.Fatalf("set policy on %s: %v", bucket, err)
	}
}
