package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/objectstore"
)

// Defaults of --source-timeout and --source-stall.
const (
	defaultSourceTimeout = 30 * time.Second
	defaultSourceStall   = 10 * time.Second
)

// deadlineFlags bound how long a read waits on a source, remote or local.
type deadlineFlags struct {
	timeout      time.Duration
	stall        time.Duration
	timeoutGiven bool // on the command line (follow)
}

func (f *deadlineFlags) register(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&f.timeout, "source-timeout", defaultSourceTimeout, "longest one read from a source may take, retries included, before it fails (EIO); local stores: one open, stat or read of a file")
	cmd.Flags().DurationVar(&f.stall, "source-stall", defaultSourceStall, "longest a remote source may leave a request without a response, or without data in the middle of one, before it is retried (at most --source-timeout, which is its default too when shorter than 10s)")
}

// follow makes the stall's default follow a --source-timeout given
// shorter: a default that the user's own flag makes invalid must not be
// blamed on them (--source-timeout 3s alone is a 3s stall too).
func (f *deadlineFlags) follow(cmd *cobra.Command) {
	f.timeoutGiven = cmd.Flags().Changed("source-timeout")
	if !cmd.Flags().Changed("source-stall") && f.timeout > 0 && f.stall > f.timeout {
		f.stall = f.timeout
	}
}

func (f *deadlineFlags) validate() error {
	if f.timeout <= 0 {
		return usagef("--source-timeout %v: want a positive duration", f.timeout)
	}
	if f.stall <= 0 || f.stall > f.timeout {
		given := "its default"
		if f.timeoutGiven {
			given = "given"
		}
		return usagef("--source-stall %v: want a positive duration up to --source-timeout (%v, %s)", f.stall, f.timeout, given)
	}
	return nil
}

// openS3 opens an s3:// source with a circuit breaker (a source that stops
// answering fails reads at once until it answers again) and retries around
// every request, each read bounded by --source-timeout (checked by
// sourceFlags.validate).
func openS3(ctx context.Context, src string, f *sourceFlags) (objectstore.Store, error) {
	if _, _, err := objectstore.ParseS3URL(src); err != nil {
		return nil, usagef("%v", err)
	}
	endpoint := f.s3Endpoint
	if endpoint == "" {
		endpoint = strings.TrimSpace(getenv("AWS_ENDPOINT_URL_S3", getenv("AWS_ENDPOINT_URL", "")))
	}
	if err := objectstore.CheckEndpoint(endpoint); err != nil {
		return nil, usagef("--s3-endpoint: %v", err)
	}
	s, err := objectstore.OpenS3(ctx, src, objectstore.S3Options{
		Endpoint:       endpoint,
		Region:         f.s3Region,
		Anonymous:      f.s3Anonymous,
		Logger:         f.logger,
		RequestTimeout: f.deadlines.stall,
	})
	if err != nil {
		return nil, err
	}
	return f.remote(s)
}

// remote wraps a remote store in the circuit breaker and the retries
// every remote source reads through, bounded by --source-stall and
// --source-timeout, and, with --chunk-versions metadata, in
// objectstore.TrustMetadata.
func (f *sourceFlags) remote(s objectstore.Store) (objectstore.Store, error) {
	br, err := objectstore.WithBreaker(s, objectstore.BreakerOptions{
		Silence: f.deadlines.stall, Quiet: 2 * f.deadlines.stall, ProbeTimeout: f.deadlines.stall, Logger: f.logger})
	if err != nil {
		s.Close()
		return nil, err
	}
	var st objectstore.Store
	st, err = objectstore.WithRetry(br, objectstore.RetryOptions{
		Logger:         f.logger,
		Budget:         f.deadlines.timeout,
		AttemptTimeout: f.deadlines.timeout,
	})
	if err != nil {
		br.Close()
		return nil, err
	}
	if f.chunkVersions == "metadata" {
		st = objectstore.TrustMetadata(st)
	}
	return st, nil
}
