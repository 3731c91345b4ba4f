package objectstore

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
)

func TestAddrClass(t *testing.T) {
	for addr, want := range map[string]addrClass{
		"127.0.0.1": classLoopback, "127.3.4.5": classLoopback, "::1": classLoopback, "::ffff:127.0.0.1": classLoopback,
		"169.254.169.254": classLinkLocal, "fe80::1": classLinkLocal, "0.0.0.0": classUnspecified, "::": classUnspecified,
		"fd00:ec2::254": classMetadata, "100.100.100.200": classMetadata,
		"10.0.0.1": classOther, "192.168.1.1": classOther, "8.8.8.8": classOther, "2001:db8::1": classOther,
	} {
		if got := classify(netip.MustParseAddr(addr)); got != want {
			t.Errorf("classify(%s) = %v, want %v", addr, got, want)
		}
	}
	for host, want := range map[string]addrClass{
		"localhost": classLoopback, "minio.localhost": classLoopback, "[::1]": classLoopback, "127.0.0.1": classLoopback,
		"169.254.169.254": classLinkLocal, "example.org": classOther, "metadata.google.internal": classOther,
	} {
		if got := hostClass(host); got != want {
			t.Errorf("hostClass(%s) = %v, want %v", host, got, want)
		}
	}
}

// A store whose host is a name connects to no loopback, link-local or
// unspecified address, whatever the name resolves to; a store written as a
// loopback address reaches loopback addresses, and no link-local one.
func TestGuardDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx := context.Background()
	named := &guard{origin: "http://data.example.org", own: classOther, proxies: map[string]bool{}}
	if _, err := named.dialer()(ctx, "tcp", ln.Addr().String()); !errors.Is(err, errForbiddenAddr) || !errors.Is(err, ErrPermission) ||
		!strings.Contains(err.Error(), "127.0.0.1 is a loopback address") {
		t.Errorf("named store dialling loopback: %v, want refused", err)
	}
	// A proxy the environment names is dialled as it is.
	named.proxy(func(*http.Request) (*url.URL, error) { return url.Parse("http://" + ln.Addr().String()) })(&http.Request{})
	if c, err := named.dialer()(ctx, "tcp", ln.Addr().String()); err != nil {
		t.Errorf("dialling the configured proxy: %v", err)
	} else {
		c.Close()
	}
	local := &guard{origin: "http://127.0.0.1:1", own: classLoopback, proxies: map[string]bool{}}
	if c, err := local.dialer()(ctx, "tcp", ln.Addr().String()); err != nil {
		t.Errorf("loopback store dialling loopback: %v", err)
	} else {
		c.Close()
	}
	if err := local.allowed(netip.MustParseAddr("169.254.169.254")); !errors.Is(err, errForbiddenAddr) {
		t.Errorf("loopback store and the metadata address: %v, want refused", err)
	}
}

// recorder is an HTTP server that records what reaches it.
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []string // method path authorization
}

func newRecorder(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) *recorder {
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		rec.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (r *recorder) taken() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

// Redirects stay on the store's origin unless the user allows others, and
// the token never leaves it; a redirect to the metadata address is refused
// whatever its path looks like.
func TestHTTPRedirects(t *testing.T) {
	const token = "secret-bearer-token"
	other := newRecorder(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("other")) })
	src := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/moved":
			http.Redirect(w, r, "/here", http.StatusFound)
		case "/here":
			w.Write([]byte("here"))
		case "/away":
			http.Redirect(w, r, other.URL+"/x", http.StatusFound)
		case "/metadata":
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/iam", http.StatusMovedPermanently)
		case "/metadata6":
			http.Redirect(w, r, "http://[fe80::1]:80/latest", http.StatusTemporaryRedirect)
		}
	})
	ctx := context.Background()
	open := func(cross bool) *HTTP {
		h, err := OpenHTTP(ctx, src.URL, HTTPOptions{BearerToken: token, CrossOriginRedirects: cross})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	h := open(false)
	if b, err := h.Get(ctx, "moved"); err != nil || string(b) != "here" {
		t.Errorf("same-origin redirect: %q, %v", b, err)
	}
	if got := src.taken(); len(got) != 2 || got[1] != "GET /here Bearer "+token {
		t.Errorf("same-origin redirect: requests %q, want the token kept", got)
	}
	_, err := h.Get(ctx, "away")
	if !errors.Is(err, ErrPermission) || IsTransient(err) || !strings.Contains(err.Error(), "redirected to another host") ||
		!strings.Contains(err.Error(), "--http-redirects any") {
		t.Errorf("cross-origin redirect: %v, want a permanent refusal naming the flag", err)
	}
	if got := other.taken(); len(got) != 0 {
		t.Errorf("the other server received %q", got)
	}
	for _, k := range []string{"metadata", "metadata6"} {
		for _, cross := range []bool{false, true} {
			if _, err := open(cross).Get(ctx, k); !errors.Is(err, ErrPermission) || IsTransient(err) {
				t.Errorf("%s (cross-origin %v): %v, want refused", k, cross, err)
			}
		}
	}
	if b, err := open(true).Get(ctx, "away"); err != nil || string(b) != "other" {
		t.Errorf("allowed cross-origin redirect: %q, %v", b, err)
	}
	if got := other.taken(); len(got) != 1 || strings.Contains(got[0], token) || strings.HasSuffix(got[0], " ") == false {
		t.Errorf("allowed cross-origin redirect: the other server saw %q, want no Authorization", got)
	}
}
