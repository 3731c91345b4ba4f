package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// sourceFlags are the flags every command that opens a source shares.
type sourceFlags struct {
	s3Endpoint  string
	s3Region    string
	s3Anonymous bool
	logger      *slog.Logger
}

func getenv(k, def string) string {
	if v, ok := os.LookupEnv(k); ok {
		return v
	}
	return def
}

func (f *sourceFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.s3Endpoint, "s3-endpoint", "", "S3 endpoint URL (default AWS); http:// allowed for on-premises servers")
	cmd.Flags().StringVar(&f.s3Region, "s3-region", "", "S3 region")
	cmd.Flags().BoolVar(&f.s3Anonymous, "s3-anonymous", false, "read a public bucket without credentials")
}

// openStore opens a local path, file:// URL or s3:// URL.
func (f *sourceFlags) openStore(ctx context.Context, src string) (objectstore.Store, error) {
	if strings.HasPrefix(src, "s3://") {
		return openS3(ctx, src, f)
	}
	return objectstore.OpenPosix(src)
}

// openHierarchy opens the store and its Zarr metadata.
func (f *sourceFlags) openHierarchy(ctx context.Context, src string, opts zarr.Options) (*zarr.Hierarchy, error) {
	st, err := f.openStore(ctx, src)
	if err != nil {
		return nil, err
	}
	return zarr.Open(ctx, st, opts)
}
