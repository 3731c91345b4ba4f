package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
	"github.com/zarrfs/zarrfs/zarr/codec"
)

// sourceFlags are the flags every command that opens a source shares.
type sourceFlags struct {
	s3Endpoint  string
	s3Region    string
	s3Anonymous bool
	decode      string
	deadlines   deadlineFlags
	follow      bool
	logger      *slog.Logger
}

func getenv(k, def string) string {
	if v, ok := os.LookupEnv(k); ok {
		return v
	}
	return def
}

// register adds the S3 flags and, for commands that decode chunks (mount
// and warm, not inspect), --decode.
func (f *sourceFlags) register(cmd *cobra.Command, decodes bool) {
	cmd.Flags().StringVar(&f.s3Endpoint, "s3-endpoint", "", "S3 endpoint URL (default AWS); http:// allowed for on-premises servers")
	cmd.Flags().StringVar(&f.s3Region, "s3-region", "", "S3 region")
	cmd.Flags().BoolVar(&f.s3Anonymous, "s3-anonymous", false, "read a public bucket without credentials")
	f.deadlines.register(cmd)
	cmd.Flags().BoolVar(&f.follow, "follow-symlinks", false, "local stores: follow symbolic links that leave the store (chunks in a git-annex or DVC cache); by default reads stay inside it")
	f.decode = "auto"
	if decodes {
		cmd.Flags().StringVar(&f.decode, "decode", "auto", "where chunks are decompressed: auto (CPU and GPU together when nvCOMP loads, else CPU), cpu or gpu")
	}
}

// openStore opens a local path, file:// URL or s3:// URL.
func (f *sourceFlags) openStore(ctx context.Context, src string) (objectstore.Store, error) {
	if strings.HasPrefix(src, "s3://") {
		return openS3(ctx, src, f)
	}
	return objectstore.OpenPosixOptions(src, objectstore.PosixOptions{FollowSymlinks: f.follow})
}

// openHierarchy opens the store and its Zarr metadata.
func (f *sourceFlags) openHierarchy(ctx context.Context, src string, opts zarr.Options) (*zarr.Hierarchy, error) {
	if opts.Decoder == nil {
		d, err := newDecoder(f.decode, f.logger)
		if err != nil {
			return nil, err
		}
		opts.Decoder = d
	}
	st, err := f.openStore(ctx, src)
	if err != nil {
		return nil, err
	}
	return zarr.Open(ctx, st, opts)
}

// newDecoder returns the chunk decoder --decode asks for: "gpu" refuses to
// run without a usable GPU and nvCOMP and decodes everything it can there,
// "cpu" never touches the GPU, "auto" uses the GPU when one loads and the
// CPU otherwise. With a GPU, auto decodes on both: a batch goes to the CPU
// pool when it is idle and to the GPU when it is busy (codec.Overflow), so
// that one reader is never slower than on the CPU alone and many readers
// get the GPU's large rounds on top of the CPU.
func newDecoder(mode string, log *slog.Logger) (codec.BatchDecoder, error) {
	switch mode {
	case "cpu":
		return codec.NewCPU(codec.Options{}), nil
	case "gpu", "auto", "":
		d, err := gpu.New(gpu.Options{Logger: log})
		if err == nil {
			log.Info("decoding on the GPU", "gpu", d.Info().String(), "mode", mode)
			if mode == "gpu" {
				return d, nil
			}
			// One batch at a time on the CPU (Limit 1): on an H200 with 16
			// cores, the 20-channel view fill with 1 to 16 readers
			// (integration/bench/gpuview) ran at 1.07-1.64x the CPU alone
			// with it, and 1.05-1.52x with 2, in the same run.
			return &codec.Overflow{First: codec.NewCPU(codec.Options{}), Then: d, Limit: 1}, nil
		}
		if mode == "gpu" {
			return nil, fmt.Errorf("--decode gpu: %w", err)
		}
		log.Debug("decoding on the CPU", "reason", err)
		return codec.NewCPU(codec.Options{}), nil
	}
	return nil, usagef("--decode %q: want auto, cpu or gpu", mode)
}
