package objectstore

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/minio/minio-go/v7"
)

// Error statuses fall in the same classes whichever remote store sees
// them (the GCS ones: TestGCSErrorClasses).
func TestErrorStatusClasses(t *testing.T) {
	s3 := &S3{remote: remote{id: "s3://b"}, bucket: "b"}
	web := &HTTP{remote: remote{id: "http://h"}, tokenOf: "the bearer token"}
	tests := []struct {
		status int
		code   string // S3's error code
		class  func(error) bool
		what   string
	}{
		{404, "NoSuchKey", IsNotFound, "not found"},
		{403, "AccessDenied", IsPermission, "permission"},
		{416, "InvalidRange", func(err error) bool { return errors.Is(err, ErrRange) && !IsTransient(err) }, "a permanent range error"},
		{500, "InternalError", IsTransient, "transient"},
		{503, "SlowDown", IsTransient, "transient"},
		{429, "TooManyRequests", IsTransient, "transient"},
		{408, "RequestTimeout", IsTransient, "transient"},
		{400, "InvalidArgument", func(err error) bool {
			return err != nil && !IsTransient(err) && !IsNotFound(err) && !IsPermission(err) && !errors.Is(err, ErrRange)
		}, "permanent"},
	}
	for _, tc := range tests {
		if err := s3.classify(context.Background(), false, minio.ErrorResponse{StatusCode: tc.status, Code: tc.code}); !tc.class(err) {
			t.Errorf("S3 HTTP %d %s: %v, want %s", tc.status, tc.code, err, tc.what)
		}
		if err := web.statusError(http.MethodGet, &http.Response{StatusCode: tc.status}); !tc.class(err) {
			t.Errorf("HTTP %d: %v, want %s", tc.status, err, tc.what)
		}
	}
	// S3's own codes, whatever the status says.
	if err := s3.classify(context.Background(), false, minio.ErrorResponse{StatusCode: 400, Code: "SlowDown"}); !IsTransient(err) {
		t.Errorf("S3 SlowDown at 400: %v, want transient", err)
	}
	if err := s3.classify(context.Background(), false, minio.ErrorResponse{StatusCode: 400, Code: "InvalidRange"}); !errors.Is(err, ErrRange) {
		t.Errorf("S3 InvalidRange at 400: %v, want ErrRange", err)
	}
}
