package main

import (
	"context"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/objectstore"
)

// bearerTokenEnv names the environment variable whose value, when set, is
// sent as a bearer token to http(s):// sources. It is never logged.
const bearerTokenEnv = "ZARRFS_HTTP_BEARER_TOKEN"

// registerRemote adds the flags of gs:// and http(s):// sources, and
// --chunk-versions.
func (f *sourceFlags) registerRemote(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.gcsEndpoint, "gcs-endpoint", "", "Google Cloud Storage endpoint URL (default Google's, or STORAGE_EMULATOR_HOST's emulator); http:// allowed for emulators")
	cmd.Flags().BoolVar(&f.gcsAnonymous, "gcs-anonymous", false, "read a public bucket without credentials (otherwise Application Default Credentials are required)")
	cmd.Flags().StringVar(&f.httpRedirects, "http-redirects", "same-host", "http(s):// sources and targets: which redirects are followed: same-host (the same scheme, host and port) or any (another host too, never with the bearer token)")
	cmd.Flags().StringVar(&f.chunkVersions, "chunk-versions", "object", "remote sources: how a chunk rewritten in place is noticed: object (its generation, ETag or Last-Modified, from the response that reads it or listed per small array; a cached file asks its chunks once per --metadata-ttl) or metadata (trust the metadata: for archives that never rewrite a chunk; no request beyond the reads)")
}

func (f *sourceFlags) validateRemote(src string) error {
	switch f.httpRedirects {
	case "", "same-host", "any":
	default:
		return usagef("--http-redirects %q: want same-host or any", f.httpRedirects)
	}
	switch f.chunkVersions {
	case "object":
	case "metadata":
		if !isRemoteURL(src) {
			return usagef("--chunk-versions metadata: a local store's versions cost one stat per file; it applies to gs://, s3:// and http(s):// sources")
		}
	default:
		return usagef("--chunk-versions %q: want object or metadata", f.chunkVersions)
	}
	return f.deadlines.validate()
}

func isRemoteURL(src string) bool {
	for _, p := range []string{"s3://", "gs://", "http://", "https://"} {
		if strings.HasPrefix(src, p) {
			return true
		}
	}
	return false
}

// openGCS opens a gs:// source as openS3 opens an s3:// one.
func openGCS(ctx context.Context, src string, f *sourceFlags) (objectstore.Store, error) {
	if _, _, err := objectstore.ParseGSURL(src); err != nil {
		return nil, usagef("%v", err)
	}
	if err := objectstore.CheckGCSEndpoint(f.gcsEndpoint); err != nil {
		return nil, usagef("--gcs-endpoint: %v", err)
	}
	g, err := objectstore.OpenGCS(ctx, src, objectstore.GCSOptions{
		Endpoint:       f.gcsEndpoint,
		EmulatorHost:   os.Getenv("STORAGE_EMULATOR_HOST"),
		Anonymous:      f.gcsAnonymous,
		Logger:         f.logger,
		RequestTimeout: f.deadlines.stall,
	})
	if err != nil {
		return nil, err
	}
	return f.remote(g)
}

// openHTTP opens an http(s):// source or a virtual store's target host,
// with the bearer token of $ZARRFS_HTTP_BEARER_TOKEN when it is set and
// the store is on the source's own origin (scheme, host and port): the
// token is the user's for the source they named, never for a host a
// reference set names.
func openHTTP(ctx context.Context, src string, f *sourceFlags) (objectstore.Store, error) {
	if _, err := objectstore.ParseHTTPURL(src); err != nil {
		if u, perr := url.Parse(src); perr == nil && u.User != nil {
			// Never echo the URL: the part before "@" is a secret.
			return nil, usagef("an http URL must not hold credentials; %s", credentialsHint("https"))
		}
		return nil, usagef("%v", err)
	}
	token := ""
	if o := httpOrigin(src); o != "" && o == httpOrigin(f.source) {
		token = strings.TrimSpace(os.Getenv(bearerTokenEnv))
	}
	h, err := objectstore.OpenHTTP(ctx, src, objectstore.HTTPOptions{
		BearerToken:          token,
		TokenSource:          bearerTokenEnv,
		Logger:               f.logger,
		RequestTimeout:       f.deadlines.stall,
		CrossOriginRedirects: f.httpRedirects == "any",
	})
	if err != nil {
		return nil, err
	}
	return f.remote(h)
}

// httpOrigin is the scheme, host and port of an http(s):// URL (a
// reference:// one's too), lower case and without a default port; "" for
// anything else.
func httpOrigin(src string) string {
	src = strings.TrimPrefix(src, "reference://")
	u, err := url.Parse(src)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return ""
	}
	host := strings.ToLower(u.Host)
	if p := u.Port(); (u.Scheme == "https" && p == "443") || (u.Scheme == "http" && p == "80") {
		host = strings.TrimSuffix(host, ":"+p)
	}
	return u.Scheme + "://" + host
}
