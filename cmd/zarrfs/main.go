// Command zarrfs mounts Zarr stores as read-only filesystems of device-ready
// .npy blobs, warms their cache, and inspects them.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/ratelog"
)

var version = "dev"

// usageError marks a mistake on the command line: exit status 2. cmd,
// when set, names the command whose arguments or flags are wrong, below
// zarrfs ("mount", "cache gc"): its line reads "zarrfs: mount: ...".
type usageError struct {
	cmd string
	err error
}

func (e usageError) Error() string {
	if e.cmd == "" {
		return e.err.Error()
	}
	return e.cmd + ": " + e.err.Error()
}

func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{err: fmt.Errorf(format, args...)}
}

// cmdUsagef is usagef about the command line of cmd.
func cmdUsagef(cmd *cobra.Command, format string, args ...any) error {
	return usageError{cmd: commandName(cmd), err: fmt.Errorf(format, args...)}
}

// commandName is cmd's path below the root ("mount", "cache gc"), "" for
// the root itself.
func commandName(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return ""
	}
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
}

// exactArgs is cobra.ExactArgs with a usage error.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return cmdUsagef(cmd, "expected %s, got %d argument(s)", names, len(args))
		}
		return nil
	}
}

// maxArgs is cobra.MaximumNArgs with a usage error.
func maxArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > n {
			return cmdUsagef(cmd, "expected at most %s, got %d argument(s)", names, len(args))
		}
		return nil
	}
}

// newRootCmd builds the command tree afresh: cobra keeps flag values in the
// commands, so each run (a test runs many) gets its own.
func newRootCmd(prof *profiles) *cobra.Command {
	root := &cobra.Command{
		Use:           "zarrfs",
		Short:         "Mount Zarr stores as device-ready .npy files for GPU training",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return cmdUsagef(cmd, "%w (see %s --help)", err, cmd.CommandPath())
	})
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().String("log-format", "text", "log format: text (key=value) or json (one object a line)")
	prof.register(root)
	// An unknown command is refused by the same typed usage error as
	// every other mistake, not cobra's own.
	subcommandsOnly(root)
	// Every command checks the flags every command has, whether it logs or not.
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if _, err := newLogger(cmd); err != nil {
			return err
		}
		return prof.start()
	}
	root.AddCommand(newMountCmd(), newWarmCmd(), newCacheCmd(), newInspectCmd(), newPathCmd(),
		newStatusCmd(), newUnmountCmd(), newVersionCmd())
	return root
}

// run runs the command line args, writing to stdout and stderr, and
// returns the exit status: 0, 1 for a runtime error, 2 for a usage error.
// An error is one line on stderr: "zarrfs: " and the message, which
// names the object and the cause ("zarrfs: mount: unknown flag ...").
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var prof profiles
	defer prof.stop()
	root := newRootCmd(&prof)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, errorLine(err))
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// errorLine is the one line an error is reported as: "zarrfs: " and the
// message (once, should the message carry it already).
func errorLine(err error) string {
	msg := strings.ReplaceAll(strings.TrimRight(err.Error(), "\n"), "\n", "; ")
	return "zarrfs: " + strings.TrimPrefix(msg, "zarrfs: ")
}

// newLogger builds the logger every command uses, on stderr.
func newLogger(cmd *cobra.Command) (*slog.Logger, error) {
	lvl, _ := cmd.Flags().GetString("log-level")
	var level slog.Level
	if err := level.UnmarshalText([]byte(lvl)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", lvl)
	}
	// A failure that repeats (a source outage, a cache too small) writes a
	// few lines and a count, not one line per request.
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch format, _ := cmd.Flags().GetString("log-format"); format {
	case "text", "":
		h = slog.NewTextHandler(cmd.ErrOrStderr(), hopts)
	case "json":
		h = slog.NewJSONHandler(cmd.ErrOrStderr(), hopts)
	default:
		return nil, usagef("--log-format %q: want text or json", format)
	}
	rl, err := ratelog.New(h, ratelog.Options{})
	if err != nil {
		return nil, err
	}
	return slog.New(rl), nil
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func main() {
	if filepath.Base(os.Args[0]) == helperName {
		os.Exit(runMountHelper(os.Args[1:]))
	}
	defer func() {
		// A bug must not look like a usage error (Go exits 2 on a panic):
		// one line naming it, exit status 1.
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "zarrfs: internal error: %v\n", r)
			os.Exit(1)
		}
	}()
	runtime.GOMAXPROCS(maxProcs(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)))
	// zstd decodes through the library ZARRFS_LIBZSTD names ("off": the
	// Go decoder), libzstd.so.1 when unset (docs/operations.md).
	codec.UseLibZstd(os.Getenv("ZARRFS_LIBZSTD"))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// procsPerCPU is how many Go processors zarrfs runs per CPU it may use
// (runtime.GOMAXPROCS's default: the CPUs of its affinity mask, bounded by
// its cgroup's limit). A fill's steps (source reads run in goroutines that
// can be left behind, the blob's write, FUSE requests) wait for a
// processor while the decode workers, one per CPU, hold them all: an
// execution trace of a first epoch over a cold mount showed goroutines
// waiting for a processor several times the epoch's length in all. With
// twice the processors both warm and the Loader's first epoch run faster
// (BENCHMARKS.md, tuning choices). Decoding stays bounded by the CPUs
// (codec.Options.Workers).
const procsPerCPU = 2

// maxProcs is the GOMAXPROCS zarrfs runs with: procsPerCPU times the
// runtime's default cur, unless the GOMAXPROCS environment variable (env)
// sets it, which stands.
func maxProcs(env string, cur int) int {
	if env != "" {
		return cur
	}
	return procsPerCPU * cur
}

// profiles are the hidden --cpuprofile, --trace and --memprofile flags:
// a Go CPU profile of the whole command, an execution trace, for finding
// where a slow warm or mount spends its time (go tool pprof zarrfs FILE;
// go tool trace -pprof=sync FILE), and a heap profile as the command
// ends, for what it still holds (inuse_space) and what it allocated on
// the way (go tool pprof -sample_index=alloc_space). Unset: nothing.
type profiles struct {
	cpu, trace, mem string
	stops           []func()
}

func (p *profiles) register(root *cobra.Command) {
	fl := root.PersistentFlags()
	fl.StringVar(&p.cpu, "cpuprofile", "", "write a Go CPU profile of the command to `FILE`")
	fl.StringVar(&p.trace, "trace", "", "write a Go execution trace of the command to `FILE`")
	fl.StringVar(&p.mem, "memprofile", "", "write a Go heap profile to `FILE` as the command ends")
	for _, n := range []string{"cpuprofile", "trace", "memprofile"} {
		fl.MarkHidden(n)
	}
}

// start starts the profiles the flags ask for; a file that cannot be
// made fails the command before it does anything.
func (p *profiles) start() error {
	var heap io.Writer
	for _, q := range []struct {
		flag, name string
		start      func(io.Writer) error
		stop       func()
	}{
		{"--cpuprofile", p.cpu, pprof.StartCPUProfile, pprof.StopCPUProfile},
		{"--trace", p.trace, trace.Start, trace.Stop},
		{"--memprofile", p.mem, func(w io.Writer) error { heap = w; return nil }, func() { pprof.Lookup("heap").WriteTo(heap, 0) }},
	} {
		if q.name == "" {
			continue
		}
		f, err := os.Create(q.name)
		if err == nil {
			err = q.start(f)
		}
		if err != nil {
			p.stop()
			return fmt.Errorf("%s %s: %w", q.flag, q.name, err)
		}
		p.stops = append(p.stops, func() { q.stop(); f.Close() })
	}
	return nil
}

// stop ends the profiles started, writing them out.
func (p *profiles) stop() {
	for _, s := range p.stops {
		s()
	}
	p.stops = nil
}
