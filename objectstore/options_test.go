package objectstore

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A negative option is a mistake: refused, never turned into the default
// (a --source-stall of -1s must not become 10s).
func TestNegativeOptionsRefused(t *testing.T) {
	inner, err := OpenPosix(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func() error{
		"RetryOptions.Budget":         func() error { _, err := WithRetry(inner, RetryOptions{Budget: -time.Second}); return err },
		"RetryOptions.MaxAttempts":    func() error { _, err := WithRetry(inner, RetryOptions{MaxAttempts: -1}); return err },
		"BreakerOptions.Silence":      func() error { _, err := WithBreaker(inner, BreakerOptions{Silence: -time.Second}); return err },
		"BreakerOptions.ProbeTimeout": func() error { _, err := WithBreaker(inner, BreakerOptions{ProbeTimeout: -1}); return err },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s negative: %v, want an error naming it", name, err)
		}
	}
	// Zero still means the default.
	if r := must(WithRetry(inner, RetryOptions{})); r.opts.Budget != 2*time.Minute || r.opts.MaxAttempts != 6 {
		t.Errorf("zero RetryOptions: %+v", r.opts)
	}
	b := must(WithBreaker(inner, BreakerOptions{}))
	defer b.Close()
	if b.opts.Silence != 10*time.Second {
		t.Errorf("zero BreakerOptions: %+v", b.opts)
	}
	if _, err := OpenS3(context.Background(), "s3://b/p", S3Options{Endpoint: "http://127.0.0.1:1", Anonymous: true, RequestTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "request timeout") {
		t.Errorf("OpenS3 with a negative request timeout: %v", err)
	}
	ctx := context.Background()
	for name, open := range map[string]func() error{
		"OpenS3 max in flight": func() error {
			_, err := OpenS3(ctx, "s3://b/p", S3Options{Endpoint: "http://127.0.0.1:1", Anonymous: true, MaxInFlight: -1})
			return err
		},
		"OpenGCS request timeout": func() error {
			_, err := OpenGCS(ctx, "gs://b/p", GCSOptions{Endpoint: "http://127.0.0.1:1", Anonymous: true, RequestTimeout: -time.Second})
			return err
		},
		"OpenGCS max in flight": func() error {
			_, err := OpenGCS(ctx, "gs://b/p", GCSOptions{Endpoint: "http://127.0.0.1:1", Anonymous: true, MaxInFlight: -1})
			return err
		},
		"OpenHTTP request timeout": func() error {
			_, err := OpenHTTP(ctx, "http://127.0.0.1:1/p", HTTPOptions{RequestTimeout: -time.Second})
			return err
		},
		"OpenHTTP max in flight": func() error {
			_, err := OpenHTTP(ctx, "http://127.0.0.1:1/p", HTTPOptions{MaxInFlight: -1})
			return err
		},
	} {
		if err := open(); err == nil || !strings.Contains(err.Error(), "want 0 (the default) or more") {
			t.Errorf("%s negative: %v, want it refused", name, err)
		}
	}
}

// Every remote store's transport keeps a connection per request in flight
// for reuse, bounds the wait for response headers by the request timeout
// and asks for no transparent compression.
func TestRemoteTransportsTuned(t *testing.T) {
	ctx := context.Background()
	s3, err := OpenS3(ctx, "s3://b/p", S3Options{Endpoint: "https://127.0.0.1:1", Anonymous: true, RequestTimeout: 3 * time.Second, MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	gcs, err := OpenGCS(ctx, "gs://b/p", GCSOptions{Endpoint: "http://127.0.0.1:1", Anonymous: true, RequestTimeout: 3 * time.Second, MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer gcs.Close()
	web, err := OpenHTTP(ctx, "http://127.0.0.1:1/p", HTTPOptions{RequestTimeout: 3 * time.Second, MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	for name, rt := range map[string]any{"s3": s3.tr, "gcs": gcs.tr, "http": web.tr} {
		tr, ok := rt.(*http.Transport)
		if !ok {
			t.Fatalf("%s: transport %T", name, rt)
		}
		if tr.MaxIdleConnsPerHost != 8 || tr.ResponseHeaderTimeout != 3*time.Second || !tr.DisableCompression || tr.DialContext == nil {
			t.Errorf("%s: idle per host %d, header timeout %v, compression disabled %v", name, tr.MaxIdleConnsPerHost, tr.ResponseHeaderTimeout, tr.DisableCompression)
		}
	}
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
