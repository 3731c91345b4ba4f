package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestFaults(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789"), 10_000)
	var gotHost string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHost = r.Host
		w.Header().Set("Content-Length", strconv.Itoa(len(payload)))
		w.Write(payload)
	}))
	defer srv.Close()
	p, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	client := &http.Client{Timeout: 2 * time.Second}

	get := func(ctx context.Context) ([]byte, *http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/bucket/key", nil)
		resp, err := client.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return b, resp, err
	}

	tests := []struct {
		name  string
		fault Fault
		check func(t *testing.T, b []byte, resp *http.Response, err error)
	}{
		{"pass", Fault{}, func(t *testing.T, b []byte, resp *http.Response, err error) {
			if err != nil || !bytes.Equal(b, payload) {
				t.Fatalf("pass: %d bytes, %v", len(b), err)
			}
			if !strings.HasPrefix(gotHost, "127.0.0.1:") || gotHost == strings.TrimPrefix(srv.URL, "http://") {
				t.Fatalf("Host forwarded as %q, want the proxy's", gotHost)
			}
		}},
		{"503", Fault{Kind: Status, Status: 503}, func(t *testing.T, b []byte, resp *http.Response, err error) {
			if err != nil || resp.StatusCode != 503 || !bytes.Contains(b, []byte("<Code>ServiceUnavailable</Code>")) {
				t.Fatalf("503: %v %s", err, b)
			}
		}},
		{"429", Fault{Kind: Status, Status: 429}, func(t *testing.T, b []byte, resp *http.Response, err error) {
			if err != nil || resp.StatusCode != 429 || !bytes.Contains(b, []byte("<Code>SlowDown</Code>")) {
				t.Fatalf("429: %v %s", err, b)
			}
		}},
		{"truncate", Fault{Kind: Truncate, After: 1000}, func(t *testing.T, b []byte, resp *http.Response, err error) {
			if !errors.Is(err, io.ErrUnexpectedEOF) || len(b) != 1000 || resp.ContentLength != int64(len(payload)) {
				t.Fatalf("truncate: %d bytes, %v", len(b), err)
			}
		}},
		{"reset", Fault{Kind: Reset, After: 5000}, func(t *testing.T, b []byte, resp *http.Response, err error) {
			if !errors.Is(err, syscall.ECONNRESET) || len(b) > 5000 {
				t.Fatalf("reset: %d bytes, %v", len(b), err)
			}
		}},
		{"stall", Fault{Kind: Stall, After: 10, StallFor: time.Minute}, func(t *testing.T, b []byte, resp *http.Response, err error) {
			if err == nil || len(b) > 10 {
				t.Fatalf("stall: %d bytes, %v; want the client timeout", len(b), err)
			}
		}},
		{"stall headers", Fault{Kind: StallHeaders, StallFor: time.Minute}, func(t *testing.T, b []byte, resp *http.Response, err error) {
			if err == nil {
				t.Fatalf("stall headers: %d bytes; want the client timeout", len(b))
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p.SetRule(Sequence(ObjectGets, tc.fault))
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			b, resp, err := get(ctx)
			tc.check(t, b, resp, err)
			// The next request passes.
			b, _, err = get(context.Background())
			if err != nil || !bytes.Equal(b, payload) {
				t.Fatalf("after the fault: %d bytes, %v", len(b), err)
			}
		})
	}
	if p.Faults() != int64(len(tests)-1) {
		t.Errorf("Faults() = %d, want %d", p.Faults(), len(tests)-1)
	}
}

func TestObjectGets(t *testing.T) {
	for u, want := range map[string]bool{
		"/b/k":            true,
		"/b/a/b/c":        true,
		"/b/":             false,
		"/b":              false,
		"/b/?list-type=2": false,
		"/b?location=":    false,
	} {
		req := httptest.NewRequest(http.MethodGet, u, nil)
		if got := ObjectGets(req); got != want {
			t.Errorf("ObjectGets(%s) = %v, want %v", u, got, want)
		}
	}
}

// Every gives every n-th matching request the next fault of its cycle and
// leaves requests that do not match uncounted.
func TestEvery(t *testing.T) {
	a, b := Fault{Kind: Status, Status: 503}, Fault{Kind: Reset}
	rule := Every(3, ObjectGets, a, b)
	get := httptest.NewRequest(http.MethodGet, "/b/k", nil)
	list := httptest.NewRequest(http.MethodGet, "/b/?list-type=2", nil)
	var got []Fault
	for i := range 12 {
		if f := rule(list, int64(2*i)); f.Kind != Pass {
			t.Fatalf("a request that does not match got %v", f.Kind)
		}
		got = append(got, rule(get, int64(2*i+1)))
	}
	want := []Fault{{}, {}, a, {}, {}, b, {}, {}, a, {}, {}, b}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("matching request %d got %+v, want %+v (all: %+v)", i+1, got[i], want[i], got)
		}
	}
}
