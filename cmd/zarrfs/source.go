package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/decode"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/objectstore"
)

// sourceFlags are the flags every command that opens a source shares.
type sourceFlags struct {
	s3Endpoint  string
	s3Region    string
	s3Anonymous bool
	// gs:// and http(s):// sources (gcs.go)
	gcsEndpoint   string
	gcsAnonymous  bool
	chunkVersions string
	decode        string
	gpus          string
	gpuMemory     string
	pinned        string
	gpuIdle       time.Duration
	gpuTrust      bool   // --gpu-trust-unchecked
	gpuKernels    string // --gpu-kernels (hidden)
	deadlines     deadlineFlags
	follow        bool
	httpRedirects string
	virtual       virtualFlags // virtual.go
	// source is the source being opened: the bearer token goes to its
	// origin alone (openHTTP).
	source    string
	metaLimit metadataLimitFlag
	logger    *slog.Logger
	// host lends the buffers the source's stores read through (the
	// pipeline's host arena); nil: ordinary memory.
	host memory.Lender
	// cmd is the command whose flags validate checked, for the checks
	// that need to know what the source is (virtualFlags.checkPlain).
	cmd *cobra.Command
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
	f.registerRemote(cmd)
	f.deadlines.register(cmd)
	f.metaLimit.register(cmd)
	cmd.Flags().BoolVar(&f.follow, "follow-symlinks", false, "local stores: follow symbolic links that leave the store (chunks in a git-annex or DVC cache); by default reads stay inside it")
	f.virtual.register(cmd)
	f.decode = "auto"
	if decodes {
		cmd.Flags().StringVar(&f.decode, "decode", "auto", "where chunks are decompressed: auto (CPU and GPU together when nvCOMP loads, else CPU), cpu or gpu")
		cmd.Flags().StringVar(&f.gpus, "gpus", "all", "GPUs that decode: all, or device numbers such as 0,1")
		cmd.Flags().StringVar(&f.gpuMemory, "gpu-memory", "1GiB", "device memory decoding may take on each GPU, CUDA context included")
		cmd.Flags().StringVar(&f.pinned, "pinned-memory", "", "pinned host memory decoding may take per GPU (staging and lent buffers); unset, it follows --gpu-memory: its rounds' staging plus 1760MiB (2GiB with the default --gpu-memory)")
		cmd.Flags().DurationVar(&f.gpuIdle, "gpu-idle", 2*time.Minute, "give the GPUs' decoding memory back after this long without decoding")
		cmd.Flags().BoolVar(&f.gpuTrust, "gpu-trust-unchecked", false, gpuTrustHelp)
		cmd.Flags().StringVar(&f.gpuKernels, "gpu-kernels", "", "load the GPU kernels from this PTX file (gpu/kernels/kernels.cu compiled with nvcc) instead of the built-in ones: to try kernels before they are checked in")
		_ = cmd.Flags().MarkHidden("gpu-kernels")
	}
}

// closeStore releases a store's handles (idle connections, a root
// directory descriptor, a breaker's probe): the objectstore decorators
// close what they wrap, so closing the outermost store closes its chain.
func closeStore(s objectstore.Store) {
	s.Close()
}

// s3Flags and gcsFlags are the flags that mean something for an s3:// or a
// gs:// source only.
var (
	s3Flags  = []string{"s3-endpoint", "s3-region", "s3-anonymous"}
	gcsFlags = []string{"gcs-endpoint", "gcs-anonymous"}
)

// validate checks the source flags against the source, once, before
// anything is opened: the deadlines whatever the source, and S3's own
// flags only with an s3:// source. An S3 flag on another source is refused
// rather than ignored: the command line says the user believes the
// source is a bucket (a mistyped URL such as "s3:/bucket" is a local path),
// and nothing would tell them that the flag did nothing.
func (f *sourceFlags) validate(cmd *cobra.Command, src string) error {
	f.deadlines.follow(cmd)
	if err := f.validateRemote(src); err != nil {
		return err
	}
	if err := f.virtual.validate(); err != nil {
		return err
	}
	if fl := cmd.Flags().Lookup("ref"); fl != nil {
		f.virtual.refGiven = fl.Changed
	}
	f.cmd = cmd
	for _, c := range []struct {
		scheme, what string
		flags        []string
	}{
		{"s3", "S3", s3Flags},
		{"gs", "GCS", gcsFlags},
	} {
		if urlScheme(src) == c.scheme || schemeAliases[urlScheme(src)] == c.scheme || f.virtual.allows(c.scheme) {
			continue
		}
		for _, name := range c.flags {
			if fl := cmd.Flags().Lookup(name); fl != nil && fl.Changed {
				return usagef("--%s: %s is not on %s (%s://); %s flags apply to %s://BUCKET/PREFIX, or to a reference set's targets in a bucket --ref-allow names", name, src, c.what, c.scheme, c.what, c.scheme)
			}
		}
	}
	return nil
}

// openStore opens a local path, file:// URL, or s3://, gs://, http:// or
// https:// URL, or a virtual store over them. The flags were checked by
// validate; the remote ones are checked again for callers that open a store
// without it.
func (f *sourceFlags) openStore(ctx context.Context, src string) (objectstore.Store, error) {
	if err := f.validateRemote(src); err != nil {
		return nil, err
	}
	f.source = src
	if st, ok, err := f.openVirtual(ctx, src); ok || err != nil {
		return st, err // a kerchunk reference set or an Icechunk repository
	}
	// A URL of another scheme is no local path: say so, not "no such
	// directory".
	switch s := urlScheme(src); {
	case schemeAliases[s] != "":
		return nil, usagef("%s: a store's URL is %s://, not %s:// (which reference sets' targets may use)", src, schemeAliases[s], s)
	case s != "" && s != "file" && s != "s3" && s != "gs" && s != "http" && s != "https":
		return nil, usagef("%s: zarrfs reads local paths and file://, s3://, gs://, http://, https:// and reference:// URLs, not %s://", src, s)
	}
	if err := f.virtual.checkPlain(f.cmd, src); err != nil {
		return nil, err
	}
	switch {
	case strings.HasPrefix(src, "s3://"):
		return openS3(ctx, src, f)
	case strings.HasPrefix(src, "gs://"):
		return openGCS(ctx, src, f)
	case strings.HasPrefix(src, "http://"), strings.HasPrefix(src, "https://"):
		return openHTTP(ctx, src, f)
	}
	if err := f.deadlines.validate(); err != nil {
		return nil, err
	}
	st, err := objectstore.OpenPosixOptions(src, objectstore.PosixOptions{FollowSymlinks: f.follow})
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	// A local filesystem can stop answering too (NFS, Lustre, a stopped
	// FUSE daemon), where a read blocks in the kernel for as long as it
	// does: each open, stat or read is bounded by --source-timeout (a
	// retry after --source-stall would only block again), and once enough
	// of them are blocked, reads fail at once until those return. No
	// breaker: a store's files may live on several filesystems (links
	// into an annex), and one that hangs says nothing of the others.
	dl, err := objectstore.WithDeadline(st, objectstore.DeadlineOptions{Timeout: f.deadlines.timeout, Logger: f.logger, Memory: f.host})
	if err != nil {
		st.Close()
		return nil, err
	}
	return dl, nil
}

// gpuTrustHelp says what --gpu-trust-unchecked trusts: nvCOMP's decoding of
// streams that no host check verifies (gpu.Options.Unverified).
const gpuTrustHelp = "accept as nvCOMP decodes them, on the GPU, chunks no checksum verifies: zstd frames without a content checksum " +
	"(numcodecs' default), zstd chunks of several frames, and blosc chunks with zstd or snappy streams; damage inside their " +
	"compressed data may then give wrong bytes instead of an error (off: such chunks decode on the CPU)"

// newPipeline builds the process's one decoding pipeline from --decode and
// --gpus: "gpu" refuses to run without a usable GPU and nvCOMP, "cpu"
// never touches a GPU, "auto" decodes on the CPU and starts the GPUs in the
// background (package decode). The caller closes it.
func (f *sourceFlags) newPipeline(log *slog.Logger) (*decode.Pipeline, error) {
	opts, err := f.decodeOptions()
	if err != nil {
		return nil, err
	}
	opts.Logger = log
	p, err := decode.New(opts)
	if errors.Is(err, gpu.ErrBudget) {
		// A bound too small for --decode gpu: the line names the flag.
		return nil, usagef("%v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("--decode %s: %w", opts.Mode, err)
	}
	return p, nil
}

// decodeOptions are the pipeline's options from the decoding flags, or a
// usage error.
func (f *sourceFlags) decodeOptions() (decode.Options, error) {
	mode, err := decode.ParseMode(f.decode)
	if err != nil {
		return decode.Options{}, usagef("--decode %v", err)
	}
	gpus, err := decode.ParseGPUs(f.gpus)
	if err != nil {
		return decode.Options{}, usagef("--gpus %v", err)
	}
	gpuMem, err := cache.ParseSize(f.gpuMemory)
	if err != nil || gpuMem <= 0 {
		return decode.Options{}, usagef("--gpu-memory %q: want a size such as 1GiB", f.gpuMemory)
	}
	var pinned int64 // 0: it follows --gpu-memory (decode.Options)
	if f.pinned != "" {
		if pinned, err = cache.ParseSize(f.pinned); err != nil || pinned <= 0 {
			return decode.Options{}, usagef("--pinned-memory %q: want a size such as 2GiB", f.pinned)
		}
	}
	if f.gpuIdle <= 0 {
		return decode.Options{}, usagef("--gpu-idle %v: want a positive duration", f.gpuIdle)
	}
	if f.gpuTrust && mode == decode.CPU {
		return decode.Options{}, usagef("--gpu-trust-unchecked: --decode cpu decodes nothing on a GPU")
	}
	var ptx []byte
	if f.gpuKernels != "" {
		if ptx, err = os.ReadFile(f.gpuKernels); err != nil {
			return decode.Options{}, usagef("--gpu-kernels %v", err)
		}
		if !bytes.Contains(ptx, []byte(".entry ")) {
			return decode.Options{}, usagef("--gpu-kernels %s: not PTX: no .entry (compile gpu/kernels/kernels.cu with nvcc -ptx)", f.gpuKernels)
		}
	}
	return decode.Options{Mode: mode, GPUs: gpus, GPUMemory: gpuMem, PinnedMemory: pinned,
		// The daemon is the only user of the GPUs in its process: closing
		// one (idle, or at exit) gives back its whole context.
		GPU: gpu.Options{Libraries: gpu.LibrariesFrom(os.Getenv), HostIdle: f.gpuIdle, ResetOnClose: true, Unverified: f.gpuTrust, KernelsPTX: string(ptx)}}, nil
}
