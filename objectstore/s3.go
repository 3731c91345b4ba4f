package objectstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Defaults for S3Options zero values.
const (
	DefaultS3RequestTimeout = 30 * time.Second
	DefaultS3MaxInFlight    = 64
)

// ErrNoCredentials is returned by OpenS3 when no provider of the credential
// chain has credentials and anonymous access was not asked for. zarrfs never
// falls back to anonymous access on its own: a missing credential would
// otherwise surface much later as a confusing 403, or, worse, as a public
// bucket read under the wrong identity.
var ErrNoCredentials = errors.New("no S3 credentials found")

// S3Options configures OpenS3. Every zero value means a documented default.
type S3Options struct {
	// Endpoint is the S3 service: "" for AWS (s3.amazonaws.com over HTTPS),
	// "http://host:port" for an on-prem MinIO, "https://host[:port]", or a
	// bare "host[:port]" (HTTPS).
	Endpoint string
	// Region of the bucket; "" lets the client ask the server once.
	Region string
	// Anonymous sends unsigned requests (public buckets). Without it a
	// credential is required.
	Anonymous bool
	// Credentials overrides the default chain (environment, AWS_PROFILE with
	// the shared credentials file, instance or container role). nil: the
	// default chain. The value must yield a key unless Anonymous is set.
	Credentials *credentials.Credentials
	// Logger receives one debug line per request and warnings; nil: discard.
	// Credentials are never logged.
	Logger *slog.Logger
	// RequestTimeout is how long a request may make no progress: until its
	// response headers arrive, and between any two reads of its body. A
	// stalled connection ends as a transient error; a large object that
	// keeps flowing is not cut off (the retry layer's AttemptTimeout bounds
	// the whole). Listings get it between two objects received.
	// 0: DefaultS3RequestTimeout (30s).
	RequestTimeout time.Duration
	// MaxInFlight bounds the requests in flight at once; the HTTP transport
	// keeps as many idle connections to reuse. 0: DefaultS3MaxInFlight (64).
	MaxInFlight int
	// Transport replaces the tuned HTTP transport (tests); nil: the default.
	Transport http.RoundTripper
}

// S3 is a Store over the objects of an S3 bucket below a prefix, read with
// minio-go. It is safe for concurrent use; at most MaxInFlight requests run
// at once and further callers wait (respecting their context).
//
// Errors are classified at the source: NoSuchKey is ErrNotFound, 403 is
// ErrPermission, 5xx, throttling, transport failures, truncated bodies and
// request timeouts are Transient. S3 does not retry by itself; wrap it with
// WithRetry.
type S3 struct {
	remote
	client   *minio.Client
	bucket   string
	prefix   string // "" or "dir/sub", no slashes at either end
	endpoint string // scheme://host[:port], part of Identity
}

var (
	_ Store         = (*S3)(nil)
	_ GetterInto    = (*S3)(nil)
	_ Identifier    = (*S3)(nil)
	_ QueueingStore = (*S3)(nil)
)

// ParseS3URL splits "s3://bucket/prefix" into bucket and prefix (without
// slashes at either end). Credentials in the URL are refused, without
// repeating the URL in the error.
func ParseS3URL(raw string) (bucket, prefix string, err error) {
	return parseBucketURL(raw, "s3", "an s3:// URL", "use the environment or a profile")
}

// parseBucketURL splits "SCHEME://bucket/prefix" (what names such a URL in
// errors) into bucket and prefix (without slashes at either end), refusing
// credentials in the URL (the error says where they belong instead, hint,
// and never repeats the URL), queries, fragments and prefixes that leave
// the bucket.
func parseBucketURL(raw, scheme, what, hint string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(raw, scheme+"://")
	if !ok {
		return "", "", fmt.Errorf("not %s", what)
	}
	host, p, _ := strings.Cut(rest, "/")
	if strings.Contains(host, "@") {
		// Never echo: the part before "@" may be a secret.
		return "", "", fmt.Errorf("%s URL must not hold credentials; %s", scheme, hint)
	}
	if host == "" {
		return "", "", fmt.Errorf("%s: no bucket", raw)
	}
	if strings.ContainsAny(rest, "?#") {
		return "", "", fmt.Errorf("%s: query and fragment are not supported", raw)
	}
	p = strings.Trim(p, "/")
	if p != "" {
		c, err := CleanKey(p, false)
		if err != nil {
			return "", "", fmt.Errorf("%s: bad prefix: %w", raw, err)
		}
		p = c
	}
	return host, p, nil
}

// joinKey is the object name of key k below prefix (either may be "").
func joinKey(prefix, k string) string {
	switch {
	case prefix == "":
		return k
	case k == "":
		return prefix
	}
	return prefix + "/" + k
}

// parseEndpoint turns S3Options.Endpoint into minio-go's host and secure flag.
func parseEndpoint(ep string) (host string, secure bool, err error) {
	if ep == "" {
		return "s3.amazonaws.com", true, nil
	}
	if !strings.Contains(ep, "://") {
		ep = "https://" + ep
	}
	u, err := url.Parse(ep)
	if err != nil {
		return "", false, fmt.Errorf("s3 endpoint: %w", err)
	}
	if u.User != nil {
		return "", false, fmt.Errorf("s3 endpoint must not hold credentials")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", false, fmt.Errorf("s3 endpoint %q: scheme must be http or https", u.Redacted())
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", false, fmt.Errorf("s3 endpoint %q: want scheme://host[:port]", u.Redacted())
	}
	return u.Host, u.Scheme == "https", nil
}

// CheckEndpoint reports what is wrong with an S3Options.Endpoint value.
func CheckEndpoint(ep string) error {
	_, _, err := parseEndpoint(ep)
	return err
}

// OpenS3 opens the store at rawURL ("s3://bucket/prefix"). It resolves the
// credentials at once, so a missing credential fails here and not on the
// first read; it sends no request to the bucket.
func OpenS3(ctx context.Context, rawURL string, opts S3Options) (*S3, error) {
	bucket, prefix, err := ParseS3URL(rawURL)
	if err != nil {
		return nil, err
	}
	host, secure, err := parseEndpoint(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout, inflight, err := requestLimits("S3Options", opts.RequestTimeout, DefaultS3RequestTimeout, opts.MaxInFlight, DefaultS3MaxInFlight)
	if err != nil {
		return nil, err
	}
	id := "s3://" + bucket
	if prefix != "" {
		id += "/" + prefix
	}

	creds, source, err := resolveCredentials(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	tr := opts.Transport
	if tr == nil {
		tr = newS3Transport(secure, inflight, timeout)
	}
	client, err := minio.New(host, &minio.Options{
		Creds:     creds,
		Secure:    secure,
		Region:    opts.Region,
		Transport: tr,
		// The retry decorator owns retries, budgets and logging; a second
		// hidden retry loop here would multiply attempts and hide faults.
		// (minio-go still sleeps up to DefaultRetryUnit, 200ms, after a
		// retryable status before returning it; that adds to our backoff.)
		MaxRetries: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	s := &S3{
		remote:   remote{id: id, log: log.With("store", id), timeout: timeout, slots: NewSlots(inflight), tr: tr},
		client:   client,
		bucket:   bucket,
		prefix:   prefix,
		endpoint: (&url.URL{Scheme: map[bool]string{true: "https", false: "http"}[secure], Host: host}).String(),
	}
	s.read = s.fetch
	s.log.Debug("s3 store opened", "endpoint", s.endpoint,
		"region", opts.Region, "credentials", source, "max_in_flight", inflight, "request_timeout", timeout)
	return s, nil
}

// newS3Transport is minio-go's transport (TLS settings of its own) tuned
// as every remote store's is (tuneTransport).
func newS3Transport(secure bool, inflight int, timeout time.Duration) *http.Transport {
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		tr = &http.Transport{Proxy: http.ProxyFromEnvironment}
	}
	return tuneTransport(tr, inflight, timeout)
}

// tuneTransport tunes a remote store's transport for many concurrent reads
// from one host: as many idle connections kept per host as requests may be
// in flight, so a steady stream of range GETs reuses connections instead
// of dialling and handshaking each time; the response headers bounded by
// the request timeout; no transparent gzip (lengths must match).
func tuneTransport(tr *http.Transport, inflight int, timeout time.Duration) *http.Transport {
	tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.MaxIdleConns = max(2*inflight, 100)
	tr.MaxIdleConnsPerHost = inflight
	tr.IdleConnTimeout = 90 * time.Second
	tr.ResponseHeaderTimeout = timeout
	tr.ExpectContinueTimeout = time.Second
	tr.DisableCompression = true
	tr.ReadBufferSize = 128 << 10
	tr.WriteBufferSize = 32 << 10
	return tr
}

// resolveCredentials returns the credentials to sign with and a name of
// their source for the log (never the key itself).
func resolveCredentials(ctx context.Context, opts S3Options) (*credentials.Credentials, string, error) {
	if opts.Anonymous {
		return credentials.NewStatic("", "", "", credentials.SignatureAnonymous), "anonymous", nil
	}
	creds := opts.Credentials
	var chain *strictChain
	if creds == nil {
		chain = defaultChain()
		creds = credentials.New(chain)
	}
	v, err := creds.GetWithContext(&credentials.CredContext{Client: &http.Client{Timeout: 5 * time.Second}, Context: ctx})
	if err != nil {
		if errors.Is(err, ErrNoCredentials) {
			return nil, "", err
		}
		// Provider errors may quote configuration files; keep only the class.
		return nil, "", fmt.Errorf("%w: %s", ErrNoCredentials, redactedKind(err))
	}
	if v.AccessKeyID == "" || v.SecretAccessKey == "" {
		return nil, "", fmt.Errorf("%w: the credential provider returned an empty key", ErrNoCredentials)
	}
	source := "given"
	if chain != nil {
		source = chain.currName
	}
	return creds, source, nil
}

func redactedKind(err error) string {
	return fmt.Sprintf("credential provider failed (%T)", err)
}

// strictChain is minio-go's Chain without its last step: when no provider
// has a key it fails instead of signing nothing. Errors name the providers
// tried, never a file's contents.
type strictChain struct {
	providers []namedProvider
	curr      credentials.Provider
	currName  string
}

type namedProvider struct {
	name string
	p    credentials.Provider
	// required: a failure is an error, not a reason to try the next one
	// (an explicitly named AWS_PROFILE that cannot be read).
	required bool
}

func defaultChain() *strictChain {
	c := &strictChain{}
	c.providers = append(c.providers, namedProvider{name: "environment (AWS_ACCESS_KEY_ID)", p: &credentials.EnvAWS{}})
	profile := os.Getenv("AWS_PROFILE")
	c.providers = append(c.providers, namedProvider{
		name:     fmt.Sprintf("shared credentials file (profile %q)", cmp.Or(profile, "default")),
		p:        &credentials.FileAWSCredentials{},
		required: profile != "",
	})
	container := os.Getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI") != "" ||
		os.Getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") != "" ||
		os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE") != ""
	if container || !strings.EqualFold(os.Getenv("AWS_EC2_METADATA_DISABLED"), "true") {
		c.providers = append(c.providers, namedProvider{name: "instance or container role", p: &credentials.IAM{}})
	}
	return c
}

func (c *strictChain) Retrieve() (credentials.Value, error) {
	return c.RetrieveWithCredContext(nil)
}

func (c *strictChain) RetrieveWithCredContext(cc *credentials.CredContext) (credentials.Value, error) {
	var tried []string
	for _, np := range c.providers {
		v, err := np.p.RetrieveWithCredContext(cc)
		if err == nil && v.AccessKeyID != "" && v.SecretAccessKey != "" {
			c.curr, c.currName = np.p, np.name
			return v, nil
		}
		if np.required {
			return credentials.Value{}, fmt.Errorf("%w: %s has no usable key", ErrNoCredentials, np.name)
		}
		tried = append(tried, np.name)
	}
	c.curr = nil
	return credentials.Value{}, fmt.Errorf("%w (tried %s); set credentials or ask for anonymous access",
		ErrNoCredentials, strings.Join(tried, ", "))
}

func (c *strictChain) IsExpired() bool {
	if c.curr == nil {
		return true
	}
	return c.curr.IsExpired()
}

// Identity is the ID with the endpoint: the same bucket on two endpoints
// is two sources.
func (s *S3) Identity() string { return s.id + "@" + s.endpoint }

func (s *S3) objectKey(k string) string { return joinKey(s.prefix, k) }

// requestLimits applies the defaults of a remote store's RequestTimeout
// and MaxInFlight (named by what, its options type) to their zero values;
// a negative value is refused, not turned into the default.
func requestLimits(what string, timeout, defTimeout time.Duration, inflight, defInflight int) (time.Duration, int, error) {
	if timeout < 0 || inflight < 0 {
		return 0, 0, fmt.Errorf("objectstore: %s request timeout %v, max in flight %d: want 0 (the default) or more", what, timeout, inflight)
	}
	return cmp.Or(timeout, defTimeout), cmp.Or(inflight, defInflight), nil
}

// classify turns a minio-go or transport error into the package's classes.
// parent is the caller's context; timedOut says our own request timer fired.
func (s *S3) classify(parent context.Context, timedOut bool, err error) error {
	if perr := parent.Err(); perr != nil {
		return perr // the caller gave up: neither transient nor ours to report
	}
	if timedOut {
		return Transient(fmt.Errorf("request stalled: no response for %v: %w", s.timeout, context.DeadlineExceeded))
	}
	var er minio.ErrorResponse
	if !errors.As(err, &er) {
		// Transport failures: refused or reset connections, unexpected EOF,
		// TLS and DNS hiccups. Only a response can tell us the request
		// itself was wrong, so these are worth another attempt.
		return Transient(err)
	}
	desc := er.Code
	if er.Message != "" {
		desc += ": " + er.Message
	}
	if er.StatusCode != 0 {
		desc = fmt.Sprintf("HTTP %d %s", er.StatusCode, desc)
	}
	switch {
	case er.Code == "NoSuchKey" || (er.StatusCode == http.StatusNotFound && er.Code != "NoSuchBucket"):
		return ErrNotFound
	case er.Code == "NoSuchBucket":
		// A missing bucket is not a missing chunk: reading it as fill
		// values would silently turn a typo into zeros.
		return fmt.Errorf("bucket %q does not exist (%s)", s.bucket, desc)
	case er.StatusCode == http.StatusForbidden || er.Code == "AccessDenied" ||
		er.Code == "InvalidAccessKeyId" || er.Code == "SignatureDoesNotMatch":
		return fmt.Errorf("%w (%s)", ErrPermission, desc)
	case er.Code == "InvalidRange":
		return fmt.Errorf("%w (%s)", ErrRange, desc)
	case er.Code == "SlowDown" || er.Code == "RequestTimeout" || er.Code == "InternalError" ||
		er.Code == "ServiceUnavailable":
		return Transient(errors.New(desc))
	}
	return statusClass(er.StatusCode, desc)
}

// fetch reads a whole object or a range, and the ETag of the response,
// verifying the body's length against Content-Length and, for a range, its
// Content-Range.
func (s *S3) fetch(ctx context.Context, k string, off, length int64, ranged bool, into []byte, limit int64) ([]byte, string, error) {
	a, err := s.start(ctx)
	if err != nil {
		return nil, "", err
	}
	defer a.end()
	rctx := a.ctx
	start := time.Now()
	obj := s.objectKey(k)

	if ranged && length == 0 {
		// HTTP cannot ask for zero bytes; check existence and bounds instead.
		info, err := s.client.StatObject(rctx, s.bucket, obj, minio.StatObjectOptions{})
		if err != nil {
			return nil, "", s.classify(ctx, a.stalled(), err)
		}
		if off > info.Size {
			return nil, "", fmt.Errorf("%w: offset %d, size %d", ErrRange, off, info.Size)
		}
		return []byte{}, s3Version(info.ETag), nil
	}

	var gopts minio.GetObjectOptions
	if ranged {
		var err error
		if off < 0 {
			err = gopts.SetRange(0, -length)
		} else {
			err = gopts.SetRange(off, off+length-1)
		}
		if err != nil {
			return nil, "", err
		}
	}
	body, info, hdr, err := minio.Core{Client: s.client}.GetObject(rctx, s.bucket, obj, gopts)
	if err != nil {
		err = s.classify(ctx, a.stalled(), err)
		s.log.Debug("s3 get failed", "key", k, "off", off, "length", length, "err", err)
		return nil, "", err
	}
	defer body.Close()
	body = progressReader{body, a}

	// want: the bytes this response must carry (-1: a chunked body without
	// Content-Length, whose terminator still tells a complete body from a
	// cut one). whole: the body is the entire object, either because that
	// was asked or because the server ignored Range and answered 200.
	want := info.Size
	whole := !ranged
	if ranged {
		if cr := hdr.Get("Content-Range"); cr == "" {
			whole = true
		} else {
			if off, _, err = checkContentRange(cr, off, length, want); err != nil {
				return nil, "", err
			}
			want = length
		}
	}
	if whole {
		// The object is read whole: refuse one larger than the caller
		// expects before allocating for it.
		if err := checkSize(limit, want); err != nil {
			return nil, "", err
		}
	}
	buf, err := readBody(ctx, a, body, want, into, limit)
	if err != nil {
		return nil, "", err
	}
	if ranged && whole {
		size := int64(len(buf))
		if off < 0 {
			off = size - length
		}
		if off < 0 || off+length > size {
			return nil, "", fmt.Errorf("%w: %d+%d, size %d", ErrRange, off, length, size)
		}
		buf = buf[off : off+length]
	}
	s.log.Debug("s3 get", "key", k, "off", off, "length", length, "bytes", len(buf), "dur", time.Since(start))
	return buf, s3Version(info.ETag), nil
}

// parseContentRange parses "bytes FIRST-LAST/TOTAL".
func parseContentRange(s string) (first, last, total int64, err error) {
	rest, ok := strings.CutPrefix(s, "bytes ")
	if !ok {
		return 0, 0, 0, errors.New("not a byte range")
	}
	rng, tot, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, 0, errors.New("no total")
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, 0, errors.New("no dash")
	}
	if first, err = strconv.ParseInt(a, 10, 64); err != nil {
		return
	}
	if last, err = strconv.ParseInt(b, 10, 64); err != nil {
		return
	}
	if total, err = strconv.ParseInt(tot, 10, 64); err != nil {
		return
	}
	if first < 0 || last < first || total <= last {
		return 0, 0, 0, errors.New("inconsistent")
	}
	return first, last, total, nil
}

// List returns the sorted children of prefix with one delimited listing. S3
// has no empty directories, so a prefix with no children is ErrNotFound
// (except the store root, which may be empty).
func (s *S3) List(ctx context.Context, prefix string) ([]string, error) {
	k, err := CleanKey(prefix, true)
	if err != nil {
		return nil, &Error{Op: "list", Store: s.id, Key: prefix, Err: err}
	}
	names, err := s.list(ctx, k)
	if err != nil {
		return nil, &Error{Op: "list", Store: s.id, Key: k, Err: err}
	}
	return names, nil
}

// listVersions lists every object below k recursively.
func (s *S3) listVersions(ctx context.Context, k string, fn func(key, version string)) error {
	base := s.objectKey("")
	if base != "" {
		base += "/"
	}
	return s.listing(ctx, k, true, func(obj minio.ObjectInfo) {
		key := strings.TrimPrefix(obj.Key, base)
		if key == "" || strings.HasSuffix(key, "/") {
			return // "directory marker" objects
		}
		fn(key, s3Version(obj.ETag))
	})
}

func (s *S3) list(ctx context.Context, k string) ([]string, error) {
	p := s.objectKey(k)
	if p != "" {
		p += "/"
	}
	var names []string
	err := s.listing(ctx, k, false, func(obj minio.ObjectInfo) {
		name := strings.TrimPrefix(obj.Key, p)
		if name == "" || name == "/" {
			return // a "directory marker" object some tools create
		}
		names = append(names, name)
	})
	if err != nil {
		return nil, err
	}
	if len(names) == 0 && k != "" {
		return nil, ErrNotFound
	}
	sort.Strings(names)
	return names, nil
}

// listing runs one listing of the objects below k (their children only
// unless recursive), calling fn per entry. The request timer is re-armed
// by every entry received, so a listing of many pages that keeps flowing
// is never cut off, and one that stalls fails: minio-go ends a listing
// whose context ends between two pages without an error, which must not
// read as its end.
func (s *S3) listing(ctx context.Context, k string, recursive bool, fn func(minio.ObjectInfo)) error {
	a, err := s.start(ctx)
	if err != nil {
		return err
	}
	// Ending the attempt also stops minio-go's listing goroutine on an
	// early return.
	defer a.end()
	p := s.objectKey(k)
	if p != "" {
		p += "/"
	}
	for obj := range s.client.ListObjects(a.ctx, s.bucket, minio.ListObjectsOptions{Prefix: p, Recursive: recursive}) {
		if obj.Err != nil {
			return s.classify(ctx, a.stalled(), obj.Err)
		}
		a.progress()
		fn(obj)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if a.stalled() {
		return Transient(fmt.Errorf("listing stalled: no response for %v: %w", s.timeout, context.DeadlineExceeded))
	}
	return nil
}
