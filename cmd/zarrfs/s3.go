package main

import (
	"context"
	"strings"

	"github.com/zarrfs/zarrfs/objectstore"
)

// openS3 opens an s3:// source with retries around every request.
func openS3(ctx context.Context, src string, f *sourceFlags) (objectstore.Store, error) {
	endpoint := f.s3Endpoint
	if endpoint == "" {
		endpoint = strings.TrimSpace(getenv("AWS_ENDPOINT_URL_S3", getenv("AWS_ENDPOINT_URL", "")))
	}
	s, err := objectstore.OpenS3(ctx, src, objectstore.S3Options{
		Endpoint:  endpoint,
		Region:    f.s3Region,
		Anonymous: f.s3Anonymous,
		Logger:    f.logger,
	})
	if err != nil {
		return nil, err
	}
	return objectstore.WithRetry(s, objectstore.RetryOptions{Logger: f.logger}), nil
}
