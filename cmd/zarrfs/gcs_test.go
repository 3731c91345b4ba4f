package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
)

// Each URL scheme opens its store behind the breaker and retries, and
// --chunk-versions metadata hides the versions of remote stores only.
func TestOpenRemoteSources(t *testing.T) {
	ctx := context.Background()
	t.Setenv("STORAGE_EMULATOR_HOST", "")
	flags := func(versions string) *sourceFlags {
		return &sourceFlags{gcsAnonymous: true, s3Anonymous: true, s3Endpoint: "http://127.0.0.1:1", chunkVersions: versions,
			deadlines: deadlineFlags{timeout: 30 * time.Second, stall: 10 * time.Second}}
	}
	for _, tc := range []struct {
		src, versions, want string
	}{
		{"gs://bucket/era5.zarr", "object", "generation"},
		{"gs://bucket/era5.zarr", "metadata", "the metadata's"},
		{"https://data.example.org/era5.zarr", "object", "HEAD"},
		{"http://127.0.0.1:1/era5.zarr", "metadata", "the metadata's"},
		{"s3://bucket/era5.zarr", "object", "ETag"},
	} {
		st, err := flags(tc.versions).openStore(ctx, tc.src)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		if _, ok := st.(*objectstore.Retry); !ok && tc.versions == "object" {
			t.Errorf("%s: %T, want the retry layer outermost", tc.src, st)
		}
		if got := objectstore.DescribeVersions(st); !strings.Contains(got, tc.want) {
			t.Errorf("%s, --chunk-versions %s: versions %q, want %q", tc.src, tc.versions, got, tc.want)
		}
		closeStore(st)
	}
	for _, tc := range []struct {
		src, versions string
	}{
		{t.TempDir(), "metadata"}, // a local store's versions are free
		{"gs://bucket/x", "maybe"},
		{"gs://", "object"},
		{"https://user:pw@host/x", "object"},
		{"https://host/x?sig=1", "object"},
	} {
		_, err := flags(tc.versions).openStore(ctx, tc.src)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%s, --chunk-versions %s: err = %v, want a usage error", tc.src, tc.versions, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("error repeats a credential: %v", err)
		}
	}
	bad := flags("object")
	bad.gcsEndpoint = "ftp://x"
	if _, err := bad.openStore(ctx, "gs://b/x"); err == nil || !strings.Contains(err.Error(), "--gcs-endpoint") {
		t.Errorf("bad --gcs-endpoint: %v", err)
	}
}
