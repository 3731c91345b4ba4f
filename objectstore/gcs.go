package objectstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
	gcsapi "google.golang.org/api/storage/v1"
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
	// (https://storage.googleapis.com/storage/v1/), or EmulatorHost's
	// emulator when it is set; "http://host:port" for an emulator or a
	// private endpoint ("/storage/v1/" is added when the URL has no path).
	// Reads, listings and metadata all go to it.
	Endpoint string
	// EmulatorHost is the emulator that the environment's
	// STORAGE_EMULATOR_HOST names ("host:port" or a URL), as the Cloud
	// Storage SDKs read it; the caller passes it. It applies when
	// Endpoint is "".
	EmulatorHost string
	// Anonymous sends unauthenticated requests (public buckets). Without
	// it Application Default Credentials are required, except against the
	// emulator of EmulatorHost, which takes none.
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
// prefix, read through the JSON API with Google's generated REST client
// (google.golang.org/api/storage/v1) rather than the Cloud Storage SDK,
// which links its gRPC path (grpc, xds, OpenTelemetry) into every binary
// whether used or not, and re-reads a body that broke off behind the retry
// layer's back. The REST client sends one request per call and retries
// nothing. GCS is safe for concurrent use; at most MaxInFlight requests
// run at once and further callers wait (respecting their context).
//
// Versions are object generations, which every read response carries
// (x-goog-generation): a chunk's version costs no request of its own when
// it is read, one small metadata request when it is asked alone
// (StatVersion), and a listing reports them for a thousand objects per
// request. A read is one request, so the bytes and the generation it
// returns belong to one state of the object, never to two.
//
// Errors are classified at the source: a missing object is ErrNotFound,
// 401 and 403 are ErrPermission, 5xx, 429, 408, transport failures,
// truncated bodies, CRC32C mismatches and stalls are Transient. Retries
// are the caller's: wrap the store with WithRetry.
type GCS struct {
	remote
	svc      *gcsapi.Service
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
		if h := strings.TrimSpace(opts.EmulatorHost); h != "" {
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
	rt := base
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
	// The client gets the HTTP client whole, so that requests go through
	// the tuned transport and credentials are the ones checked above: with
	// it, the client's own authentication options (WithoutAuthentication,
	// WithCredentials) do nothing, and anonymous means no oauth2 layer.
	copts := []option.ClientOption{option.WithHTTPClient(&http.Client{Transport: rt})}
	if ep != "" {
		copts = append(copts, option.WithEndpoint(ep))
	}
	// The client retries nothing (the retry decorator owns retries,
	// budgets and logging; a second hidden loop here would multiply
	// attempts and hide faults).
	svc, err := gcsapi.NewService(ctx, copts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	g := &GCS{
		remote:   remote{id: id, log: log.With("store", id), timeout: timeout, slots: NewSlots(inflight), tr: base},
		svc:      svc,
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
		creds, err = google.FindDefaultCredentials(tctx, gcsapi.DevstorageReadOnlyScope)
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

// Close releases the idle connections kept for reuse.
func (g *GCS) Close() error { return g.remote.Close() }

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
	obj, err := g.stat(ctx, k)
	if err != nil {
		return "", &Error{Op: "stat", Store: g.id, Key: k, Err: err}
	}
	return gcsVersion(obj.Generation), nil
}

func (g *GCS) stat(ctx context.Context, k string) (*gcsapi.Object, error) {
	a, err := g.start(ctx)
	if err != nil {
		return nil, err
	}
	defer a.end()
	obj, err := g.svc.Objects.Get(g.bucket, g.objectName(k)).Fields("size", "generation").Context(a.ctx).Do()
	if err != nil {
		return nil, g.classify(ctx, a.stalled(), false, err)
	}
	return obj, nil
}

// fetch reads a whole object or a range, and the generation of the
// response, with one request.
func (g *GCS) fetch(ctx context.Context, k string, off, length int64, ranged bool, into []byte, limit int64) ([]byte, string, error) {
	if ranged && length == 0 {
		// HTTP cannot ask for zero bytes; check existence and bounds instead.
		obj, err := g.stat(ctx, k)
		if err != nil {
			return nil, "", err
		}
		if size := int64(obj.Size); off > size {
			return nil, "", fmt.Errorf("%w: offset %d, size %d", ErrRange, off, size)
		}
		return []byte{}, gcsVersion(obj.Generation), nil
	}
	a, err := g.start(ctx)
	if err != nil {
		return nil, "", err
	}
	defer a.end()
	start := time.Now()
	call := g.svc.Objects.Get(g.bucket, g.objectName(k))
	if ranged {
		call.Header().Set("Range", byteRange(off, length))
	}
	res, err := call.Context(a.ctx).Download()
	if err != nil {
		err = g.classify(ctx, a.stalled(), false, err)
		g.log.Debug("gcs get failed", "key", k, "off", off, "length", length, "err", err)
		return nil, "", err
	}
	defer res.Body.Close()
	gen, err := strconv.ParseInt(res.Header.Get("X-Goog-Generation"), 10, 64)
	if err != nil {
		return nil, "", fmt.Errorf("response carries no object generation (x-goog-generation %q)", oneLine(res.Header.Get("X-Goog-Generation"), 32))
	}
	buf, err := g.readResponse(ctx, a, res, off, length, ranged, into, limit)
	if err != nil {
		return nil, "", err
	}
	g.log.Debug("gcs get", "key", k, "off", off, "length", length, "bytes", len(buf), "generation", gen, "dur", time.Since(start))
	return buf, gcsVersion(gen), nil
}

// byteRange is the Range header of length bytes at off (off < 0: the last
// length bytes).
func byteRange(off, length int64) string {
	if off < 0 {
		return "bytes=-" + strconv.FormatInt(length, 10)
	}
	return "bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(off+length-1, 10)
}

// readResponse reads the body of a read response and returns the bytes
// asked for: a 206's range checked against the request, or, from a whole
// object (a server that ignored Range, or one serving the object
// decompressed, which ignores it too), the range cut out of it.
func (g *GCS) readResponse(ctx context.Context, a *attempt, res *http.Response, off, length int64, ranged bool, into []byte, limit int64) ([]byte, error) {
	// Served decompressed (stored gzip-encoded): only the end of the body
	// tells its length, and the stored CRC32C is of other bytes.
	decompressed := res.Uncompressed ||
		(res.Header.Get("X-Goog-Stored-Content-Encoding") == "gzip" && res.Header.Get("Content-Encoding") != "gzip")
	want := res.ContentLength
	if decompressed {
		want = -1
	}
	partial := res.StatusCode == http.StatusPartialContent
	switch {
	case ranged && partial:
		if _, _, err := checkContentRange(res.Header.Get("Content-Range"), off, length, want); err != nil {
			return nil, err
		}
		want = length
	case partial:
		return nil, Transient(errors.New("server answered a request for the whole object with 206 Partial Content"))
	case ranged && want >= 0:
		if _, err := cutRange(want, off, length); err != nil {
			return nil, err
		}
	}
	if !partial {
		// The object is read whole: refuse one larger than the caller
		// expects before allocating for it.
		if err := checkSize(limit, want); err != nil {
			return nil, err
		}
	}
	var body io.Reader = progressReader{res.Body, a}
	if sum, ok := storedCRC32C(res.Header); ok && !partial && !decompressed {
		body = &crcReader{r: body, want: sum}
	}
	buf, err := readBody(ctx, a, body, want, into, limit)
	if err != nil {
		return nil, err
	}
	if want >= 0 {
		// Read to the end of the body, where crcReader compares.
		var one [1]byte
		if m, err := body.Read(one[:]); m > 0 {
			return nil, bodyError(ctx, a, fmt.Errorf("body longer than its announced %d bytes", want), want, want)
		} else if err != nil && err != io.EOF {
			return nil, bodyError(ctx, a, err, want, want)
		}
	}
	if ranged && !partial {
		from, err := cutRange(int64(len(buf)), off, length)
		if err != nil {
			return nil, err
		}
		buf = buf[from : from+length]
	}
	return buf, nil
}

// cutRange returns where length bytes at off (off < 0: the last length
// bytes) start in an object of size bytes, or ErrRange.
func cutRange(size, off, length int64) (int64, error) {
	if off < 0 {
		if size < length {
			return 0, fmt.Errorf("%w: last %d bytes of %d", ErrRange, length, size)
		}
		return size - length, nil
	}
	if off+length > size {
		return 0, fmt.Errorf("%w: %d+%d, size %d", ErrRange, off, length, size)
	}
	return off, nil
}

// castagnoli is the CRC32C table of GCS's object checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// storedCRC32C returns the CRC32C of the stored object that a read
// response carries in x-goog-hash ("crc32c=BASE64,md5=BASE64", or one
// header per hash).
func storedCRC32C(h http.Header) (uint32, bool) {
	for _, v := range h.Values("X-Goog-Hash") {
		for _, f := range strings.Split(v, ",") {
			b64, ok := strings.CutPrefix(strings.TrimSpace(f), "crc32c=")
			if !ok {
				continue
			}
			b, err := base64.StdEncoding.DecodeString(b64)
			if err != nil || len(b) != 4 {
				return 0, false
			}
			return binary.BigEndian.Uint32(b), true
		}
	}
	return 0, false
}

// crcReader computes the CRC32C of a whole object's body as it is read and
// fails its end when it is not the stored one: bytes changed on the way
// are never returned as data.
type crcReader struct {
	r    io.Reader
	want uint32
	got  uint32
}

func (c *crcReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.got = crc32.Update(c.got, castagnoli, p[:n])
	if err == io.EOF && c.got != c.want {
		return n, fmt.Errorf("CRC32C of the body %08x, of the object %08x", c.got, c.want)
	}
	return n, err
}

// classify turns a client or transport error into the package's classes.
// parent is the caller's context; timedOut says our own request timer
// fired; listing says the request was a listing, whose 404 can only mean
// the bucket.
func (g *GCS) classify(parent context.Context, timedOut, listing bool, err error) error {
	if perr := parent.Err(); perr != nil {
		return perr // the caller gave up: neither transient nor ours to report
	}
	if timedOut {
		return Transient(fmt.Errorf("request stalled: no response for %v: %w", g.timeout, context.DeadlineExceeded))
	}
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		if re.Response != nil && re.Response.StatusCode >= 400 && re.Response.StatusCode < 500 {
			return fmt.Errorf("%w: credentials rejected (%s)", ErrPermission, tokenErrorKind(err))
		}
		return Transient(fmt.Errorf("no token: %s", tokenErrorKind(err)))
	}
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		// Transport failures: refused or reset connections, unexpected
		// EOF, a listing page cut off, TLS and DNS hiccups.
		return Transient(err)
	}
	status, msg, code := ge.Code, ge.Message, xmlCode(ge.Body)
	if msg == "" {
		msg = jsonMessage(ge.Body) // a media download's error is not parsed by the client
	}
	switch {
	case status == http.StatusNotFound && (listing || code == "NoSuchBucket" || strings.Contains(msg, "bucket does not exist")):
		// A missing bucket is not a missing chunk: reading it as fill
		// values would silently turn a typo into zeros.
		return fmt.Errorf("bucket %q does not exist", g.bucket)
	case status == http.StatusNotFound:
		return ErrNotFound
	}
	desc := statusDesc(status)
	if msg != "" {
		desc += ": " + oneLine(msg, 200)
	} else if code != "" {
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

// xmlCode returns the <Code> of an XML API error document (what an
// endpoint or proxy speaking the XML API answers).
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

// jsonMessage returns the message of a JSON API error document.
func jsonMessage(doc string) string {
	var d struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(doc), &d) != nil {
		return ""
	}
	return d.Error.Message
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
	add := func(name string) {
		name = strings.TrimPrefix(name, p)
		if name == "" || name == "/" {
			return // a "directory marker" object some tools create
		}
		names = append(names, name)
	}
	call := g.svc.Objects.List(g.bucket).Prefix(p).Delimiter("/").Fields("items(name)", "prefixes", "nextPageToken")
	err = g.listing(ctx, call, func(page *gcsapi.Objects) {
		for _, sub := range page.Prefixes {
			add(sub)
		}
		for _, o := range page.Items {
			add(o.Name)
		}
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
	call := g.svc.Objects.List(g.bucket).Prefix(p).Fields("items(name,generation)", "nextPageToken")
	err = g.listing(ctx, call, func(page *gcsapi.Objects) {
		for _, o := range page.Items {
			key := strings.TrimPrefix(o.Name, base)
			if key == "" || strings.HasSuffix(key, "/") {
				continue // "directory marker" objects
			}
			fn(key, gcsVersion(o.Generation))
		}
	})
	if err != nil {
		return &Error{Op: "list", Store: g.id, Key: k, Err: err}
	}
	return nil
}

// listing runs one listing, a request per page, calling fn per page. The
// request timer is re-armed by every page received, so a long listing
// that keeps flowing is never cut off.
func (g *GCS) listing(ctx context.Context, call *gcsapi.ObjectsListCall, fn func(*gcsapi.Objects)) error {
	a, err := g.start(ctx)
	if err != nil {
		return err
	}
	defer a.end()
	err = call.Pages(a.ctx, func(page *gcsapi.Objects) error {
		a.progress()
		fn(page)
		return nil
	})
	if err != nil {
		return g.classify(ctx, a.stalled(), true, err)
	}
	return ctx.Err()
}
