package objectstore_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/gcstest"
	"github.com/zarrfs/zarrfs/objectstore/storetest"
)

func TestCheckGCSEndpoint(t *testing.T) {
	for ep, ok := range map[string]bool{
		"": true, "http://127.0.0.1:4443": true, "https://storage.example.com/storage/v1/": true, "host:9": true,
		"ftp://x": false, "http://u:pw@h": false, "http://h/?q=1": false,
	} {
		if err := objectstore.CheckGCSEndpoint(ep); (err == nil) != ok {
			t.Errorf("CheckGCSEndpoint(%q) = %v, want ok=%v", ep, err, ok)
		}
	}
}

func openGCS(t testing.TB, endpoint, bucket, prefix string, opts objectstore.GCSOptions) *objectstore.GCS {
	t.Helper()
	opts.Endpoint = endpoint
	if opts.Credentials == nil {
		opts.Anonymous = true
	}
	u := "gs://" + bucket
	if prefix != "" {
		u += "/" + prefix
	}
	g, err := objectstore.OpenGCS(context.Background(), u, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func TestGCSConformance(t *testing.T) {
	srv := gcstest.Start(t)
	for _, prefix := range []string{"", "stores/era5.zarr"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, files map[string][]byte) objectstore.Store {
				bucket := srv.NewBucket(t)
				srv.UploadFiles(t, bucket, prefix, files)
				// A neighbour sharing the prefix's name must not show through.
				if prefix != "" {
					srv.UploadFiles(t, bucket, "", map[string][]byte{prefix + ".bak/zarr.json": []byte("{}"), prefix + "x": []byte("{}")})
				}
				return openGCS(t, srv.URL, bucket, prefix, objectstore.GCSOptions{MaxInFlight: 8})
			})
		})
	}
	t.Run("retry and breaker", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, files map[string][]byte) objectstore.Store {
			bucket := srv.NewBucket(t)
			srv.UploadFiles(t, bucket, "s", files)
			g := openGCS(t, srv.URL, bucket, "s", objectstore.GCSOptions{})
			br := must(objectstore.WithBreaker(g, objectstore.BreakerOptions{}))
			t.Cleanup(func() { br.Close() })
			return must(objectstore.WithRetry(br, objectstore.RetryOptions{}))
		})
	})
	t.Run("EmulatorHost", func(t *testing.T) {
		bucket := srv.NewBucket(t)
		srv.UploadFiles(t, bucket, "z", map[string][]byte{"zarr.json": []byte(`{"zarr_format":3}`)})
		clearGoogleEnv(t)
		// No credentials anywhere and none asked for: the emulator takes none.
		g, err := objectstore.OpenGCS(context.Background(), "gs://"+bucket+"/z", objectstore.GCSOptions{EmulatorHost: strings.TrimPrefix(srv.URL, "http://")})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if b, err := g.Get(context.Background(), "zarr.json"); err != nil || string(b) != `{"zarr_format":3}` {
			t.Fatalf("Get = %q, %v", b, err)
		}
	})
}

// A chunk rewritten in place gets a new generation, which reads and
// listings report alike.
func TestGCSGenerations(t *testing.T) {
	srv := gcstest.Start(t)
	bucket := srv.NewBucket(t)
	srv.Put(bucket, "z/c/0", []byte("first"))
	g := openGCS(t, srv.URL, bucket, "z", objectstore.GCSOptions{})
	ctx := context.Background()
	_, v1, err := g.GetVersion(ctx, "c/0", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // the emulator's generations are clock-based
	srv.Put(bucket, "z/c/0", []byte("second"))
	b, v2, err := g.GetVersion(ctx, "c/0", nil, 0)
	if err != nil || string(b) != "second" {
		t.Fatalf("GetVersion after rewrite = %q, %v", b, err)
	}
	if v1 == v2 || !strings.HasPrefix(v2, "gen:") {
		t.Fatalf("versions %q then %q: a rewrite must change the generation", v1, v2)
	}
	if sv, err := g.StatVersion(ctx, "c/0"); err != nil || sv != v2 {
		t.Fatalf("StatVersion = %q, %v; want %q", sv, err, v2)
	}
	_, rv, err := g.GetRangeVersion(ctx, "c/0", -1, 3)
	if err != nil || rv != v2 {
		t.Fatalf("GetRangeVersion = %q, %v; want %q", rv, err, v2)
	}
}

// clearGoogleEnv leaves Application Default Credentials with nothing to
// find but the metadata server, which GCE_METADATA_HOST points at a port
// that refuses connections.
func clearGoogleEnv(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	t.Setenv("CLOUDSDK_CONFIG", filepath.Join(home, "gcloud"))
	t.Setenv("STORAGE_EMULATOR_HOST", "")
}

// serviceAccount writes a service account key file whose token_uri is a
// local token endpoint, and returns its path and the endpoint's counter.
// The endpoint hands out token, or refuses with invalid_grant when token
// is "".
func serviceAccount(t *testing.T, token string) (string, *atomic.Int64) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if token == "" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`)
			return
		}
		fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer","expires_in":3600}`, token)
	}))
	t.Cleanup(ts.Close)
	doc, _ := json.Marshal(map[string]string{
		"type":           "service_account",
		"project_id":     "zarrfs-test",
		"private_key_id": "0123456789abcdef",
		"private_key":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":   "reader@zarrfs-test.iam.gserviceaccount.com",
		"client_id":      "1234567890",
		"token_uri":      ts.URL + "/token",
	})
	p := filepath.Join(t.TempDir(), "key.json")
	if err := os.WriteFile(p, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, &calls
}

func TestGCSCredentials(t *testing.T) {
	srv := gcstest.Start(t)
	bucket := srv.NewBucket(t)
	srv.UploadFiles(t, bucket, "z", map[string][]byte{"zarr.json": []byte(`{"zarr_format":3}`)})
	ctx := context.Background()
	open := func(opts objectstore.GCSOptions) (*objectstore.GCS, error) {
		opts.Endpoint = srv.URL
		return objectstore.OpenGCS(ctx, "gs://"+bucket+"/z", opts)
	}

	t.Run("application default credentials", func(t *testing.T) {
		clearGoogleEnv(t)
		const token = "ya29.secret-access-token-0123456789"
		key, calls := serviceAccount(t, token)
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", key)
		var auth atomic.Value
		srv.OnRequest(func(r *http.Request) { auth.Store(r.Header.Get("Authorization")) })
		defer srv.OnRequest(nil)
		logs := &syncbuf.Buffer{}
		g, err := open(objectstore.GCSOptions{Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if calls.Load() != 1 {
			t.Fatalf("%d token requests at open, want 1", calls.Load())
		}
		if b, err := g.Get(ctx, "zarr.json"); err != nil || string(b) != `{"zarr_format":3}` {
			t.Fatalf("Get = %q, %v", b, err)
		}
		if got := auth.Load(); got != "Bearer "+token {
			t.Fatalf("the emulator saw Authorization %q, want the service account's token", got)
		}
		if _, err := g.List(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if calls.Load() != 1 {
			t.Errorf("%d token requests, want 1 (the token is reused)", calls.Load())
		}
		if strings.Contains(logs.String(), token) || strings.Contains(logs.String(), "PRIVATE KEY") {
			t.Fatal("the token or key appears in the log")
		}
		if !strings.Contains(logs.String(), "service_account") {
			t.Errorf("the log does not name the kind of credentials:\n%s", logs)
		}
	})
	t.Run("rejected key", func(t *testing.T) {
		clearGoogleEnv(t)
		key, _ := serviceAccount(t, "")
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", key)
		_, err := open(objectstore.GCSOptions{})
		if !objectstore.IsPermission(err) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("err = %v, want one line of permission error", err)
		}
		if !strings.Contains(err.Error(), "invalid_grant") {
			t.Errorf("err = %v, want the token endpoint's reason", err)
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Fatal("the key appears in the error")
		}
	})
	t.Run("missing key file", func(t *testing.T) {
		clearGoogleEnv(t)
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
		_, err := open(objectstore.GCSOptions{})
		if !errors.Is(err, objectstore.ErrNoGoogleCredentials) || !strings.Contains(err.Error(), "none.json") {
			t.Fatalf("err = %v, want ErrNoGoogleCredentials naming the file", err)
		}
	})
	t.Run("no credentials", func(t *testing.T) {
		clearGoogleEnv(t)
		_, err := open(objectstore.GCSOptions{})
		if !errors.Is(err, objectstore.ErrNoGoogleCredentials) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("err = %v, want one line of ErrNoGoogleCredentials (never an anonymous fallback)", err)
		}
	})
	t.Run("anonymous must be asked for", func(t *testing.T) {
		clearGoogleEnv(t)
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
		g, err := open(objectstore.GCSOptions{Anonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		var auth atomic.Value
		auth.Store("unset")
		srv.OnRequest(func(r *http.Request) { auth.Store(r.Header.Get("Authorization")) })
		defer srv.OnRequest(nil)
		if _, err := g.Get(ctx, "zarr.json"); err != nil {
			t.Fatal(err)
		}
		if got := auth.Load(); got != "" {
			t.Fatalf("an anonymous read sent Authorization %q", got)
		}
	})
}

// errorServer answers every request with status and an XML error of code,
// as GCS's XML API does.
func errorServer(t *testing.T, status int, code string) string {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		fmt.Fprintf(w, `<?xml version='1.0' encoding='UTF-8'?><Error><Code>%s</Code><Message>m</Message></Error>`, code)
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestGCSErrorClasses(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		status int
		code   string
		check  func(error) bool
		what   string
	}{
		{404, "NoSuchKey", objectstore.IsNotFound, "not found"},
		{404, "NoSuchBucket", func(err error) bool {
			return err != nil && !objectstore.IsNotFound(err) && !objectstore.IsTransient(err) && strings.Contains(err.Error(), "does not exist")
		}, "a missing bucket, never a missing chunk"},
		{403, "AccessDenied", objectstore.IsPermission, "permission"},
		{401, "AuthenticationRequired", func(err error) bool {
			return objectstore.IsPermission(err) && strings.Contains(err.Error(), "expired")
		}, "permission, saying the credentials may have expired"},
		{503, "ServiceUnavailable", objectstore.IsTransient, "transient"},
		{429, "SlowDown", objectstore.IsTransient, "transient"},
		{408, "RequestTimeout", objectstore.IsTransient, "transient"},
		{416, "InvalidRange", func(err error) bool {
			return errors.Is(err, objectstore.ErrRange) && !objectstore.IsTransient(err)
		}, "a permanent range error"},
		{400, "InvalidArgument", func(err error) bool {
			return err != nil && !objectstore.IsTransient(err) && !objectstore.IsNotFound(err)
		}, "permanent"},
	}
	for _, tc := range tests {
		g := openGCS(t, errorServer(t, tc.status, tc.code), "b", "z", objectstore.GCSOptions{})
		for _, op := range []func() error{
			func() error { _, err := g.Get(ctx, "c/0"); return err },
			func() error { _, err := g.GetRange(ctx, "c/0", -1, 16); return err },
		} {
			err := op()
			if !tc.check(err) {
				t.Errorf("HTTP %d %s: err = %v, want %s", tc.status, tc.code, err, tc.what)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("HTTP %d: error on more than one line: %q", tc.status, err)
			}
		}
	}
}

// gcsFaultEnv is an emulator with a store fixture behind a fault proxy.
type gcsFaultEnv struct {
	srv    *gcstest.Server
	proxy  *faultproxy.Proxy
	bucket string
	big    []byte
	logs   *syncbuf.Buffer
}

func newGCSFaultEnv(t *testing.T) *gcsFaultEnv {
	srv := gcstest.Start(t)
	p, err := faultproxy.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	e := &gcsFaultEnv{srv: srv, proxy: p, bucket: srv.NewBucket(t), big: randomBytes(2<<20, 3, 4), logs: &syncbuf.Buffer{}}
	srv.UploadFiles(t, e.bucket, "z", map[string][]byte{"big": e.big, "a/zarr.json": []byte("{}"), "a/c/0": []byte("c0")})
	return e
}

func (e *gcsFaultEnv) store(t *testing.T, retry objectstore.RetryOptions) objectstore.Store {
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g := openGCS(t, e.proxy.URL, e.bucket, "z", objectstore.GCSOptions{Logger: log, RequestTimeout: time.Second, MaxInFlight: 8})
	return must(objectstore.WithRetry(g, fastRetry(retry, log)))
}

func TestGCSFaultsRecovered(t *testing.T) {
	e := newGCSFaultEnv(t)
	s := e.store(t, objectstore.RetryOptions{})
	st := status
	checkFaultsRecovered(t, e.proxy, s, e.big, []faultCase{
		{"500 burst", []faultproxy.Fault{st(500), st(500), st(500)}},
		{"503 burst", []faultproxy.Fault{st(503), st(503), st(503), st(503)}},
		{"429", []faultproxy.Fault{st(429), st(429)}},
		{"reset mid-body", []faultproxy.Fault{{Kind: faultproxy.Reset, After: 3000}, {Kind: faultproxy.Reset, After: 0}}},
		{"truncated body", []faultproxy.Fault{{Kind: faultproxy.Truncate, After: 1000}, {Kind: faultproxy.Truncate, After: 1}}},
		{"stall mid-body", []faultproxy.Fault{{Kind: faultproxy.Stall, After: 500, StallFor: time.Minute}}},
		{"stall before headers", []faultproxy.Fault{{Kind: faultproxy.StallHeaders, StallFor: time.Minute}}},
		{"mixed", []faultproxy.Fault{st(503), {Kind: faultproxy.Reset, After: 10}, {Kind: faultproxy.Truncate, After: 5}, st(500)}},
	})
	t.Run("list 503", func(t *testing.T) {
		e.proxy.SetRule(faultproxy.Sequence(func(r *http.Request) bool {
			return strings.Contains(r.URL.Path, "/o") && r.URL.Query().Has("delimiter")
		},
			st(503), st(500)))
		defer e.proxy.SetRule(nil)
		names, err := s.List(guard(t), "a")
		if err != nil || strings.Join(names, ",") != "c/,zarr.json" {
			t.Fatalf("List = %q, %v", names, err)
		}
		if e.proxy.Faults() == 0 {
			t.Fatal("no fault injected into the listing")
		}
	})
}

// Faults that never stop end, within the budget, in a transient error
// naming the key: never in data, never in not-found, never in a hang.
func TestGCSFaultsPersistent(t *testing.T) {
	e := newGCSFaultEnv(t)
	checkFaultsPersistent(t, e.proxy, e.store, "gs://", []faultCase{
		{"503", []faultproxy.Fault{{Kind: faultproxy.Status, Status: 503}}},
		{"reset", []faultproxy.Fault{{Kind: faultproxy.Reset, After: 100}}},
		{"truncated", []faultproxy.Fault{{Kind: faultproxy.Truncate, After: 100}}},
		{"stall", []faultproxy.Fault{{Kind: faultproxy.Stall, After: 100, StallFor: time.Minute}}},
	})
}

// A source that stops answering opens the breaker: reads then fail at
// once, and it closes by itself when the source answers again.
func TestGCSBreaker(t *testing.T) {
	e := newGCSFaultEnv(t)
	g := openGCS(t, e.proxy.URL, e.bucket, "z", objectstore.GCSOptions{RequestTimeout: 200 * time.Millisecond})
	br := must(objectstore.WithBreaker(g, objectstore.BreakerOptions{Failures: 2, Silence: 300 * time.Millisecond, Quiet: time.Second, Probe: 50 * time.Millisecond, ProbeTimeout: 200 * time.Millisecond}))
	defer br.Close()
	ctx := guard(t)
	if _, err := br.Get(ctx, "a/c/0"); err != nil {
		t.Fatal(err)
	}
	e.proxy.SetRule(faultproxy.Always(nil, faultproxy.Fault{Kind: faultproxy.StallHeaders, StallFor: time.Minute}))
	for i := 0; i < 20 && !br.Open(); i++ {
		br.Get(ctx, "big")
	}
	if !br.Open() {
		t.Fatal("the breaker did not open on a silent source")
	}
	start := time.Now()
	if _, err := br.Get(ctx, "big"); !errors.Is(err, objectstore.ErrSourceDown) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("open breaker: err = %v after %v, want ErrSourceDown at once", err, time.Since(start))
	}
	e.proxy.SetRule(nil)
	deadline := time.Now().Add(10 * time.Second)
	for br.Open() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if br.Open() {
		t.Fatal("the breaker did not close when the source answered again")
	}
	if b, err := br.Get(ctx, "big"); err != nil || !bytes.Equal(b, e.big) {
		t.Fatalf("after the breaker closed: %d bytes, %v", len(b), err)
	}
}

// Many readers at once through a proxy that breaks a third of the
// requests in assorted ways: every read returns exactly the right bytes.
func TestGCSFaultsConcurrent(t *testing.T) {
	e := newGCSFaultEnv(t)
	checkFaultsConcurrent(t, e.proxy, e.store(t, objectstore.RetryOptions{MaxAttempts: 10}), e.big)
}

// flipBody flips one byte of a response body at offset at.
type flipBody struct {
	io.ReadCloser
	at, n int64
}

func (f *flipBody) Read(p []byte) (int, error) {
	m, err := f.ReadCloser.Read(p)
	if i := f.at - f.n; i >= 0 && i < int64(m) {
		p[i] ^= 0x55
	}
	f.n += int64(m)
	return m, err
}

// A whole object whose bytes changed on the way fails its CRC32C as a
// transient error and is never returned as data; with retries, a clean
// second response is.
func TestGCSChecksum(t *testing.T) {
	srv := gcstest.Start(t)
	bucket := srv.NewBucket(t)
	big := randomBytes(1<<20, 5, 6)
	srv.UploadFiles(t, bucket, "z", map[string][]byte{"big": big})
	target, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var corrupt atomic.Int64 // responses still to corrupt; -1: all
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(res *http.Response) error {
		if res.Request.URL.Query().Get("alt") == "media" && res.StatusCode == http.StatusOK && corrupt.Load() != 0 {
			corrupt.Add(-1)
			res.Body = &flipBody{ReadCloser: res.Body, at: 1000}
		}
		return nil
	}
	proxy := httptest.NewServer(rp)
	t.Cleanup(proxy.Close)
	g := openGCS(t, proxy.URL, bucket, "z", objectstore.GCSOptions{})
	ctx := context.Background()

	corrupt.Store(-1)
	b, err := g.Get(ctx, "big")
	if err == nil || !objectstore.IsTransient(err) || !strings.Contains(err.Error(), "CRC32C") {
		t.Fatalf("a corrupted body: %d bytes, err = %v; want a transient CRC32C error", len(b), err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error on more than one line: %q", err)
	}

	corrupt.Store(1)
	s := must(objectstore.WithRetry(g, fastRetry(objectstore.RetryOptions{}, nil)))
	if b, err := s.Get(ctx, "big"); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("after one corrupted response: %d bytes, %v; want the object", len(b), err)
	}
	if corrupt.Load() != 0 {
		t.Fatal("no response was corrupted")
	}
}

// An object stored gzip-encoded is served decompressed (GCS's decompressive
// transcoding: the transport asks for no gzip), ignoring Range: whole and
// ranged reads return the decompressed bytes, whose CRC32C is not the
// stored one.
func TestGCSDecompressed(t *testing.T) {
	srv := gcstest.Start(t)
	bucket := srv.NewBucket(t)
	plain := bytes.Repeat([]byte(`{"zarr_format":3,"node_type":"array"}`), 2000)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(plain)
	zw.Close()
	srv.Fake.CreateObject(fakestorage.Object{
		ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: "z/zarr.json", ContentEncoding: "gzip"},
		Content:     gz.Bytes(),
	})
	g := openGCS(t, srv.URL, bucket, "z", objectstore.GCSOptions{})
	ctx := context.Background()
	if b, err := g.Get(ctx, "zarr.json"); err != nil || !bytes.Equal(b, plain) {
		t.Fatalf("Get = %d bytes, %v; want the %d decompressed bytes", len(b), err, len(plain))
	}
	if b, err := g.GetRange(ctx, "zarr.json", 1000, 500); err != nil || !bytes.Equal(b, plain[1000:1500]) {
		t.Fatalf("GetRange = %q, %v", b, err)
	}
	if b, err := g.GetRange(ctx, "zarr.json", -1, 64); err != nil || !bytes.Equal(b, plain[len(plain)-64:]) {
		t.Fatalf("suffix GetRange = %q, %v", b, err)
	}
	if _, err := g.GetRange(ctx, "zarr.json", int64(len(plain))-10, 64); !errors.Is(err, objectstore.ErrRange) {
		t.Fatalf("a range past the decompressed end: err = %v, want ErrRange", err)
	}
}

// jsonErrorServer answers every request with status and a JSON API error
// of message, as GCS's JSON API does.
func jsonErrorServer(t *testing.T, status int, message string) string {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"code":%d,"message":%q,"errors":[{"message":%q,"domain":"global","reason":"x"}]}}`, status, message, message)
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// The JSON API's errors are classified as the XML API's are; a listing's
// 404 can only mean the bucket.
func TestGCSJSONErrorClasses(t *testing.T) {
	ctx := context.Background()
	missingBucket := func(err error) bool {
		return err != nil && !objectstore.IsNotFound(err) && !objectstore.IsTransient(err) && strings.Contains(err.Error(), `bucket "b" does not exist`)
	}
	tests := []struct {
		status  int
		message string
		check   func(error) bool
		what    string
	}{
		{404, "No such object: b/z/c/0", objectstore.IsNotFound, "not found"},
		{404, "The specified bucket does not exist.", missingBucket, "a missing bucket, never a missing chunk"},
		{403, "reader@p.iam.gserviceaccount.com does not have storage.objects.get access", func(err error) bool {
			return objectstore.IsPermission(err) && strings.Contains(err.Error(), "storage.objects.get")
		}, "permission, with the server's reason"},
		{503, "Backend Error", objectstore.IsTransient, "transient"},
	}
	for _, tc := range tests {
		g := openGCS(t, jsonErrorServer(t, tc.status, tc.message), "b", "z", objectstore.GCSOptions{})
		for name, op := range map[string]func() error{
			"get":   func() error { _, err := g.Get(ctx, "c/0"); return err },
			"range": func() error { _, err := g.GetRange(ctx, "c/0", 16, 16); return err },
			"stat":  func() error { _, err := g.StatVersion(ctx, "c/0"); return err },
		} {
			if err := op(); !tc.check(err) || (err != nil && strings.Contains(err.Error(), "\n")) {
				t.Errorf("HTTP %d %q, %s: err = %v, want %s on one line", tc.status, tc.message, name, err, tc.what)
			}
		}
	}
	g := openGCS(t, jsonErrorServer(t, 404, "Not Found"), "b", "z", objectstore.GCSOptions{})
	if _, err := g.List(ctx, "c"); !missingBucket(err) {
		t.Errorf("a listing's 404: err = %v, want the bucket named missing", err)
	}
}

// A read response without a generation is refused: a version that never
// changes would hide every rewrite.
func TestGCSNoGeneration(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "4")
		fmt.Fprint(w, "data")
	}))
	t.Cleanup(ts.Close)
	g := openGCS(t, ts.URL, "b", "z", objectstore.GCSOptions{})
	b, v, err := g.GetVersion(context.Background(), "c/0", nil, 0)
	if err == nil || objectstore.IsTransient(err) || !strings.Contains(err.Error(), "generation") {
		t.Fatalf("GetVersion = %q, %q, %v; want a permanent error naming the missing generation", b, v, err)
	}
}
