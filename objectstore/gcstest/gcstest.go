// Package gcstest runs a real Google Cloud Storage emulator for tests:
// fake-gcs-server (github.com/fsouza/fake-gcs-server) in the test's own
// process, in memory, serving its JSON and XML APIs on 127.0.0.1 on a free
// port, stopped when the test ends. It creates buckets, uploads fixture
// stores, and counts the requests it answers by kind, so tests can assert
// what a read cost.
//
// A Server is safe for concurrent use.
package gcstest

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

// Server is a running emulator.
type Server struct {
	// URL is "http://127.0.0.1:PORT": the endpoint to give zarrfs
	// (--gcs-endpoint), and the value of STORAGE_EMULATOR_HOST.
	URL string
	// Fake is the emulator, for fixtures that need more than Upload.
	Fake *fakestorage.Server

	ts      *httptest.Server
	counts  Counts
	mu      sync.Mutex
	buckets int
	hook    func(*http.Request)
}

// Counts are the requests answered, by kind.
type Counts struct {
	// Reads are object downloads (XML or JSON media).
	Reads atomic.Int64
	// Stats are object metadata requests.
	Stats atomic.Int64
	// Listings are object listing requests (one per page).
	Listings atomic.Int64
	// Other is everything else.
	Other atomic.Int64
	// Bytes are the response body bytes sent, of every kind.
	Bytes atomic.Int64
}

// countingWriter adds what a response writes to its body to n.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// Start starts an emulator in memory for the test and stops it in
// t.Cleanup.
func Start(t testing.TB) *Server { return StartIn(t, "") }

// StartIn starts an emulator that keeps its objects in files below dir
// ("": in memory). The memory backend finds an object by scanning all of
// them; the file backend finds it by path, which is what a bucket of
// hundreds of thousands of objects needs.
func StartIn(t testing.TB, dir string) *Server {
	t.Helper()
	// No listener of its own: the handler is served below, behind the
	// request counter. PublicHost without a port matches 127.0.0.1 on any
	// port, so that XML reads through a proxy on loopback resolve too.
	fake, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		NoListener:  true,
		Scheme:      "http",
		PublicHost:  "127.0.0.1",
		StorageRoot: dir,
	})
	if err != nil {
		t.Fatalf("fake-gcs-server: %v", err)
	}
	s := &Server{Fake: fake}
	h := fake.HTTPHandler()
	s.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.count(r)
		s.mu.Lock()
		hook := s.hook
		s.mu.Unlock()
		if hook != nil {
			hook(r)
		}
		h.ServeHTTP(countingWriter{w, &s.counts.Bytes}, r)
	}))
	s.URL = s.ts.URL
	t.Cleanup(func() {
		s.ts.Close()
		fake.Stop()
	})
	return s
}

// OnRequest calls f (nil: nothing) with every request before it is served.
func (s *Server) OnRequest(f func(*http.Request)) {
	s.mu.Lock()
	s.hook = f
	s.mu.Unlock()
}

func (s *Server) count(r *http.Request) {
	p := r.URL.EscapedPath()
	switch {
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		s.counts.Other.Add(1)
	case strings.HasPrefix(p, "/download/") || r.URL.Query().Get("alt") == "media":
		s.counts.Reads.Add(1)
	case strings.HasPrefix(p, "/storage/v1/b/") && (strings.HasSuffix(p, "/o") || strings.HasSuffix(p, "/o/")):
		s.counts.Listings.Add(1)
	case strings.HasPrefix(p, "/storage/v1/b/") && strings.Contains(p, "/o/"):
		s.counts.Stats.Add(1)
	case strings.HasPrefix(p, "/storage/") || strings.HasPrefix(p, "/_internal/"):
		s.counts.Other.Add(1)
	case strings.Count(strings.Trim(p, "/"), "/") >= 1:
		s.counts.Reads.Add(1) // XML API: /bucket/object
	default:
		s.counts.Listings.Add(1) // XML API: /bucket?prefix=
	}
}

// Counts returns the request counters.
func (s *Server) Counts() *Counts { return &s.counts }

// NewBucket creates an empty bucket with a name unique to the server.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	s.mu.Lock()
	s.buckets++
	name := "zarrfs-test-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-", " ", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + "-" + strconv.Itoa(s.buckets)
	s.mu.Unlock()
	s.Fake.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: name})
	return name
}

// Put stores one object (a new generation when it exists).
func (s *Server) Put(bucket, name string, data []byte) {
	s.Fake.CreateObject(fakestorage.Object{
		ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: name},
		Content:     data,
	})
}

// UploadFiles stores files (key to content) below prefix.
func (s *Server) UploadFiles(t testing.TB, bucket, prefix string, files map[string][]byte) {
	t.Helper()
	for k, b := range files {
		s.Put(bucket, join(prefix, k), b)
	}
}

// UploadDir stores every regular file below dir, below prefix, as a tool
// such as gsutil rsync would.
func (s *Server) UploadDir(t testing.TB, bucket, prefix, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
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
		s.Put(bucket, join(prefix, filepath.ToSlash(rel)), b)
		return nil
	})
	if err != nil {
		t.Fatalf("uploading %s: %v", dir, err)
	}
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return strings.TrimSuffix(prefix, "/") + "/" + k
}
