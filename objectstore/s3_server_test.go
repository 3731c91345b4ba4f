package objectstore_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
)

// oddServer answers object GETs for /bucket/obj the way some S3-compatible
// servers (or broken middleboxes) do, to check that the store verifies
// what it receives instead of trusting it.
func oddServer(t *testing.T, data []byte, mode string) *objectstore.S3 {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/bucket/obj" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `<Error><Code>NoSuchKey</Code><Message>no</Message></Error>`)
			return
		}
		rng := r.Header.Get("Range")
		w.Header().Set("Last-Modified", "Mon, 02 Jan 2006 15:04:05 GMT")
		w.Header().Set("ETag", `"0123456789abcdef"`)
		switch mode {
		case "ignore range": // 200 with everything
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.Write(data)
		case "chunked": // no Content-Length, range honoured
			body, first := data, 0
			if rng != "" {
				first, body = applyRange(data, rng)
				w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, first+len(body)-1, len(data)))
				w.WriteHeader(http.StatusPartialContent)
			}
			for len(body) > 0 { // several flushes force chunked encoding
				n := min(len(body), 1000)
				w.Write(body[:n])
				w.(http.Flusher).Flush()
				body = body[n:]
			}
		case "chunked cut": // chunked, then the connection drops mid-body
			w.Write(data[:1000])
			w.(http.Flusher).Flush()
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
		case "wrong range": // answers a different range than asked
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-9/%d", len(data)))
			w.Header().Set("Content-Length", "10")
			w.WriteHeader(http.StatusPartialContent)
			w.Write(data[:10])
		case "short range": // Content-Range right, fewer bytes than asked
			first, body := applyRange(data, rng)
			body = body[:len(body)/2]
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, first+len(body)-1, len(data)))
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(body)
		}
	}))
	t.Cleanup(srv.Close)
	s, err := objectstore.OpenS3(context.Background(), "s3://bucket", objectstore.S3Options{
		Endpoint: srv.URL, Region: "us-east-1", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// applyRange serves "bytes=A-B" and "bytes=-N" (enough for the store's requests).
func applyRange(data []byte, rng string) (int, []byte) {
	spec := strings.TrimPrefix(rng, "bytes=")
	a, b, _ := strings.Cut(spec, "-")
	if a == "" {
		n, _ := strconv.Atoi(b)
		n = min(n, len(data))
		return len(data) - n, data[len(data)-n:]
	}
	first, _ := strconv.Atoi(a)
	last, _ := strconv.Atoi(b)
	last = min(last, len(data)-1)
	return first, data[first : last+1]
}

func TestS3OddServers(t *testing.T) {
	data := make([]byte, 10_000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ctx := context.Background()
	type read struct {
		off, length int64
		whole       bool
	}
	tests := []struct {
		mode    string
		ok      []read
		badRead []read // must fail, transient
	}{
		{"ignore range", []read{{whole: true}, {off: 100, length: 50}, {off: -1, length: 20}}, nil},
		{"chunked", []read{{whole: true}, {off: 100, length: 5000}, {off: -1, length: 20}}, nil},
		{"chunked cut", nil, []read{{whole: true}}},
		{"wrong range", []read{{off: 0, length: 10}}, []read{{off: 5, length: 10}, {off: -1, length: 10}}},
		{"short range", nil, []read{{off: 100, length: 50}, {off: -1, length: 20}}},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			s := oddServer(t, data, tc.mode)
			do := func(r read) ([]byte, []byte, error) {
				if r.whole {
					b, err := s.Get(ctx, "obj")
					return b, data, err
				}
				b, err := s.GetRange(ctx, "obj", r.off, r.length)
				off := r.off
				if off < 0 {
					off = int64(len(data)) - r.length
				}
				return b, data[off : off+r.length], err
			}
			for _, r := range tc.ok {
				got, want, err := do(r)
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("%+v: %d bytes, %v; want %d bytes", r, len(got), err, len(want))
				}
			}
			for _, r := range tc.badRead {
				got, _, err := do(r)
				if err == nil {
					t.Errorf("%+v: returned %d bytes of a bad response", r, len(got))
				} else if t.Logf("%+v: %v", r, err); !objectstore.IsTransient(err) {
					t.Errorf("%+v: err = %v, want transient", r, err)
				}
			}
		})
	}
	// Out of range against a server that ignores Range is still ErrRange.
	s := oddServer(t, data, "ignore range")
	if _, err := s.GetRange(ctx, "obj", 9_990, 20); err == nil || objectstore.IsTransient(err) || objectstore.IsNotFound(err) {
		t.Errorf("range past the end: err = %v", err)
	}
}

// With MaxInFlight 1, requests queue behind each other for longer than the
// retry layer's attempt timeout; none of them is taken for a stall.
func TestS3QueueIsNotAStall(t *testing.T) {
	var inflight, most atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		if n > most.Load() {
			most.Store(n)
		}
		time.Sleep(50 * time.Millisecond)
		w.Header().Set("Last-Modified", "Mon, 02 Jan 2006 15:04:05 GMT")
		w.Header().Set("Content-Length", "4")
		w.Write([]byte("data"))
	}))
	defer srv.Close()
	s, err := objectstore.OpenS3(context.Background(), "s3://bucket", objectstore.S3Options{
		Endpoint: srv.URL, Region: "us-east-1", Anonymous: true, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := must(objectstore.WithRetry(s, objectstore.RetryOptions{MaxAttempts: 1, AttemptTimeout: 400 * time.Millisecond}))
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for range 12 { // the last waits ~550ms for its turn
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.Get(context.Background(), "obj"); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if most.Load() != 1 {
		t.Errorf("%d requests in flight at once, want at most 1", most.Load())
	}
}
