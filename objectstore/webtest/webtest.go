// Package webtest serves a directory over HTTP for tests, with Go's own
// file server (net/http.FileServer: HEAD, Range and suffix ranges,
// Last-Modified), on 127.0.0.1 on a free port, stopped when the test ends.
// Switches make it behave as other servers do: strong ETags (as nginx
// sends them), a bearer token required, Range ignored (200 with the whole
// object), ranged bodies cut short. It counts the requests it answers.
//
// A Server is safe for concurrent use; its switches may change while it
// serves.
package webtest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// Server is a running file server.
type Server struct {
	// URL is "http://127.0.0.1:PORT".
	URL string
	// Dir is the directory served.
	Dir string

	// ETags adds a strong ETag of each file's size and modification time.
	ETags atomic.Bool
	// IgnoreRange answers ranged requests with 200 and the whole object.
	IgnoreRange atomic.Bool
	// ShortRanges answers ranged requests with a Content-Length and
	// Content-Range that are right, and half the bytes.
	ShortRanges atomic.Bool
	// NoHead answers HEAD with 405 Method Not Allowed.
	NoHead atomic.Bool

	token    atomic.Value // string; "" means none required
	requests atomic.Int64
	heads    atomic.Int64
	ranged   atomic.Int64
	auth     atomic.Value // the last Authorization header seen
}

// Start serves dir for the test.
func Start(t testing.TB, dir string) *Server {
	t.Helper()
	s := &Server{Dir: dir}
	s.token.Store("")
	s.auth.Store("")
	fs := http.FileServer(http.Dir(dir))
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		s.auth.Store(r.Header.Get("Authorization"))
		if r.Method == http.MethodHead {
			s.heads.Add(1)
			if s.NoHead.Load() {
				http.Error(w, "no HEAD here", http.StatusMethodNotAllowed)
				return
			}
		}
		if r.Header.Get("Range") != "" {
			s.ranged.Add(1)
		}
		if tok := s.token.Load().(string); tok != "" && r.Header.Get("Authorization") != "Bearer "+tok {
			http.Error(w, "token required", http.StatusUnauthorized)
			return
		}
		if s.ETags.Load() {
			if fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(path.Clean("/"+r.URL.Path)))); err == nil && fi.Mode().IsRegular() {
				w.Header().Set("ETag", fmt.Sprintf(`"%x-%x"`, fi.ModTime().UnixNano(), fi.Size()))
			}
		}
		if s.IgnoreRange.Load() {
			r.Header.Del("Range")
		}
		if s.ShortRanges.Load() && r.Header.Get("Range") != "" {
			w = &halfWriter{ResponseWriter: w}
		}
		fs.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	s.URL = ts.URL
	return s
}

// RequireToken makes every request without "Authorization: Bearer tok"
// fail with 401 ("" requires none).
func (s *Server) RequireToken(tok string) { s.token.Store(tok) }

// Requests, Heads and Ranged count the requests answered: all of them,
// the HEAD requests, and those with a Range header.
func (s *Server) Requests() int64 { return s.requests.Load() }
func (s *Server) Heads() int64    { return s.heads.Load() }
func (s *Server) Ranged() int64   { return s.ranged.Load() }

// LastAuthorization is the Authorization header of the last request.
func (s *Server) LastAuthorization() string { return s.auth.Load().(string) }

// halfWriter lets a partial response announce its full length and send
// half of it.
type halfWriter struct {
	http.ResponseWriter
	left int64
	set  bool
}

func (h *halfWriter) WriteHeader(code int) {
	if code == http.StatusPartialContent {
		n, _ := strconv.ParseInt(h.Header().Get("Content-Length"), 10, 64)
		h.left, h.set = n/2, true
	}
	h.ResponseWriter.WriteHeader(code)
	if f, ok := h.ResponseWriter.(http.Flusher); ok {
		f.Flush() // the headers go out whole; only the body is cut
	}
}

func (h *halfWriter) Write(b []byte) (int, error) {
	if !h.set {
		return h.ResponseWriter.Write(b)
	}
	n := int64(len(b))
	if n > h.left {
		b = b[:h.left]
	}
	h.left -= int64(len(b))
	if _, err := h.ResponseWriter.Write(b); err != nil {
		return 0, err
	}
	if len(b) < int(n) {
		// The body ends here: the client sees fewer bytes than announced.
		panic(http.ErrAbortHandler)
	}
	return int(n), nil
}

// WriteFiles writes files (key to content) below dir.
func WriteFiles(t testing.TB, dir string, files map[string][]byte) {
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

// Join is a store URL below the server: Join("era5.zarr").
func (s *Server) Join(p string) string {
	return s.URL + "/" + strings.TrimPrefix(p, "/")
}
