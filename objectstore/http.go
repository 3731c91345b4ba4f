package objectstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Defaults for HTTPOptions zero values.
const (
	DefaultHTTPRequestTimeout = 30 * time.Second
	DefaultHTTPMaxInFlight    = 64
)

// HTTPOptions configures OpenHTTP. Every zero value means a documented
// default; negative values are refused.
type HTTPOptions struct {
	// BearerToken, when set, is sent as "Authorization: Bearer TOKEN" with
	// every request to the store's own origin (scheme, host and port), and
	// never on a redirect to another. It is never logged and never part of
	// an error.
	BearerToken string
	// TokenSource names where BearerToken came from, for the one line that
	// says a server refused it ("ZARRFS_HTTP_BEARER_TOKEN"). "": "the
	// bearer token".
	TokenSource string
	// Logger receives one debug line per request; nil: discard.
	Logger *slog.Logger
	// RequestTimeout is how long a request may make no progress: until its
	// response headers arrive, and between any two reads of its body (see
	// S3Options.RequestTimeout). 0: DefaultHTTPRequestTimeout (30s).
	RequestTimeout time.Duration
	// MaxInFlight bounds the requests in flight at once. 0:
	// DefaultHTTPMaxInFlight (64).
	MaxInFlight int
	// CrossOriginRedirects follows redirects to another scheme, host or
	// port (a mirror handing out its CDN's URL), without the bearer token.
	// false: a redirect leaves the store's origin only as an error
	// (httpguard.go).
	CrossOriginRedirects bool
	// Transport replaces the tuned HTTP transport (tests); nil: the
	// default, which connects to a loopback, link-local or unspecified
	// address only when the store's own host is written as one.
	Transport http.RoundTripper
}

// HTTP is a read-only Store over a Zarr store served by a web server at a
// base URL: a key is a path below it. A web server cannot list, so List and
// ListVersions fail with ErrNoListing and the store's tree must come from
// consolidated metadata (zarr.Open says so when there is none). Ranges are
// read with Range requests, the shard index at the end with a suffix range;
// a server that ignores Range and answers 200 is read past the bytes before
// the range and cut at its end.
//
// Versions are the response's ETag, else its Last-Modified with the
// object's size (one-second resolution: a rewrite of the same size within
// the same second is not noticed), else "unversioned" (the server tells
// nothing: a rewrite is not noticed at all; Validators says which kind a
// server gave). A read reports the version of its own response, and
// StatVersion asks one with a HEAD request.
//
// It is safe for concurrent use; at most MaxInFlight requests run at once.
// Errors are classified at the source: 404 and 410 are ErrNotFound, 401
// and 403 are ErrPermission, 416 is ErrRange, 5xx, 429, 408, transport
// failures, truncated bodies and stalls are Transient. Wrap it with
// WithRetry.
type HTTP struct {
	remote
	base    string // scheme://host[:port]/path, no trailing slash
	client  *http.Client
	token   string
	tokenOf string

	sawETag, sawModified, sawNone atomic.Bool
}

var (
	_ Store         = (*HTTP)(nil)
	_ GetterInto    = (*HTTP)(nil)
	_ Versioned     = (*HTTP)(nil)
	_ VersionStater = (*HTTP)(nil)
	_ QueueingStore = (*HTTP)(nil)
	_ Prober        = (*HTTP)(nil)
)

// ParseHTTPURL checks an http:// or https:// store URL and returns it
// without a trailing slash. Credentials, queries and fragments are
// refused (a signed query would be a secret in every log line and cache
// key), without repeating the URL.
func ParseHTTPURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("not a valid URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("not an http:// or https:// URL")
	}
	if u.User != nil {
		return "", fmt.Errorf("an http URL must not hold credentials; use a bearer token")
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return "", fmt.Errorf("%s://%s%s: query and fragment are not supported (a signed query is a secret; use a bearer token)", u.Scheme, u.Host, u.EscapedPath())
	}
	if u.Host == "" {
		return "", fmt.Errorf("%s: no host", raw)
	}
	p := strings.Trim(u.Path, "/")
	if p != "" {
		c, err := CleanKey(p, false)
		if err != nil {
			return "", fmt.Errorf("%s: bad path: %w", raw, err)
		}
		p = "/" + c
	}
	return u.Scheme + "://" + u.Host + (&url.URL{Path: p}).EscapedPath(), nil
}

// OpenHTTP opens the store at rawURL. It sends no request.
func OpenHTTP(ctx context.Context, rawURL string, opts HTTPOptions) (*HTTP, error) {
	base, err := ParseHTTPURL(rawURL)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout, inflight, err := requestLimits("HTTPOptions", opts.RequestTimeout, DefaultHTTPRequestTimeout, opts.MaxInFlight, DefaultHTTPMaxInFlight)
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(base) // parsed by ParseHTTPURL
	g := &guard{origin: origin(u), own: hostClass(u.Hostname()), crossOrigin: opts.CrossOriginRedirects, proxies: map[string]bool{}}
	tr := opts.Transport
	if tr == nil {
		t := newTransport(inflight, timeout)
		t.Proxy = g.proxy(t.Proxy)
		t.DialContext = g.dialer()
		tr = t
	}
	h := &HTTP{
		remote:  remote{id: base, log: log.With("store", base), timeout: timeout, slots: NewSlots(inflight), tr: tr},
		base:    base,
		client:  &http.Client{Transport: tr, CheckRedirect: g.checkRedirect},
		token:   opts.BearerToken,
		tokenOf: cmp.Or(opts.TokenSource, "the bearer token"),
	}
	h.read = h.fetch
	h.log.Debug("http store opened", "bearer_token", opts.BearerToken != "", "max_in_flight", inflight, "request_timeout", timeout)
	return h, nil
}

// Validators says which kinds of version the server's responses carried
// so far: "etag", "last-modified", "none", joined by "+" when they
// differed, "" before any response.
func (h *HTTP) Validators() string {
	var kinds []string
	if h.sawETag.Load() {
		kinds = append(kinds, "etag")
	}
	if h.sawModified.Load() {
		kinds = append(kinds, "last-modified")
	}
	if h.sawNone.Load() {
		kinds = append(kinds, "none")
	}
	return strings.Join(kinds, "+")
}

func (h *HTTP) url(k string) string {
	if k == "" {
		return h.base + "/"
	}
	return h.base + "/" + (&url.URL{Path: k}).EscapedPath()
}

// List fails: a web server cannot list.
func (h *HTTP) List(ctx context.Context, prefix string) ([]string, error) {
	k, err := CleanKey(prefix, true)
	if err != nil {
		return nil, &Error{Op: "list", Store: h.id, Key: prefix, Err: err}
	}
	return nil, &Error{Op: "list", Store: h.id, Key: k, Err: ErrNoListing}
}

// ListVersions fails: a web server cannot list.
func (h *HTTP) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	_, err := h.List(ctx, prefix)
	return err
}

// StatVersion asks the version of the object at key with a HEAD request.
func (h *HTTP) StatVersion(ctx context.Context, key string) (string, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return "", &Error{Op: "stat", Store: h.id, Key: key, Err: err}
	}
	_, v, err := h.stat(ctx, k)
	if err != nil {
		return "", &Error{Op: "stat", Store: h.id, Key: k, Err: err}
	}
	return v, nil
}

// Probe asks the server whether it answers at all (the breaker's probe of
// a store it cannot list): any HTTP response is an answer.
func (h *HTTP) Probe(ctx context.Context) error {
	a, resp, err := h.do(ctx, http.MethodHead, "", "")
	if err != nil {
		return err
	}
	resp.Body.Close()
	a.end()
	return nil
}

// version names the object state a response describes, of an object of
// size bytes. Last-Modified has a resolution of one second, so a rewrite
// within the second it was read would keep it: the size joins it, and a
// rewrite must then keep both the second and the length to go unnoticed.
// The size is asked when a response does not tell it (responseVersion,
// stat), so that every request about one object state names it alike; only
// an object whose size the server tells in no response (no Content-Length
// on HEAD, no total in Content-Range) is versioned by its Last-Modified
// alone (size -1).
func (h *HTTP) version(hdr http.Header, size int64) string {
	if et := hdr.Get("ETag"); et != "" {
		h.sawETag.Store(true)
		return "etag:" + et
	}
	if lm := hdr.Get("Last-Modified"); lm != "" {
		h.sawModified.Store(true)
		if size >= 0 {
			return "modified:" + lm + "+" + strconv.FormatInt(size, 10)
		}
		return "modified:" + lm
	}
	h.sawNone.Store(true)
	return "unversioned"
}

// do sends one request (remote.start: after taking a slot, with the stall
// timer armed); the caller reads the body, re-arming the timer through
// progressReader, and ends the attempt. On an error the attempt has ended.
func (h *HTTP) do(ctx context.Context, method, k, rng string) (*attempt, *http.Response, error) {
	a, err := h.start(ctx)
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequestWithContext(a.ctx, method, h.url(k), nil)
	if err != nil {
		a.end()
		return nil, nil, err
	}
	req.Header.Set("Accept-Encoding", "identity")
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		a.end()
		return nil, nil, h.transportError(ctx, a.stalled(), err)
	}
	resp.Body = progressReader{resp.Body, a}
	if err := h.statusError(method, resp); err != nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		a.end()
		return nil, nil, err
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		resp.Body.Close()
		a.end()
		return nil, nil, fmt.Errorf("server sent the object with Content-Encoding %q, not its stored bytes", ce)
	}
	return a, resp, nil
}

// errDirectory is a redirect from a key to the same path with a slash
// added: the key names a directory of the server (whose index page is no
// object), which is what a missing object is to a store.
var errDirectory = errors.New("a directory, not an object")

// transportError classifies a request that got no response.
func (h *HTTP) transportError(parent context.Context, timedOut bool, err error) error {
	if perr := parent.Err(); perr != nil {
		return perr
	}
	if timedOut {
		return Transient(fmt.Errorf("request stalled: no response for %v: %w", h.timeout, context.DeadlineExceeded))
	}
	if errors.Is(err, errDirectory) {
		return fmt.Errorf("%w: %w", ErrNotFound, errDirectory)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the URL is in the Error already
	}
	if errors.Is(err, errCrossOrigin) || errors.Is(err, errForbiddenAddr) {
		return err // the guard's refusal: the same request is refused again
	}
	return Transient(err)
}

// errNoHead is a server refusing HEAD requests (405, 501).
var errNoHead = errors.New("server does not answer HEAD requests")

// statusError classifies a response that is not 200 or 206.
func (h *HTTP) statusError(method string, resp *http.Response) error {
	s := resp.StatusCode
	if s == http.StatusOK || s == http.StatusPartialContent {
		return nil
	}
	desc := statusDesc(s)
	switch {
	case s == http.StatusNotFound || s == http.StatusGone:
		return ErrNotFound
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		if h.token != "" {
			return fmt.Errorf("%w (%s: the server refused %s; it may have expired)", ErrPermission, desc, h.tokenOf)
		}
		return fmt.Errorf("%w (%s: the server wants credentials; set %s)", ErrPermission, desc, h.tokenOf)
	case method == http.MethodHead && (s == http.StatusMethodNotAllowed || s == http.StatusNotImplemented):
		return fmt.Errorf("%w (%s)", errNoHead, desc)
	}
	return statusClass(s, desc)
}

// stat asks an object's size and version with HEAD, or, from a server
// that does not allow HEAD or does not tell the size in its answer, with
// a GET of its first byte.
func (h *HTTP) stat(ctx context.Context, k string) (int64, string, error) {
	size, hdr, err := h.statHeader(ctx, k)
	if err != nil {
		return 0, "", err
	}
	if hdr == nil {
		return size, "unversioned", nil
	}
	return size, h.version(hdr, size), nil
}

// statHeader is stat's request: the object's size (-1 when no answer
// tells it) and the header of the answer, nil for an empty object.
func (h *HTTP) statHeader(ctx context.Context, k string) (int64, http.Header, error) {
	a, resp, err := h.do(ctx, http.MethodHead, k, "")
	if errors.Is(err, errNoHead) {
		return h.statByGet(ctx, k)
	}
	if err != nil {
		return 0, nil, err
	}
	resp.Body.Close()
	a.end() // before another request: one slot at a time
	if resp.ContentLength < 0 && needsSize(resp.Header) {
		return h.statByGet(ctx, k)
	}
	return resp.ContentLength, resp.Header, nil
}

func (h *HTTP) statByGet(ctx context.Context, k string) (int64, http.Header, error) {
	a, resp, err := h.do(ctx, http.MethodGet, k, "bytes=0-0")
	if errors.Is(err, ErrRange) {
		return 0, nil, nil // an empty object: nothing to range over
	}
	if err != nil {
		return 0, nil, err
	}
	defer a.end()
	defer resp.Body.Close()
	total := resp.ContentLength
	if resp.StatusCode == http.StatusPartialContent {
		_, _, t, err := parseContentRange(resp.Header.Get("Content-Range"))
		if err != nil {
			return 0, nil, Transient(fmt.Errorf("bad Content-Range %q: %w", resp.Header.Get("Content-Range"), err))
		}
		total = t
	}
	return total, resp.Header, nil
}

// httpContentRange is checkContentRange that also takes a Content-Range
// of unknown complete length ("bytes 0-9/*"): the range is checked as if
// the object ended where it does, and the total is -1 (responseVersion
// asks it).
func httpContentRange(cr string, off, length, want int64) (int64, int64, error) {
	rng, ok := strings.CutSuffix(cr, "/*")
	_, b, _ := strings.Cut(rng, "-")
	last, err := strconv.ParseInt(b, 10, 64)
	if !ok || err != nil || last < 0 || last == math.MaxInt64 {
		return checkContentRange(cr, off, length, want)
	}
	off, _, err = checkContentRange(rng+"/"+strconv.FormatInt(last+1, 10), off, length, want)
	return off, -1, err
}

// needsSize reports whether the version of a response with header hdr
// names the object's size: a Last-Modified without an ETag.
func needsSize(hdr http.Header) bool {
	return hdr.Get("ETag") == "" && hdr.Get("Last-Modified") != ""
}

// responseVersion is the version of a GET's response of header hdr, of
// an object of size bytes (-1: the response did not tell, as a range of a
// Content-Range of unknown length or a chunked body does): the size is
// then asked (stat), so that the version is the one a response that tells
// it names. An answer of another Last-Modified means the object changed
// between the two requests: a transient error, the read is tried again.
func (h *HTTP) responseVersion(ctx context.Context, k string, hdr http.Header, size int64) (string, error) {
	if size < 0 && needsSize(hdr) {
		n, shdr, err := h.statHeader(ctx, k)
		if err != nil {
			return "", err
		}
		if lm := hdr.Get("Last-Modified"); shdr == nil || !needsSize(shdr) || shdr.Get("Last-Modified") != lm {
			return "", Transient(fmt.Errorf("object changed while read: Last-Modified %q, then another answer", lm))
		}
		size = n
	}
	return h.version(hdr, size), nil
}

// fetch reads a whole object or a range, and the version of the response.
func (h *HTTP) fetch(ctx context.Context, k string, off, length int64, ranged bool, into []byte, limit int64) ([]byte, string, error) {
	if ranged && length == 0 {
		// HTTP cannot ask for zero bytes; check existence and bounds instead.
		size, v, err := h.stat(ctx, k)
		if err != nil {
			return nil, "", err
		}
		if size >= 0 && off > size {
			return nil, "", fmt.Errorf("%w: offset %d, size %d", ErrRange, off, size)
		}
		return []byte{}, v, nil
	}
	buf, hdr, total, err := h.get(ctx, k, off, length, ranged, into, limit)
	if err != nil {
		return nil, "", err
	}
	// After the GET's slot is given back: the version may ask the size.
	version, err := h.responseVersion(ctx, k, hdr, total)
	if err != nil {
		return nil, "", err
	}
	return buf, version, nil
}

// get is fetch's GET: the bytes, the response's header and the object's
// size (-1: the response did not tell).
func (h *HTTP) get(ctx context.Context, k string, off, length int64, ranged bool, into []byte, limit int64) ([]byte, http.Header, int64, error) {
	rng := ""
	if ranged {
		if off < 0 {
			rng = "bytes=-" + strconv.FormatInt(length, 10)
		} else {
			rng = "bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(off+length-1, 10)
		}
	}
	start := time.Now()
	a, resp, err := h.do(ctx, http.MethodGet, k, rng)
	if err != nil {
		h.log.Debug("http get failed", "key", k, "off", off, "length", length, "err", err)
		return nil, nil, 0, err
	}
	defer a.end()
	defer resp.Body.Close()
	body := resp.Body
	// want: the bytes this response must carry (-1: a chunked body without
	// Content-Length, whose terminator tells a complete body from a cut
	// one); total: the object's size (-1 unknown); skip: bytes of the body
	// before the ones asked (a server that ignored Range sends them all).
	want, total, skip := resp.ContentLength, int64(-1), int64(0)
	partial := resp.StatusCode == http.StatusPartialContent
	switch {
	case ranged && partial:
		if off, total, err = httpContentRange(resp.Header.Get("Content-Range"), off, length, want); err != nil {
			return nil, nil, 0, err
		}
		want = length
	case partial:
		return nil, nil, 0, Transient(errors.New("server answered a request for the whole object with 206 Partial Content"))
	case ranged: // 200: Range ignored, the whole object follows
		total = want
		if total >= 0 {
			if off < 0 {
				off = total - length
			}
			if off < 0 || off+length > total {
				return nil, nil, 0, fmt.Errorf("%w: %d+%d, size %d", ErrRange, off, length, total)
			}
		}
		if off >= 0 {
			// Read past what comes before the range, and stop at its end:
			// the object is never held whole.
			if n, err := io.CopyN(io.Discard, body, off); err != nil {
				if err == io.EOF && total < 0 {
					return nil, nil, 0, fmt.Errorf("%w: offset %d, object of %d bytes", ErrRange, off, n)
				}
				return nil, nil, 0, bodyError(ctx, a, err, n, off)
			}
			skip, want = off, length
			if total < 0 {
				want = -1 // read up to length bytes; a clean end before them is ErrRange
			}
		}
	default:
		total = want
		// The object is read whole: refuse one larger than the caller
		// expects before allocating for it.
		if err := checkSize(limit, want); err != nil {
			return nil, nil, 0, err
		}
	}
	var buf []byte
	if ranged && want < 0 {
		// A 200 of unknown length (chunked): a clean end of the body
		// (err == nil) before the range's end means the object is shorter;
		// a cut body is an error of its own.
		most := length
		if off < 0 {
			most = SizeLimit(limit) + 1 // a suffix needs the whole to find its tail
		}
		buf, err = io.ReadAll(io.LimitReader(body, most))
		n := int64(len(buf))
		switch {
		case err != nil:
			return nil, nil, 0, bodyError(ctx, a, err, n, want)
		case off < 0 && n > SizeLimit(limit):
			return nil, nil, 0, checkSize(limit, n)
		case n < length:
			return nil, nil, 0, fmt.Errorf("%w: %d+%d, object of %d bytes", ErrRange, skip, length, skip+n)
		}
	} else if buf, err = readBody(ctx, a, body, want, into, limit); err != nil {
		return nil, nil, 0, err
	}
	if ranged && !partial && off < 0 {
		// A suffix of a 200: the tail of the whole object.
		if int64(len(buf)) < length {
			return nil, nil, 0, fmt.Errorf("%w: last %d bytes of %d", ErrRange, length, len(buf))
		}
		buf = buf[int64(len(buf))-length:]
	}
	if !ranged && total < 0 {
		total = int64(len(buf)) // a whole body of no announced length
	}
	h.log.Debug("http get", "key", k, "off", off, "length", length, "bytes", len(buf), "status", resp.StatusCode, "dur", time.Since(start))
	return buf, resp.Header, total, nil
}
