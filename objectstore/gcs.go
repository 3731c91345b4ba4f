package objectstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/storage"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
)

// Defaults for GCSOptions zero values.
const (
	DefaultGCSRequestTimeout = 30 * time.Second
	DefaultGCSMaxInFlight    = 64
)

// ErrNoGoogleCredentials is returned by OpenGCS when Application Default
// Credentials find nothing and anonymous access was not asked for. As for
// S3, zarrfs never falls back to anonymous access on its own.
var ErrNoGoogleCredentials = errors.New("no Google credentials found")

// GCSOptions configures OpenGCS. Every zero value means a documented
// default; negative values are refused.
type GCSOptions struct {
	// Endpoint is the JSON API endpoint: "" for Google
	// (https://storage.googleapis.com/storage/v1/), or the emulator that
	// STORAGE_EMULATOR_HOST names when it is set; "http://host:port" for an
	// emulator or a private endpoint ("/storage/v1/" is added when the URL
	// has no path). Objects are read through the XML API of the same host.
	Endpoint string
	// Anonymous sends unauthenticated requests (public buckets). Without
	// it Application Default Credentials are required, except against the
	// emulator of STORAGE_EMULATOR_HOST, which takes none.
	Anonymous bool
	// Credentials overrides Application Default Credentials
	// (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default file,
	// the metadata server). nil: those.
	Credentials *google.Credentials
	// Logger receives one debug line per request and warnings; nil:
	// discard. Tokens and keys are never logged.
	Logger *slog.Logger
	// RequestTimeout is how long a request may make no progress: until its
	// response headers arrive, and between any two reads of its body (see
	// S3Options.RequestTimeout). Listings get it between two objects
	// received. 0: DefaultGCSRequestTimeout (30s).
	RequestTimeout time.Duration
	// MaxInFlight bounds the requests in flight at once. 0:
	// DefaultGCSMaxInFlight (64).
	MaxInFlight int
	// Transport replaces the tuned HTTP transport (tests); nil: the default.
	Transport http.RoundTripper
}

// GCS is a Store over the objects of a Google Cloud Storage bucket below a
// prefix, read with cloud.google.com/go/storage. It is safe for concurrent
// use; at most MaxInFlight requests run at once and further callers wait
// (respecting their context).
//
// Versions are object generations, which every read response carries
// (x-goog-generation): a chunk's version costs no request of its own when
// it is read, one small metadata request when it is asked alone
// (StatVersion), and a listing reports them for a thousand objects per
// request.
//
// Errors are classified at the source: a missing object is ErrNotFound,
// 401 and 403 are ErrPermission, 5xx, 429, 408, transport failures,
// truncated bodies, checksum mismatches and stalls are Transient. The
// client's own retries, and its silent re-reading of a body that broke
// off, are turned off: wrap the store with WithRetry.
type GCS struct {
	remote
	client   *storage.Client
	bkt      *storage.BucketHandle
	bucket   string
	prefix   string // "" or "dir/sub", no slashes at either end
	endpoint string // scheme://host[:port] of a non-default endpoint, part of Identity
}

var (
	_ Store         = (*GCS)(nil)
	_ GetterInto    = (*GCS)(nil)
	_ Identifier    = (*GCS)(nil)
	_ Versioned     = (*GCS)(nil)
	_ VersionStater = (*GCS)(nil)
	_ QueueingStore = (*GCS)(nil)
)

// ParseGSURL splits "gs://bucket/prefix" into bucket and prefix (without
// slashes at either end).
func ParseGSURL(raw string) (bucket, prefix string, err error) {
	return parseBucketURL(raw, "gs", "a gs:// URL", "use Application Default Credentials")
}

// gcsEndpoint turns GCSOptions.Endpoint into the JSON API endpoint and the
// scheme://host that names it in Identity ("" for Google's).
func gcsEndpoint(ep string) (jsonAPI, named string, err error) {
	if ep == "" {
		return "", "", nil
	}
	if !strings.Contains(ep, "://") {
		ep = "https://" + ep
	}
	u, err := url.Parse(ep)
	if err != nil {
		return "", "", fmt.Errorf("gcs endpoint: %w", err)
	}
	if u.User != nil {
		return "", "", fmt.Errorf("gcs endpoint must not hold credentials")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", "", fmt.Errorf("gcs endpoint %q: scheme must be http or https", u.Redacted())
	}
	if u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("gcs endpoint %q: want scheme://host[:port][/storage/v1/]", u.Redacted())
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/storage/v1/"
	} else if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	return u.String(), u.Scheme + "://" + u.Host, nil
}

// CheckGCSEndpoint reports what is wrong with a GCSOptions.Endpoint value.
func CheckGCSEndpoint(ep string) error {
	_, _, err := gcsEndpoint(ep)
	return err
}

// OpenGCS opens the store at rawURL ("gs://bucket/prefix"). It resolves
// the credentials at once and fetches a first token, so that a missing or
// rejected credential fails here and not on the first read; it sends no
// request to the bucket.
func OpenGCS(ctx context.Context, rawURL string, opts GCSOptions) (*GCS, error) {
	bucket, prefix, err := ParseGSURL(rawURL)
	if err != nil {
		return nil, err
	}
	id := "gs://" + bucket
	if prefix != "" {
		id += "/" + prefix
	}
	ep, named, err := gcsEndpoint(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	emulator := ""
	if ep == "" {
		if h := strings.TrimSpace(os.Getenv("STORAGE_EMULATOR_HOST")); h != "" {
			if !strings.Contains(h, "://") {
				h = "http://" + h
			}
			if ep, named, err = gcsEndpoint(h); err != nil {
				return nil, fmt.Errorf("STORAGE_EMULATOR_HOST: %w", err)
			}
			emulator = named
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout, inflight, err := requestLimits("GCSOptions", opts.RequestTimeout, DefaultGCSRequestTimeout, opts.MaxInFlight, DefaultGCSMaxInFlight)
	if err != nil {
		return nil, err
	}
	base := opts.Transport
	if base == nil {
		base = newTransport(inflight, timeout)
	}
	var rt http.RoundTripper = &gcsTap{base: base}
	source := "anonymous"
	switch {
	case opts.Anonymous:
	case emulator != "":
		source = "none (the emulator of STORAGE_EMULATOR_HOST)"
	default:
		creds, name, err := googleCredentials(ctx, opts.Credentials, timeout)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		source = name
		rt = &oauth2.Transport{Source: creds.TokenSource, Base: rt}
	}
	copts := []option.ClientOption{option.WithHTTPClient(&http.Client{Transport: rt})}
	if ep != "" {
		copts = append(copts, option.WithEndpoint(ep))
	}
	client, err := storage.NewClient(ctx, copts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	// The retry decorator owns retries, budgets and logging; a second
	// hidden loop here would multiply attempts and hide faults.
	client.SetRetry(storage.WithPolicy(storage.RetryNever))
	g := &GCS{
		remote:   remote{id: id, log: log.With("store", id), timeout: timeout, sem: make(chan struct{}, inflight), tr: base},
		client:   client,
		bkt:      client.Bucket(bucket),
		bucket:   bucket,
		prefix:   prefix,
		endpoint: named,
	}
	g.read = g.fetch
	g.log.Debug("gcs store opened", "endpoint", cmp.Or(named, "https://storage.googleapis.com"),
		"credentials", source, "max_in_flight", inflight, "request_timeout", timeout)
	return g, nil
}

// googleCredentials finds Application Default Credentials (or takes the
// given ones) and fetches a token with them, so that what is missing or
// rejected is said once, at open. Errors name the source tried, never a
// key or a token.
func googleCredentials(ctx context.Context, given *google.Credentials, timeout time.Duration) (*google.Credentials, string, error) {
	creds := given
	if creds == nil {
		// Token requests (at open, and every refresh after) are bounded by
		// the request timeout, and outlive the caller's context.
		tctx := context.WithValue(context.WithoutCancel(ctx), oauth2.HTTPClient, &http.Client{Timeout: timeout})
		var err error
		creds, err = google.FindDefaultCredentials(tctx, storage.ScopeReadOnly)
		if err != nil {
			if f := os.Getenv("GOOGLE_APPLICATION_CREDENTIALS"); f != "" {
				var pe *os.PathError
				if errors.As(err, &pe) {
					return nil, "", fmt.Errorf("%w: GOOGLE_APPLICATION_CREDENTIALS names %s: %v", ErrNoGoogleCredentials, f, pe.Err)
				}
				return nil, "", fmt.Errorf("%w: GOOGLE_APPLICATION_CREDENTIALS names %s, which is not a usable credentials file", ErrNoGoogleCredentials, f)
			}
			return nil, "", fmt.Errorf("%w (tried GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default credentials, the metadata server); "+
				"run `gcloud auth application-default login`, or ask for anonymous access to a public bucket", ErrNoGoogleCredentials)
		}
	}
	name := credentialsKind(creds)
	tok, err := creds.TokenSource.Token()
	if err != nil {
		return nil, "", fmt.Errorf("%w: %s credentials gave no token: %s", ErrPermission, name, tokenErrorKind(err))
	}
	if tok.AccessToken == "" {
		return nil, "", fmt.Errorf("%w: %s credentials gave an empty token", ErrNoGoogleCredentials, name)
	}
	return creds, name, nil
}

// credentialsKind names the kind of credentials for logs: the "type" of a
// credentials file, or the metadata server.
func credentialsKind(c *google.Credentials) string {
	if len(c.JSON) == 0 {
		return "metadata server"
	}
	var f struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(c.JSON, &f) != nil || f.Type == "" {
		return "credentials file"
	}
	return f.Type
}

// tokenErrorKind keeps the OAuth error code and description of a token
// request that failed (never a key, which those do not hold), or the
// error's type.
func tokenErrorKind(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		s := "token endpoint answered"
		if re.Response != nil {
			s += " HTTP " + strconv.Itoa(re.Response.StatusCode)
		}
		code, desc := re.ErrorCode, re.ErrorDescription
		if code == "" {
			// Not every flow parses the OAuth error document; its two
			// fields carry no secret.
			var doc struct {
				Error       string `json:"error"`
				Description string `json:"error_description"`
			}
			if json.Unmarshal(re.Body, &doc) == nil {
				code, desc = doc.Error, doc.Description
			}
		}
		if code != "" {
			s += ": " + oneLine(code, 64)
		}
		if desc != "" {
			s += ": " + oneLine(desc, 200)
		}
		return s
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return "token request failed: " + oneLine(ue.Err.Error(), 200)
	}
	return fmt.Sprintf("token source failed (%T)", err)
}

// oneLine squeezes s to one line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// newTransport is the transport of the GCS and HTTP stores: Go's
// defaults, HTTP/2 where the server offers it, tuned as every remote
// store's is (tuneTransport).
func newTransport(inflight int, timeout time.Duration) *http.Transport {
	return tuneTransport(&http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
	}, inflight, timeout)
}

// Close releases the client and the idle connections kept for reuse.
func (g *GCS) Close() error {
	err := g.client.Close()
	g.remote.Close()
	return err
}

// Identity is the ID, with the endpoint when it is not Google's.
func (g *GCS) Identity() string {
	if g.endpoint == "" {
		return g.id
	}
	return g.id + "@" + g.endpoint
}

// ObjectsPerListing is how many objects one listing request returns: an
// array with more chunks than that is cheaper to ask chunk by chunk, as it
// is read, than to list whole (zarr.Hierarchy.List).
func (g *GCS) ObjectsPerListing() int { return 1000 }

func (g *GCS) objectName(k string) string { return joinKey(g.prefix, k) }

// gcsVersion is the version string of an object generation.
func gcsVersion(gen int64) string { return "gen:" + strconv.FormatInt(gen, 10) }

// StatVersion returns the generation of the object at key with one
// metadata request.
func (g *GCS) StatVersion(ctx context.Context, key string) (string, error) {
	k, err := CleanKey(key, false)
	if err != nil {
		return "", &Error{Op: "stat", Store: g.id, Key: key, Err: err}
	}
	attrs, err := g.stat(ctx, k)
	if err != nil {
		return "", &Error{Op: "stat", Store: g.id, Key: k, Err: err}
	}
	return gcsVersion(attrs.Generation), nil
}

// request is what one request of a read is allowed and what it saw: the
// transport (gcsTap) lets one request through per request value, so that
// the client's silent re-reading of a body that broke off never happens
// (the retry layer decides), and records the response and the first
// failure of its body.
type request struct {
	*attempt

	sent   atomic.Bool
	mu     sync.Mutex
	status int
	errDoc string // the start of an error response's body
	body   error  // the first error reading the body
}

type requestKey struct{}

func (r *request) failBody(err error) {
	r.mu.Lock()
	if r.body == nil {
		r.body = err
	}
	r.mu.Unlock()
}

func (r *request) seen() (status int, errDoc string, body error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status, r.errDoc, r.body
}

// errSecondRequest refuses a request the client makes on its own after
// the first one of a read.
var errSecondRequest = errors.New("a second request for one read (the retry layer retries)")

// gcsTap is the transport below the client (and below authentication).
type gcsTap struct{ base http.RoundTripper }

func (t *gcsTap) RoundTrip(req *http.Request) (*http.Response, error) {
	r, _ := req.Context().Value(requestKey{}).(*request)
	if r == nil {
		return t.base.RoundTrip(req)
	}
	if !r.sent.CompareAndSwap(false, true) {
		return nil, errSecondRequest
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.status = resp.StatusCode
	if resp.StatusCode >= 300 {
		// Keep the start of the error document: a missing bucket and a
		// missing object are both 404, told apart by its code.
		doc, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		r.errDoc = string(doc)
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(strings.NewReader(r.errDoc), resp.Body), resp.Body}
	}
	r.mu.Unlock()
	resp.Body = &tapBody{rc: resp.Body, r: r}
	return resp, nil
}

// tapBody re-arms the request's stall timer on every read that returns
// data and keeps the first error.
type tapBody struct {
	rc io.ReadCloser
	r  *request
}

func (b *tapBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.r.progress()
	}
	if err != nil && err != io.EOF {
		b.r.failBody(err)
	}
	return n, err
}

func (b *tapBody) Close() error { return b.rc.Close() }

// firstBodyError reads a body through the client and returns, for an
// error, the first one the transport saw reading it (when it saw one): the
// client, when a body breaks off, tries to read it again, which gcsTap
// refuses, and reports that refusal.
type firstBodyError struct {
	io.Reader
	r *request
}

func (b firstBodyError) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err != nil && err != io.EOF {
		if _, _, berr := b.r.seen(); berr != nil {
			err = berr
		}
	}
	return n, err
}

// begin starts a request (remote.start) that the transport (gcsTap) sees
// and lets through once; the caller ends it.
func (g *GCS) begin(ctx context.Context) (*request, error) {
	a, err := g.start(ctx)
	if err != nil {
		return nil, err
	}
	r := &request{attempt: a}
	r.ctx = context.WithValue(a.ctx, requestKey{}, r)
	return r, nil
}

func (g *GCS) stat(ctx context.Context, k string) (*storage.ObjectAttrs, error) {
	r, err := g.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer r.end()
	attrs, err := g.bkt.Object(g.objectName(k)).Attrs(r.ctx)
	if err != nil {
		return nil, g.classify(ctx, r.stalled(), r, err)
	}
	return attrs, nil
}

// fetch reads a whole object or a range, and the generation of the
// response.
func (g *GCS) fetch(ctx context.Context, k string, off, length int64, ranged bool, into []byte, limit int64) ([]byte, string, error) {
	if ranged && length == 0 {
		// HTTP cannot ask for zero bytes; check existence and bounds instead.
		attrs, err := g.stat(ctx, k)
		if err != nil {
			return nil, "", err
		}
		if off > attrs.Size {
			return nil, "", fmt.Errorf("%w: offset %d, size %d", ErrRange, off, attrs.Size)
		}
		return []byte{}, gcsVersion(attrs.Generation), nil
	}
	r, err := g.begin(ctx)
	if err != nil {
		return nil, "", err
	}
	defer r.end()
	start := time.Now()
	obj := g.bkt.Object(g.objectName(k))
	var rd *storage.Reader
	switch {
	case !ranged:
		rd, err = obj.NewReader(r.ctx)
	case off < 0:
		rd, err = obj.NewRangeReader(r.ctx, -length, -1)
	default:
		rd, err = obj.NewRangeReader(r.ctx, off, length)
	}
	if err != nil {
		err = g.classify(ctx, r.stalled(), r, err)
		g.log.Debug("gcs get failed", "key", k, "off", off, "length", length, "err", err)
		return nil, "", err
	}
	defer rd.Close()
	gen := rd.Attrs.Generation
	size := rd.Attrs.Size // of the whole object, also for a range
	status, _, _ := r.seen()

	// from, want: where the bytes asked for start in the body, and how
	// many the body carries. A server that ignores Range (200) sends the
	// whole object, which is cut here.
	from, want := int64(0), rd.Remain()
	if rd.Attrs.Decompressed {
		want = -1 // served decompressed: only the end of the body tells its length
	}
	if ranged {
		if size >= 0 && !rd.Attrs.Decompressed {
			if off < 0 {
				if size < length {
					return nil, "", fmt.Errorf("%w: last %d bytes of %d", ErrRange, length, size)
				}
				off = size - length
			}
			if off+length > size {
				return nil, "", fmt.Errorf("%w: %d+%d, size %d", ErrRange, off, length, size)
			}
		}
		if status == http.StatusPartialContent {
			if rd.Attrs.StartOffset != off || want != length {
				return nil, "", Transient(fmt.Errorf("server sent %d bytes at %d for %d at %d", want, rd.Attrs.StartOffset, length, off))
			}
		} else if off >= 0 {
			from = off
		}
	}
	if !ranged || status != http.StatusPartialContent {
		// The object is read whole: refuse one larger than the caller
		// expects before allocating for it.
		if err := checkSize(limit, want); err != nil {
			return nil, "", err
		}
	}
	// What broke the body, not the client's attempt to read it again.
	body := firstBodyError{rd, r}
	buf, err := readBody(ctx, r.attempt, body, want, into, limit)
	if err != nil {
		return nil, "", err
	}
	if want >= 0 {
		// The client checks the CRC32C of a whole object at the end of its
		// body: read to it.
		var one [1]byte
		if m, err := body.Read(one[:]); m > 0 {
			return nil, "", bodyError(ctx, r.attempt, fmt.Errorf("body longer than its announced %d bytes", want), want, want)
		} else if err != nil && err != io.EOF {
			return nil, "", bodyError(ctx, r.attempt, err, want, want)
		}
	}
	if ranged && status != http.StatusPartialContent {
		if off < 0 {
			off = int64(len(buf)) - length
			from = off
		}
		if from < 0 || from+length > int64(len(buf)) {
			return nil, "", fmt.Errorf("%w: %d+%d, size %d", ErrRange, from, length, len(buf))
		}
		buf = buf[from : from+length]
	}
	g.log.Debug("gcs get", "key", k, "off", off, "length", length, "bytes", len(buf), "generation", gen, "dur", time.Since(start))
	return buf, gcsVersion(gen), nil
}

// classify turns a client or transport error into the package's classes.
// parent is the caller's context; timedOut says our own request timer
// fired; r is what the transport saw of the request (nil for listings).
func (g *GCS) classify(parent context.Context, timedOut bool, r *request, err error) error {
	if perr := parent.Err(); perr != nil {
		return perr // the caller gave up: neither transient nor ours to report
	}
	if timedOut {
		return Transient(fmt.Errorf("request stalled: no response for %v: %w", g.timeout, context.DeadlineExceeded))
	}
	status, doc := 0, ""
	if r != nil {
		status, doc, _ = r.seen()
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		status = ge.Code
		if ge.Body != "" {
			doc = ge.Body
		}
	}
	var re *oauth2.RetrieveError
	switch {
	case errors.As(err, &re):
		if re.Response != nil && re.Response.StatusCode >= 400 && re.Response.StatusCode < 500 {
			return fmt.Errorf("%w: credentials rejected (%s)", ErrPermission, tokenErrorKind(err))
		}
		return Transient(fmt.Errorf("no token: %s", tokenErrorKind(err)))
	case errors.Is(err, storage.ErrBucketNotExist) || (status == http.StatusNotFound && strings.Contains(doc, "NoSuchBucket")):
		// A missing bucket is not a missing chunk: reading it as fill
		// values would silently turn a typo into zeros.
		return fmt.Errorf("bucket %q does not exist", g.bucket)
	case errors.Is(err, storage.ErrObjectNotExist) || status == http.StatusNotFound:
		return ErrNotFound
	}
	if status == 0 {
		// Transport failures: refused or reset connections, unexpected
		// EOF, TLS and DNS hiccups, a checksum that did not match.
		return Transient(err)
	}
	desc := statusDesc(status)
	if ge != nil && ge.Message != "" {
		desc += ": " + oneLine(ge.Message, 200)
	} else if code := xmlCode(doc); code != "" {
		desc += ": " + code
	}
	switch {
	case status == http.StatusUnauthorized:
		return fmt.Errorf("%w (%s: credentials missing, rejected or expired)", ErrPermission, desc)
	case status == http.StatusForbidden:
		return fmt.Errorf("%w (%s)", ErrPermission, desc)
	}
	return statusClass(status, desc)
}

// xmlCode returns the <Code> of an XML API error document.
func xmlCode(doc string) string {
	_, rest, ok := strings.Cut(doc, "<Code>")
	if !ok {
		return ""
	}
	code, _, ok := strings.Cut(rest, "</Code>")
	if !ok || len(code) > 64 {
		return ""
	}
	return code
}

// List returns the sorted children of prefix with one delimited listing.
// GCS has no empty directories, so a prefix with no children is
// ErrNotFound (except the store root, which may be empty).
func (g *GCS) List(ctx context.Context, prefix string) ([]string, error) {
	k, err := CleanKey(prefix, true)
	if err != nil {
		return nil, &Error{Op: "list", Store: g.id, Key: prefix, Err: err}
	}
	p := g.objectName(k)
	if p != "" {
		p += "/"
	}
	var names []string
	err = g.listing(ctx, &storage.Query{Prefix: p, Delimiter: "/"}, []string{"Name"}, func(a *storage.ObjectAttrs) {
		name := a.Name
		if a.Prefix != "" {
			name = a.Prefix
		}
		name = strings.TrimPrefix(name, p)
		if name == "" || name == "/" {
			return // a "directory marker" object some tools create
		}
		names = append(names, name)
	})
	if err == nil && len(names) == 0 && k != "" {
		err = ErrNotFound
	}
	if err != nil {
		return nil, &Error{Op: "list", Store: g.id, Key: k, Err: err}
	}
	sort.Strings(names)
	return names, nil
}

// ListVersions lists every object below prefix with its generation (one
// request per thousand objects).
func (g *GCS) ListVersions(ctx context.Context, prefix string, fn func(key, version string)) error {
	k, err := CleanKey(prefix, true)
	if err != nil {
		return &Error{Op: "list", Store: g.id, Key: prefix, Err: err}
	}
	p := g.objectName(k)
	if p != "" {
		p += "/"
	}
	base := g.objectName("")
	if base != "" {
		base += "/"
	}
	err = g.listing(ctx, &storage.Query{Prefix: p}, []string{"Name", "Generation"}, func(a *storage.ObjectAttrs) {
		key := strings.TrimPrefix(a.Name, base)
		if key == "" || strings.HasSuffix(key, "/") {
			return // "directory marker" objects
		}
		fn(key, gcsVersion(a.Generation))
	})
	if err != nil {
		return &Error{Op: "list", Store: g.id, Key: k, Err: err}
	}
	return nil
}

// listing runs one listing, calling fn per entry. The request timer is
// re-armed by every entry received, so a long listing that keeps flowing
// is never cut off.
func (g *GCS) listing(ctx context.Context, q *storage.Query, fields []string, fn func(*storage.ObjectAttrs)) error {
	if err := q.SetAttrSelection(fields); err != nil {
		return err
	}
	a, err := g.start(ctx)
	if err != nil {
		return err
	}
	defer a.end()
	it := g.bkt.Objects(a.ctx, q)
	for {
		attrs, err := it.Next()
		if err == iterator.Done {
			break
		}
		if err != nil {
			return g.classify(ctx, a.stalled(), nil, err)
		}
		a.progress()
		fn(attrs)
	}
	return ctx.Err()
}
