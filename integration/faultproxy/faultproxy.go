// Package faultproxy is an HTTP/1.1 proxy on loopback that injects scripted
// faults between a client and a server under test: error statuses (500/503
// bursts, 429 SlowDown), connections reset in the middle of a body, stalls
// longer than the client's timeout, and bodies shorter than their
// Content-Length. It speaks HTTP on raw connections so that it can break
// them exactly where a test asks.
//
// The Host header is forwarded unchanged, so signed (SigV4) requests made to
// the proxy verify at the server. A Proxy is safe for concurrent use; its
// Rule is called from many goroutines.
package faultproxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is a class of fault.
type Kind int

const (
	// Pass forwards the request and its response untouched.
	Pass Kind = iota
	// Status answers with Fault.Status and an S3 XML error of Fault.Code
	// without reaching the server.
	Status
	// Reset sends the response headers and Fault.After body bytes, then
	// resets the connection (RST, not FIN).
	Reset
	// Truncate sends the headers with the full Content-Length and
	// Fault.After body bytes, then closes the connection.
	Truncate
	// Stall sends the headers and Fault.After body bytes, then sends
	// nothing for Fault.StallFor (or until the proxy closes), then closes.
	Stall
	// StallHeaders waits Fault.StallFor before forwarding the request, so
	// the client sees no response headers for that long.
	StallHeaders
)

func (k Kind) String() string {
	return [...]string{"pass", "status", "reset", "truncate", "stall", "stall-headers"}[k]
}

// Fault is what the proxy does with one request.
type Fault struct {
	Kind     Kind
	Status   int           // Status: the HTTP status (default 503)
	Code     string        // Status: the S3 error code (default from Status)
	After    int64         // Reset, Truncate, Stall: body bytes sent first
	StallFor time.Duration // Stall, StallHeaders (default 1 minute)
}

// Rule picks the fault for a request; n counts the requests the proxy has
// seen, from 1.
type Rule func(req *http.Request, n int64) Fault

// Proxy is a running fault-injecting proxy.
type Proxy struct {
	// URL is "http://127.0.0.1:PORT".
	URL string

	target *url.URL
	ln     net.Listener
	tr     *http.Transport
	closed chan struct{}
	wg     sync.WaitGroup

	mu    sync.Mutex
	rule  Rule
	conns map[net.Conn]struct{}

	requests atomic.Int64
	faults   atomic.Int64
}

// New starts a proxy on 127.0.0.1 forwarding to target ("http://host:port").
func New(target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("faultproxy: target must be http://, got %q", u.Scheme)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		URL:    "http://" + ln.Addr().String(),
		target: u,
		ln:     ln,
		tr:     &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64},
		closed: make(chan struct{}),
		conns:  map[net.Conn]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetRule replaces the rule; nil passes everything.
func (p *Proxy) SetRule(r Rule) {
	p.mu.Lock()
	p.rule = r
	p.mu.Unlock()
}

// Requests returns how many requests the proxy has seen.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

// Faults returns how many requests got a fault other than Pass.
func (p *Proxy) Faults() int64 { return p.faults.Load() }

// Close stops the proxy, ends stalls and closes every connection.
func (p *Proxy) Close() error {
	select {
	case <-p.closed:
		return nil
	default:
	}
	close(p.closed)
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.tr.CloseIdleConnections()
	return err
}

// Sequence returns a rule that gives the requests matching match (all when
// nil) the faults in order, one each, and passes everything after them.
func Sequence(match func(*http.Request) bool, faults ...Fault) Rule {
	var mu sync.Mutex
	i := 0
	return func(req *http.Request, _ int64) Fault {
		if match != nil && !match(req) {
			return Fault{}
		}
		mu.Lock()
		defer mu.Unlock()
		if i >= len(faults) {
			return Fault{}
		}
		i++
		return faults[i-1]
	}
}

// Every returns a rule that gives every n-th request matching match (all
// when nil) a fault, cycling through faults in order, and passes the
// others: a source that fails now and then in assorted ways.
func Every(n int64, match func(*http.Request) bool, faults ...Fault) Rule {
	var seen atomic.Int64
	return func(req *http.Request, _ int64) Fault {
		if match != nil && !match(req) {
			return Fault{}
		}
		if i := seen.Add(1); i%n == 0 {
			return faults[(i/n-1)%int64(len(faults))]
		}
		return Fault{}
	}
}

// Always returns a rule that gives every request matching match the fault.
func Always(match func(*http.Request) bool, f Fault) Rule {
	return func(req *http.Request, _ int64) Fault {
		if match != nil && !match(req) {
			return Fault{}
		}
		return f
	}
}

// ObjectGets matches GETs of objects (not bucket-level requests such as a
// listing or a location lookup, nor metadata requests) for path-style URLs
// "/bucket/key", and media downloads of the GCS JSON API
// ("/storage/v1/b/bucket/o/key?alt=media").
func ObjectGets(req *http.Request) bool {
	if req.Method != http.MethodGet {
		return false
	}
	path := req.URL.Path
	if strings.HasPrefix(path, "/storage/v1/b/") {
		return strings.Contains(path, "/o/") && req.URL.Query().Get("alt") == "media"
	}
	if req.URL.RawQuery != "" {
		return false
	}
	if len(path) < 2 {
		return false
	}
	i := strings.IndexByte(path[1:], '/')
	return i > 0 && i < len(path)-2
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(c)
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
			c.Close()
		}()
	}
}

func (p *Proxy) pick(req *http.Request) Fault {
	n := p.requests.Add(1)
	p.mu.Lock()
	r := p.rule
	p.mu.Unlock()
	if r == nil {
		return Fault{}
	}
	f := r(req, n)
	if f.Kind != Pass {
		p.faults.Add(1)
	}
	return f
}

// serve handles the requests of one client connection in turn.
func (p *Proxy) serve(c net.Conn) {
	br := bufio.NewReader(c)
	bw := bufio.NewWriterSize(c, 64<<10)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return
		}
		f := p.pick(req)
		if !p.handle(c, bw, req, body, f) {
			return
		}
	}
}

// handle answers one request; it reports whether the connection may serve
// another.
func (p *Proxy) handle(c net.Conn, bw *bufio.Writer, req *http.Request, body []byte, f Fault) bool {
	switch f.Kind {
	case Status:
		status := f.Status
		if status == 0 {
			status = http.StatusServiceUnavailable
		}
		code := f.Code
		if code == "" {
			code = map[int]string{500: "InternalError", 503: "ServiceUnavailable", 429: "SlowDown"}[status]
		}
		msg := fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
			`<Error><Code>%s</Code><Message>injected fault</Message><Resource>%s</Resource><RequestId>faultproxy</RequestId></Error>`,
			code, req.URL.Path)
		fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s",
			status, http.StatusText(status), len(msg), msg)
		return bw.Flush() == nil
	case StallHeaders:
		if !p.sleep(f.StallFor) {
			return false
		}
	}

	out, err := http.NewRequest(req.Method, p.target.Scheme+"://"+p.target.Host+req.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return false
	}
	out.Header = req.Header.Clone()
	out.Host = req.Host // the client signed this host
	out.ContentLength = int64(len(body))
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		msg := "faultproxy: " + err.Error()
		fmt.Fprintf(bw, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
		bw.Flush()
		return false
	}
	defer resp.Body.Close()

	h := resp.Header.Clone()
	h.Del("Content-Length")
	h.Del("Transfer-Encoding")
	h.Del("Connection")
	keep := resp.ContentLength >= 0 && req.Method != http.MethodHead
	fmt.Fprintf(bw, "HTTP/1.1 %s\r\n", resp.Status)
	h.Write(bw)
	if resp.ContentLength >= 0 {
		fmt.Fprintf(bw, "Content-Length: %d\r\n", resp.ContentLength)
	} else {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
	if req.Method == http.MethodHead {
		return bw.Flush() == nil
	}

	switch f.Kind {
	case Reset, Truncate, Stall:
		io.CopyN(bw, resp.Body, f.After)
		if err := bw.Flush(); err != nil {
			return false
		}
		switch f.Kind {
		case Reset:
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // close sends RST
			}
		case Stall:
			p.sleep(f.StallFor)
		}
		return false
	}
	if _, err := io.Copy(bw, resp.Body); err != nil {
		return false
	}
	return bw.Flush() == nil && keep
}

// sleep waits d (default 1 minute), or less if the proxy closes; it reports
// whether the proxy is still open.
func (p *Proxy) sleep(d time.Duration) bool {
	if d <= 0 {
		d = time.Minute
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.closed:
		return false
	}
}
