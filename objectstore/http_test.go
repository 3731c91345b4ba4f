package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/storetest"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
)

func TestParseHTTPURL(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{"https://data.example.org/era5.zarr", "https://data.example.org/era5.zarr", ""},
		{"http://127.0.0.1:8080/a/b.zarr/", "http://127.0.0.1:8080/a/b.zarr", ""},
		{"https://host", "https://host", ""},
		{"https://host/with space", "https://host/with%20space", ""},
		{"https://user:hunter2secret@host/x", "", "must not hold credentials"},
		{"https://host/x?X-Amz-Signature=hunter2secret", "", "not supported"},
		{"https://host/x#frag", "", "not supported"},
		{"https://host/../x", "", "bad path"},
		{"ftp://host/x", "", "not an http"},
		{"https:///x", "", "no host"},
	}
	for _, tc := range tests {
		got, err := objectstore.ParseHTTPURL(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseHTTPURL(%q) = %q, %v; want error %q", tc.in, got, err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2secret") {
				t.Errorf("ParseHTTPURL error repeats the secret: %v", err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseHTTPURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func openHTTP(t testing.TB, u string, opts objectstore.HTTPOptions) *objectstore.HTTP {
	t.Helper()
	h, err := objectstore.OpenHTTP(context.Background(), u, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestHTTPConformance(t *testing.T) {
	modes := []struct {
		name  string
		setup func(*webtest.Server)
		wrap  bool
	}{
		{"file server", func(*webtest.Server) {}, false},
		{"etags", func(s *webtest.Server) { s.ETags.Store(true) }, false},
		{"range ignored", func(s *webtest.Server) { s.IgnoreRange.Store(true) }, false},
		{"no HEAD", func(s *webtest.Server) { s.NoHead.Store(true) }, false},
		{"retry and breaker", func(*webtest.Server) {}, true},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			storetest.RunWith(t, storetest.Options{NoListing: true}, func(t *testing.T, files map[string][]byte) objectstore.Store {
				dir := t.TempDir()
				webtest.WriteFiles(t, filepath.Join(dir, "stores", "x.zarr"), files)
				srv := webtest.Start(t, dir)
				m.setup(srv)
				h := openHTTP(t, srv.Join("stores/x.zarr"), objectstore.HTTPOptions{MaxInFlight: 8})
				if !m.wrap {
					return h
				}
				br := must(objectstore.WithBreaker(h, objectstore.BreakerOptions{}))
				t.Cleanup(func() { br.Close() })
				return must(objectstore.WithRetry(br, objectstore.RetryOptions{}))
			})
		})
	}
}

// Versions follow the server's validators: its ETag when it sends one,
// else its Last-Modified; a rewrite changes them.
func TestHTTPVersions(t *testing.T) {
	dir := t.TempDir()
	webtest.WriteFiles(t, dir, map[string][]byte{"c/0": []byte("first")})
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(dir, "c", "0"), old, old)
	srv := webtest.Start(t, dir)
	ctx := context.Background()
	for _, etags := range []bool{false, true} {
		srv.ETags.Store(etags)
		h := openHTTP(t, srv.URL, objectstore.HTTPOptions{})
		_, v1, err := h.GetVersion(ctx, "c/0", nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{false: "last-modified", true: "etag"}[etags]
		if h.Validators() != want {
			t.Errorf("etags=%v: Validators() = %q, want %q", etags, h.Validators(), want)
		}
		os.WriteFile(filepath.Join(dir, "c", "0"), []byte("other"), 0o644)
		_, v2, err := h.GetVersion(ctx, "c/0", nil, 0)
		if err != nil || v1 == v2 {
			t.Errorf("etags=%v: versions %q then %q (%v): a rewrite must change the version", etags, v1, v2, err)
		}
		if sv, err := h.StatVersion(ctx, "c/0"); err != nil || sv != v2 {
			t.Errorf("etags=%v: StatVersion = %q, %v; want %q", etags, sv, err, v2)
		}
		os.Chtimes(filepath.Join(dir, "c", "0"), old, old)
	}
}

// A chunk rewritten within the second it was read keeps its Last-Modified
// (one-second resolution): without an ETag, its size tells the rewrite, so
// a version from Last-Modified names both, and a HEAD, a whole read, a
// range and a suffix of one object state name it alike. A rewrite that
// keeps both the second and the length is the documented limit.
func TestHTTPLastModifiedVersionNamesSize(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c", "0")
	webtest.WriteFiles(t, dir, map[string][]byte{"c/0": []byte("first chunk")})
	second := time.Now().Add(-time.Hour).Truncate(time.Second)
	os.Chtimes(p, second, second)
	srv := webtest.Start(t, dir)
	ctx := context.Background()
	h := openHTTP(t, srv.URL, objectstore.HTTPOptions{})
	versions := func() []string {
		t.Helper()
		_, whole, err1 := h.GetVersion(ctx, "c/0", nil, 0)
		_, rng, err2 := h.GetRangeVersion(ctx, "c/0", 1, 3)
		_, suffix, err3 := h.GetRangeVersion(ctx, "c/0", -1, 2)
		head, err4 := h.StatVersion(ctx, "c/0")
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			t.Fatal(err)
		}
		return []string{whole, rng, suffix, head}
	}
	before := versions()
	for _, v := range before[1:] {
		if v != before[0] {
			t.Fatalf("one object state, versions %q: a read and a HEAD must agree", before)
		}
	}
	// Other bytes and another length, the same second (a server's
	// Last-Modified of a rewrite within the second of the last read).
	os.WriteFile(p, []byte("second chunk, longer"), 0o644)
	os.Chtimes(p, second.Add(300*time.Millisecond), second.Add(300*time.Millisecond))
	after := versions()
	for i, v := range after {
		if v == before[0] {
			t.Errorf("read %d: version %q after a same-second rewrite of another size: served as the old chunk", i, v)
		}
		if v != after[0] {
			t.Errorf("after the rewrite, versions %q: a read and a HEAD must agree", after)
		}
	}
	if !strings.HasPrefix(after[0], "modified:") {
		t.Errorf("version %q: not from Last-Modified, the test proves nothing", after[0])
	}
}

// A server that answers a range without telling the object's size (a
// Content-Range of unknown length, "bytes 0-9/*", or the whole object in a
// chunked body, the Range ignored) still gets one version for one object
// state, whatever the request: without an ETag the version names the size
// with the Last-Modified, so the size is asked (HEAD) when a response does
// not tell it. An object whose Last-Modified changes between the read and
// that request is a transient error: the read is tried again.
func TestHTTPVersionWithoutTotalLength(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000)
	for _, mode := range []string{"unknown total", "chunked range", "changing"} {
		t.Run(mode, func(t *testing.T) {
			var heads atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				lm := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
				if mode == "changing" && r.Method == http.MethodHead {
					lm = lm.Add(time.Second)
				}
				w.Header().Set("Last-Modified", lm.Format(http.TimeFormat))
				rng := r.Header.Get("Range")
				switch {
				case r.Method == http.MethodHead:
					heads.Add(1)
					w.Header().Set("Content-Length", strconv.Itoa(len(data)))
				case rng == "":
					w.Header().Set("Content-Length", strconv.Itoa(len(data)))
					w.Write(data)
				case mode == "chunked range":
					w.Write(data[:1000]) // no Content-Length: chunked
					w.(http.Flusher).Flush()
					w.Write(data[1000:])
				default:
					var a, b int
					if _, err := fmt.Sscanf(rng, "bytes=%d-%d", &a, &b); err != nil {
						var n int
						fmt.Sscanf(rng, "bytes=-%d", &n)
						a, b = len(data)-n, len(data)-1
					}
					w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/*", a, b))
					w.WriteHeader(http.StatusPartialContent)
					w.Write(data[a : b+1])
				}
			}))
			t.Cleanup(srv.Close)
			ctx := context.Background()
			h := openHTTP(t, srv.URL, objectstore.HTTPOptions{})
			b, rng, err := h.GetRangeVersion(ctx, "obj", 100, 50)
			if mode == "changing" {
				if err == nil || !objectstore.IsTransient(err) {
					t.Fatalf("a range whose object changed before its size was asked: %q, %v; want a transient error", rng, err)
				}
				return
			}
			if err != nil || !bytes.Equal(b, data[100:150]) {
				t.Fatalf("range: %d bytes, %v", len(b), err)
			}
			if heads.Load() != 1 {
				t.Errorf("%d HEAD requests for a range without the size, want 1", heads.Load())
			}
			_, suffix, err1 := h.GetRangeVersion(ctx, "obj", -1, 20)
			_, whole, err2 := h.GetVersion(ctx, "obj", nil, 0)
			head, err3 := h.StatVersion(ctx, "obj")
			if err := errors.Join(err1, err2, err3); err != nil {
				t.Fatal(err)
			}
			want := "modified:Tue, 02 Jan 2024 03:04:05 GMT+" + strconv.Itoa(len(data))
			for name, v := range map[string]string{"range": rng, "suffix": suffix, "whole": whole, "head": head} {
				if v != want {
					t.Errorf("%s: version %q, want %q", name, v, want)
				}
			}
		})
	}
}

// A server that announces a range and sends half of it, or cuts a body,
// never gets its bytes returned: the read fails, transient, naming the
// object, and after the retries it is still an error.
func TestHTTPShortResponses(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("0123456789"), 10_000)
	webtest.WriteFiles(t, dir, map[string][]byte{"t/0.0": data})
	srv := webtest.Start(t, dir)
	srv.ShortRanges.Store(true)
	ctx := guard(t)
	h := openHTTP(t, srv.URL, objectstore.HTTPOptions{})
	for _, r := range [][2]int64{{100, 5000}, {-1, 4096}} {
		b, err := h.GetRange(ctx, "t/0.0", r[0], r[1])
		if err == nil {
			t.Fatalf("range %v of a short response: %d bytes returned", r, len(b))
		}
		if !objectstore.IsTransient(err) || !errors.Is(err, objectstore.ErrTruncated) || !strings.Contains(err.Error(), "t/0.0") {
			t.Fatalf("range %v: err = %v, want a transient ErrTruncated naming the object", r, err)
		}
	}
	rs := must(objectstore.WithRetry(h, objectstore.RetryOptions{MaxAttempts: 3, InitialBackoff: time.Millisecond}))
	before := srv.Requests()
	if _, err := rs.GetRange(ctx, "t/0.0", 100, 5000); err == nil || !strings.Contains(err.Error(), "gave up after 3 attempts") {
		t.Fatalf("retried: %v", err)
	}
	if n := srv.Requests() - before; n != 3 {
		t.Fatalf("%d requests, want 3", n)
	}
	// A whole read is not ranged, so it is not cut.
	if b, err := h.Get(ctx, "t/0.0"); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("Get: %d bytes, %v", len(b), err)
	}
}

// oddHTTP answers /obj the way some servers do.
func oddHTTP(t *testing.T, data []byte, mode string) *objectstore.HTTP {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/obj" {
			http.NotFound(w, r)
			return
		}
		rng := r.Header.Get("Range")
		switch mode {
		case "chunked": // no Content-Length, Range ignored
			for b := data; len(b) > 0; {
				n := min(len(b), 1000)
				w.Write(b[:n])
				w.(http.Flusher).Flush()
				b = b[n:]
			}
		case "chunked cut":
			w.Write(data[:1000])
			w.(http.Flusher).Flush()
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
		case "wrong range":
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-9/%d", len(data)))
			w.Header().Set("Content-Length", "10")
			w.WriteHeader(http.StatusPartialContent)
			w.Write(data[:10])
		case "gzip":
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(data)
		case "partial for whole":
			if rng == "" {
				w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-9/%d", len(data)))
				w.WriteHeader(http.StatusPartialContent)
				w.Write(data[:10])
			}
		}
	}))
	t.Cleanup(srv.Close)
	return openHTTP(t, srv.URL, objectstore.HTTPOptions{})
}

func TestHTTPOddServers(t *testing.T) {
	data := make([]byte, 10_000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ctx := context.Background()
	t.Run("chunked, range ignored", func(t *testing.T) {
		h := oddHTTP(t, data, "chunked")
		for _, r := range [][2]int64{{0, 10_000}, {100, 50}, {9_990, 10}, {-1, 20}, {-1, 10_000}} {
			b, err := h.GetRange(ctx, "obj", r[0], r[1])
			off := r[0]
			if off < 0 {
				off = int64(len(data)) - r[1]
			}
			if err != nil || !bytes.Equal(b, data[off:off+r[1]]) {
				t.Errorf("range %v: %d bytes, %v", r, len(b), err)
			}
		}
		if b, err := h.Get(ctx, "obj"); err != nil || !bytes.Equal(b, data) {
			t.Errorf("Get: %d bytes, %v", len(b), err)
		}
		for _, r := range [][2]int64{{9_990, 20}, {20_000, 5}, {-1, 10_001}} {
			if _, err := h.GetRange(ctx, "obj", r[0], r[1]); !errors.Is(err, objectstore.ErrRange) || objectstore.IsTransient(err) {
				t.Errorf("range %v past the end: %v, want a permanent ErrRange", r, err)
			}
		}
	})
	for mode, transient := range map[string]bool{"chunked cut": true, "wrong range": true, "gzip": false, "partial for whole": true} {
		t.Run(mode, func(t *testing.T) {
			h := oddHTTP(t, data, mode)
			reads := map[string]func() ([]byte, error){
				"get":   func() ([]byte, error) { return h.Get(ctx, "obj") },
				"range": func() ([]byte, error) { return h.GetRange(ctx, "obj", 5000, 10) },
			}
			for name, read := range reads {
				if mode == "wrong range" && name == "get" || mode == "partial for whole" && name == "range" {
					continue
				}
				b, err := read()
				if err == nil {
					t.Errorf("%s: %d bytes of a bad response returned", name, len(b))
					continue
				}
				if objectstore.IsTransient(err) != transient || objectstore.IsNotFound(err) {
					t.Errorf("%s: err = %v, want transient=%v", name, err, transient)
				}
			}
		})
	}
}

// A directory of the server is no object, though the server answers its
// index page after a redirect.
func TestHTTPDirectoryIsNotAnObject(t *testing.T) {
	dir := t.TempDir()
	webtest.WriteFiles(t, dir, map[string][]byte{"t/0.0": []byte("x")})
	srv := webtest.Start(t, dir)
	h := openHTTP(t, srv.URL, objectstore.HTTPOptions{})
	for _, k := range []string{"t", "t/"} {
		if b, err := h.Get(context.Background(), k); !objectstore.IsNotFound(err) {
			t.Errorf("Get(%q) = %q, %v; want ErrNotFound", k, b, err)
		}
	}
}

// The bearer token goes to the server, a refusal is one line that says
// whether one was sent, and the token is in no error and no log line.
func TestHTTPBearerToken(t *testing.T) {
	dir := t.TempDir()
	webtest.WriteFiles(t, dir, map[string][]byte{"zarr.json": []byte(`{"zarr_format":3}`)})
	srv := webtest.Start(t, dir)
	const token = "eyJhbGciOi.secret-bearer-token-0123456789"
	srv.RequireToken(token)
	ctx := context.Background()
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var errs []string
	good := openHTTP(t, srv.URL, objectstore.HTTPOptions{BearerToken: token, TokenSource: "ZARRFS_HTTP_BEARER_TOKEN", Logger: log})
	if b, err := good.Get(ctx, "zarr.json"); err != nil || string(b) != `{"zarr_format":3}` {
		t.Fatalf("with the token: %q, %v", b, err)
	}
	if srv.LastAuthorization() != "Bearer "+token {
		t.Fatalf("server saw Authorization %q", srv.LastAuthorization())
	}
	none := openHTTP(t, srv.URL, objectstore.HTTPOptions{TokenSource: "ZARRFS_HTTP_BEARER_TOKEN", Logger: log})
	_, err := none.Get(ctx, "zarr.json")
	if !objectstore.IsPermission(err) || !strings.Contains(err.Error(), "set ZARRFS_HTTP_BEARER_TOKEN") {
		t.Fatalf("without a token: %v, want a permission error saying what to set", err)
	}
	errs = append(errs, err.Error())
	srv.RequireToken("a-newer-token")
	expired := must(objectstore.WithRetry(good, objectstore.RetryOptions{Logger: log}))
	_, err = expired.Get(ctx, "zarr.json")
	if !objectstore.IsPermission(err) || !strings.Contains(err.Error(), "may have expired") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("refused token: %v, want one line saying it may have expired", err)
	}
	errs = append(errs, err.Error())
	if _, err := good.GetRange(ctx, "zarr.json", -1, 4); !objectstore.IsPermission(err) {
		t.Fatalf("refused token, range: %v", err)
	}
	if _, err := good.StatVersion(ctx, "zarr.json"); !objectstore.IsPermission(err) {
		t.Fatalf("refused token, stat: %v", err)
	}
	all := strings.Join(errs, "\n") + logs.String() + good.ID()
	if !strings.Contains(logs.String(), "http get failed") {
		t.Fatal("nothing was logged; the capture is not working")
	}
	if strings.Contains(all, token) || strings.Contains(all, "secret-bearer") {
		t.Fatal("the token appears in an error or the log")
	}
}

func TestHTTPFaults(t *testing.T) {
	dir := t.TempDir()
	big := randomBytes(2<<20, 5, 6)
	webtest.WriteFiles(t, dir, map[string][]byte{"z/big": big})
	srv := webtest.Start(t, dir)
	p, err := faultproxy.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	h := openHTTP(t, p.URL+"/z", objectstore.HTTPOptions{RequestTimeout: time.Second})
	s := must(objectstore.WithRetry(h, objectstore.RetryOptions{MaxAttempts: 6, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Budget: 20 * time.Second}))
	st := status
	checkFaultsRecovered(t, p, s, big, []faultCase{
		{"503 burst", []faultproxy.Fault{st(503), st(503), st(500)}},
		{"reset", []faultproxy.Fault{{Kind: faultproxy.Reset, After: 3000}}},
		{"truncated", []faultproxy.Fault{{Kind: faultproxy.Truncate, After: 1000}, {Kind: faultproxy.Truncate, After: 0}}},
		{"stall", []faultproxy.Fault{{Kind: faultproxy.Stall, After: 500, StallFor: time.Minute}}},
		{"stall early", []faultproxy.Fault{{Kind: faultproxy.StallHeaders, StallFor: time.Minute}}},
	})
	t.Run("persistent", func(t *testing.T) {
		p.SetRule(faultproxy.Always(faultproxy.ObjectGets, faultproxy.Fault{Kind: faultproxy.Truncate, After: 100}))
		defer p.SetRule(nil)
		_, err := s.Get(guard(t), "big")
		if !objectstore.IsTransient(err) || !errors.Is(err, objectstore.ErrTruncated) || !strings.Contains(err.Error(), "z/big") {
			t.Fatalf("err = %v, want a transient truncation naming the object", err)
		}
	})
	t.Run("breaker", func(t *testing.T) {
		br := must(objectstore.WithBreaker(h, objectstore.BreakerOptions{Failures: 2, Silence: 300 * time.Millisecond, Quiet: time.Second,
			Probe: 50 * time.Millisecond, ProbeTimeout: 300 * time.Millisecond}))
		defer br.Close()
		ctx := guard(t)
		// No read has succeeded yet: the probe cannot read a key, and
		// asks the server with a HEAD of its own.
		p.SetRule(faultproxy.Always(nil, faultproxy.Fault{Kind: faultproxy.StallHeaders, StallFor: time.Minute}))
		for i := 0; i < 20 && !br.Open(); i++ {
			br.Get(ctx, "big")
		}
		if !br.Open() {
			t.Fatal("the breaker did not open")
		}
		time.Sleep(300 * time.Millisecond)
		if !br.Open() {
			t.Fatal("the breaker closed while the server was still silent")
		}
		p.SetRule(nil)
		deadline := time.Now().Add(10 * time.Second)
		for br.Open() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if br.Open() {
			t.Fatal("the breaker did not close when the server answered again")
		}
	})
}
