package objectstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/integration/miniotest"
	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/objectstore"
)

// faultEnv is a MinIO with a store fixture behind a fault proxy.
type faultEnv struct {
	srv    *miniotest.Server
	proxy  *faultproxy.Proxy
	bucket string
	big    []byte
	logs   *syncbuf.Buffer
}

func newFaultEnv(t *testing.T) *faultEnv {
	srv := miniotest.Start(t)
	p, err := faultproxy.New(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	e := &faultEnv{srv: srv, proxy: p, bucket: srv.NewBucket(t), big: randomBytes(2<<20, 3, 4), logs: &syncbuf.Buffer{}}
	srv.UploadFiles(t, e.bucket, "z", map[string][]byte{"big": e.big, "a/zarr.json": []byte("{}"), "a/c/0": []byte("c0")})
	return e
}

// store opens the S3 store through the proxy, with short timeouts and a
// retry layer whose budget keeps every test well under a minute.
func (e *faultEnv) store(t *testing.T, creds *credentials.Credentials, retry objectstore.RetryOptions) objectstore.Store {
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := objectstore.OpenS3(context.Background(), "s3://"+e.bucket+"/z", objectstore.S3Options{
		Endpoint:       e.proxy.URL,
		Region:         "us-east-1", // no location lookup through the proxy
		Credentials:    creds,
		Logger:         log,
		RequestTimeout: time.Second,
		MaxInFlight:    8,
	})
	if err != nil {
		t.Fatal(err)
	}
	return must(objectstore.WithRetry(s, fastRetry(retry, log)))
}

func TestS3FaultsRecovered(t *testing.T) {
	e := newFaultEnv(t)
	s := e.store(t, staticCreds(e.srv), objectstore.RetryOptions{})
	st := status
	checkFaultsRecovered(t, e.proxy, s, e.big, []faultCase{
		{"500 burst", []faultproxy.Fault{st(500), st(500), st(500)}},
		{"503 burst", []faultproxy.Fault{st(503), st(503), st(503), st(503)}},
		{"429 SlowDown", []faultproxy.Fault{st(429), st(429)}},
		{"503 SlowDown", []faultproxy.Fault{{Kind: faultproxy.Status, Status: 503, Code: "SlowDown"}}},
		{"reset mid-body", []faultproxy.Fault{{Kind: faultproxy.Reset, After: 3000}, {Kind: faultproxy.Reset, After: 0}}},
		{"truncated body", []faultproxy.Fault{{Kind: faultproxy.Truncate, After: 1000}, {Kind: faultproxy.Truncate, After: 1}}},
		{"stall mid-body", []faultproxy.Fault{{Kind: faultproxy.Stall, After: 500, StallFor: time.Minute}}},
		{"stall before headers", []faultproxy.Fault{{Kind: faultproxy.StallHeaders, StallFor: time.Minute}}},
		{"mixed", []faultproxy.Fault{st(503), {Kind: faultproxy.Reset, After: 10}, {Kind: faultproxy.Truncate, After: 5}, st(500)}},
	})
	// Listing goes through the same machinery.
	t.Run("list 503", func(t *testing.T) {
		e.proxy.SetRule(faultproxy.Sequence(func(r *http.Request) bool { return strings.Contains(r.URL.RawQuery, "list-type") },
			st(503), st(500)))
		defer e.proxy.SetRule(nil)
		names, err := s.List(guard(t), "a")
		if err != nil || strings.Join(names, ",") != "c/,zarr.json" {
			t.Fatalf("List = %q, %v", names, err)
		}
	})
}

// Faults that never stop end, within the budget, in a transient error:
// never in data, never in not-found, never in a hang.
func TestS3FaultsPersistent(t *testing.T) {
	e := newFaultEnv(t)
	checkFaultsPersistent(t, e.proxy, func(t *testing.T, retry objectstore.RetryOptions) objectstore.Store {
		return e.store(t, staticCreds(e.srv), retry)
	}, "s3://", []faultCase{
		{"503", []faultproxy.Fault{{Kind: faultproxy.Status, Status: 503}}},
		{"429", []faultproxy.Fault{{Kind: faultproxy.Status, Status: 429}}},
		{"reset", []faultproxy.Fault{{Kind: faultproxy.Reset, After: 100}}},
		{"truncated", []faultproxy.Fault{{Kind: faultproxy.Truncate, After: 100}}},
		{"stall", []faultproxy.Fault{{Kind: faultproxy.Stall, After: 100, StallFor: time.Minute}}},
	})
}

// Permanent answers are not retried, and a budget larger than the wait is
// cut short by the caller's cancellation.
func TestS3NoRetryOnPermanent(t *testing.T) {
	e := newFaultEnv(t)
	ctx := guard(t)
	s := e.store(t, staticCreds(e.srv), objectstore.RetryOptions{})
	before := e.proxy.Requests()
	if _, err := s.Get(ctx, "a/c/9"); !objectstore.IsNotFound(err) {
		t.Fatalf("missing chunk: %v", err)
	}
	if n := e.proxy.Requests() - before; n != 1 {
		t.Errorf("missing chunk: %d requests, want 1", n)
	}
	bad := e.store(t, credentials.NewStaticV4(e.srv.AccessKey, "wrong-secret-key-123", ""), objectstore.RetryOptions{})
	before = e.proxy.Requests()
	if _, err := bad.Get(ctx, "big"); !objectstore.IsPermission(err) {
		t.Fatalf("rejected key: %v", err)
	}
	if n := e.proxy.Requests() - before; n != 1 {
		t.Errorf("rejected key: %d requests, want 1", n)
	}

	slow := e.store(t, staticCreds(e.srv), objectstore.RetryOptions{InitialBackoff: time.Hour, MaxBackoff: time.Hour, Budget: 10 * time.Hour})
	cctx, cancel := context.WithCancel(ctx)
	e.proxy.SetRule(func(r *http.Request, n int64) faultproxy.Fault {
		cancel() // the reader goes away while the first attempt fails
		return faultproxy.Fault{Kind: faultproxy.Status, Status: 503}
	})
	defer e.proxy.SetRule(nil)
	_, err := slow.Get(cctx, "big")
	if !errors.Is(err, context.Canceled) || objectstore.IsTransient(err) {
		t.Fatalf("cancelled during backoff: err = %v, want context.Canceled", err)
	}
	if ctx.Err() != nil {
		t.Fatal("cancellation did not end the wait")
	}
}

// The secret key appears in no error and no log line, whatever happens.
func TestS3SecretNeverLeaks(t *testing.T) {
	e := newFaultEnv(t)
	ctx := guard(t)
	good := e.store(t, staticCreds(e.srv), objectstore.RetryOptions{MaxAttempts: 2})
	wrongSecret := "WRONGSECRET" + e.srv.SecretKey[:8] + "zz"
	bad := e.store(t, credentials.NewStaticV4(e.srv.AccessKey, wrongSecret, "sessiontoken-xyz-123"), objectstore.RetryOptions{MaxAttempts: 2})
	var errs []string
	record := func(_ any, err error) {
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	for _, f := range []faultproxy.Fault{
		{Kind: faultproxy.Status, Status: 503},
		{Kind: faultproxy.Status, Status: 403, Code: "AccessDenied"},
		{Kind: faultproxy.Reset, After: 10},
		{Kind: faultproxy.Truncate, After: 10},
		{Kind: faultproxy.Stall, After: 10, StallFor: time.Minute},
	} {
		e.proxy.SetRule(faultproxy.Always(nil, f))
		for _, s := range []objectstore.Store{good, bad} {
			record(s.Get(ctx, "big"))
			record(s.GetRange(ctx, "big", -1, 10))
			record(s.List(ctx, "a"))
		}
	}
	e.proxy.SetRule(nil)
	for _, s := range []objectstore.Store{good, bad} {
		record(s.Get(ctx, "big"))
		record(s.Get(ctx, "missing"))
		record(s.List(ctx, "a"))
	}
	if len(errs) < 30 {
		t.Fatalf("only %d errors recorded; the faults did not happen", len(errs))
	}
	all := strings.Join(errs, "\n") + "\n" + e.logs.String() + good.ID() + bad.ID()
	if !strings.Contains(e.logs.String(), "retrying") {
		t.Fatal("no retry was logged; the log capture is not working")
	}
	for _, secret := range []string{e.srv.SecretKey, wrongSecret, "sessiontoken-xyz-123"} {
		if strings.Contains(all, secret) {
			i := strings.Index(all, secret)
			t.Fatalf("secret found in errors or logs: ...%s...", all[max(0, i-200):i])
		}
	}
}

// The budget ends a call that keeps failing even when attempts remain.
func TestS3FaultsBudget(t *testing.T) {
	e := newFaultEnv(t)
	s := e.store(t, staticCreds(e.srv), objectstore.RetryOptions{MaxAttempts: 1000, Budget: time.Second,
		InitialBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	e.proxy.SetRule(faultproxy.Always(faultproxy.ObjectGets, faultproxy.Fault{Kind: faultproxy.Status, Status: 500}))
	defer e.proxy.SetRule(nil)
	ctx := guard(t)
	_, err := s.Get(ctx, "big")
	if ctx.Err() != nil {
		t.Fatal("read did not end within the guard")
	}
	if !objectstore.IsTransient(err) || !strings.Contains(err.Error(), "budget") {
		t.Fatalf("err = %v, want a transient error naming the budget", err)
	}
}

// Many readers at once through a proxy that breaks a third of the
// requests in assorted ways: every read returns exactly the right bytes.
func TestS3FaultsConcurrent(t *testing.T) {
	e := newFaultEnv(t)
	checkFaultsConcurrent(t, e.proxy, e.store(t, staticCreds(e.srv), objectstore.RetryOptions{MaxAttempts: 10}), e.big)
}

// A listing of many pages that keeps flowing is never cut off, however
// long it takes in all: the request timeout bounds the wait for each page,
// as it bounds the wait between two reads of a body. Nor does a listing
// ever end early with part of the names.
func TestS3SlowListingNotCut(t *testing.T) {
	e := newFaultEnv(t)
	files := map[string][]byte{}
	for i := range 1001 {
		files[fmt.Sprintf("many/%04d", i)] = []byte("x")
	}
	e.srv.UploadFiles(t, e.bucket, "z", files)
	s := e.store(t, staticCreds(e.srv), objectstore.RetryOptions{MaxAttempts: 2})
	// Two pages of up to 1,000, each 600ms late: 1.2s in all, against a
	// request timeout of 1s (newFaultEnv).
	e.proxy.SetRule(faultproxy.Always(func(r *http.Request) bool { return strings.Contains(r.URL.RawQuery, "list-type") },
		faultproxy.Fault{Kind: faultproxy.StallHeaders, StallFor: 600 * time.Millisecond}))
	defer e.proxy.SetRule(nil)
	names, err := s.List(guard(t), "many")
	if err != nil || len(names) != len(files) {
		t.Fatalf("List of %d names in 2 slow pages: %d names, %v", len(files), len(names), err)
	}
	n := 0
	err = s.(objectstore.Versioned).ListVersions(guard(t), "many", func(k, v string) { n++ })
	if err != nil || n != len(files) {
		t.Fatalf("ListVersions of %d objects in 2 slow pages: %d, %v", len(files), n, err)
	}
}
