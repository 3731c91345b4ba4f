package objectstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// What an HTTP store may reach. A store's URL is the user's choice, but
// what it serves is not: a redirect, or a name whose DNS answer changes,
// would otherwise send requests (and the bearer token) wherever the server
// says. So a store follows redirects only to its own origin (scheme, host
// and port) unless CrossOriginRedirects is set, never sends the token to
// another origin, and never connects to a loopback, link-local (the cloud
// metadata address among them) or unspecified address unless its own host
// is written as one.

// addrClass is the kind of address a connection goes to.
type addrClass int

const (
	classOther addrClass = iota
	classLoopback
	classLinkLocal // 169.254.0.0/16 (169.254.169.254: cloud metadata), fe80::/10
	classUnspecified
	classMetadata // metadata addresses outside link-local ranges
)

func (c addrClass) String() string {
	switch c {
	case classLoopback:
		return "a loopback address"
	case classLinkLocal:
		return "a link-local address (cloud metadata lives there)"
	case classUnspecified:
		return "an unspecified address"
	case classMetadata:
		return "a cloud metadata address"
	}
	return "an address"
}

// metadataAddrs are instance-metadata services outside the link-local
// ranges: AWS's over IPv6 and Alibaba Cloud's.
var metadataAddrs = []netip.Addr{netip.MustParseAddr("fd00:ec2::254"), netip.MustParseAddr("100.100.100.200")}

func classify(ip netip.Addr) addrClass {
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		return classLoopback
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return classLinkLocal
	case ip.IsUnspecified():
		return classUnspecified
	}
	for _, m := range metadataAddrs {
		if ip == m {
			return classMetadata
		}
	}
	return classOther
}

// hostClass is the class a store's own host is written in: an address's
// own, loopback for "localhost" and names below it, other for any other
// name (which may resolve anywhere, so it earns no exception).
func hostClass(host string) addrClass {
	h := strings.ToLower(strings.Trim(host, "[]"))
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return classLoopback
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		return classify(ip)
	}
	return classOther
}

// origin is the scheme, host and port of u, lower case, the default port
// dropped: what a redirect must keep to stay with the store.
func origin(u *url.URL) string {
	s, host := strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	if port := u.Port(); (s == "https" && port == "443") || (s == "http" && port == "80") {
		host = strings.TrimSuffix(host, ":"+port)
	}
	return s + "://" + host
}

// guard is one store's rule for where its connections and redirects may
// go.
type guard struct {
	origin      string    // the store's own
	own         addrClass // the class its host is written in
	crossOrigin bool      // follow redirects to other origins (without the token)

	mu      sync.Mutex
	proxies map[string]bool // host:port of proxies the environment names, dialled as they are
}

// errForbiddenAddr is a connection the guard refused.
var errForbiddenAddr = errors.New("refused")

func (g *guard) allowed(ip netip.Addr) error {
	c := classify(ip)
	if c == classOther || c == g.own {
		return nil
	}
	return fmt.Errorf("%w (%w): %s is %s, which a store reaches only when its URL names one", ErrPermission, errForbiddenAddr, ip.Unmap(), c)
}

// proxy wraps the transport's proxy function to remember the proxies
// requests go through: a proxy the user configured is dialled whatever its
// address, and decides itself where the request goes.
func (g *guard) proxy(next func(*http.Request) (*url.URL, error)) func(*http.Request) (*url.URL, error) {
	return func(req *http.Request) (*url.URL, error) {
		u, err := next(req)
		if u != nil && err == nil {
			g.mu.Lock()
			g.proxies[canonicalAddr(u)] = true
			g.mu.Unlock()
		}
		return u, err
	}
}

// canonicalAddr is host:port of a proxy URL, its scheme's port by default.
func canonicalAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "https":
			port = "443"
		case "socks5", "socks5h":
			port = "1080"
		default:
			port = "80"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// dialer returns the transport's DialContext: a proxy is dialled as it
// is, any other address only when allowed, checked on the address the
// connection is made to (after DNS), so that a name cannot be turned into a
// forbidden address between a check and the connection.
func (g *guard) dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	plain := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	checked := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w (%w): %s: not an address", ErrPermission, errForbiddenAddr, address)
			}
			return g.allowed(ap.Addr())
		}}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		g.mu.Lock()
		viaProxy := g.proxies[addr]
		g.mu.Unlock()
		if viaProxy {
			return plain.DialContext(ctx, network, addr)
		}
		return checked.DialContext(ctx, network, addr)
	}
}

// errCrossOrigin is a redirect to another origin, not followed.
var errCrossOrigin = errors.New("redirected to another host")

// checkRedirect follows redirects (mirrors hand out their CDN's URL), at
// most ten: to the store's own origin only, unless cross-origin redirects
// are allowed, and then never with the bearer token; never into a
// directory.
func (g *guard) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if o := origin(req.URL); o != g.origin {
		if !g.crossOrigin {
			return fmt.Errorf("%w (%w: %s; --http-redirects any follows it)", ErrPermission, errCrossOrigin, redactURL(req.URL))
		}
		// Go's client keeps Authorization on a redirect to a subdomain or
		// another port of the same host; the token is for the origin the
		// user gave.
		req.Header.Del("Authorization")
	}
	if h := req.URL.Hostname(); hostClass(h) != classOther && hostClass(h) != g.own {
		return fmt.Errorf("%w (%w: %s is %s)", ErrPermission, errForbiddenAddr, redactURL(req.URL), hostClass(h))
	}
	prev := via[len(via)-1].URL.Path
	if strings.HasSuffix(req.URL.Path, "/") && !strings.HasSuffix(prev, "/") {
		return errDirectory
	}
	return nil
}

// redactURL is u without credentials, query or fragment, for messages.
func redactURL(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.Fragment = nil, "", ""
	return c.String()
}
