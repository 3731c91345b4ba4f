package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/layout"
)

// Upper bounds of the count flags. Each readahead sample is a fill in
// flight that holds memory and cache space; each warm job a fill too. Past
// these a value is a typo (--readahead 1000000 filled and evicted 755 MB
// for five reads), not a tuning.
const (
	maxReadahead = 256
	maxJobs      = 1024
)

// checkShard checks --rank, --world and --shard the same way for every
// command that takes them, with messages that name the flags.
func checkShard(rank, world int, mode string) (layout.Shard, error) {
	if world < 1 {
		return layout.Shard{}, usagef("--world %d: want 1 or more", world)
	}
	if rank < 0 || rank >= world {
		return layout.Shard{}, usagef("--rank %d --world %d: want 0 <= rank < world", rank, world)
	}
	if mode != "contiguous" && mode != "interleaved" {
		return layout.Shard{}, usagef("--shard %q: want contiguous or interleaved", mode)
	}
	return layout.ParseShard(rank, world, mode)
}

// checkShardGiven refuses a split the command line leaves half said:
// --world above 1 without --rank (each node would take rank 0's share
// without a word), and --rank or --shard without --world (they would do
// nothing).
func checkShardGiven(cmd *cobra.Command, world int) error {
	fl := cmd.Flags()
	switch {
	case fl.Changed("world") && world > 1 && !fl.Changed("rank"):
		return usagef("--world %d without --rank: give this node's rank, 0 to %d", world, world-1)
	case !fl.Changed("world") && fl.Changed("rank"):
		return usagef("--rank %s without --world: give the number of ranks too", fl.Lookup("rank").Value)
	case !fl.Changed("world") && fl.Changed("shard"):
		return usagef("--shard %s without --world: it splits samples among ranks only with --rank and --world", fl.Lookup("shard").Value)
	}
	return nil
}

// checkCount checks an integer flag against [lo, hi].
func checkCount(flag string, v, lo, hi int) error {
	if v < lo || v > hi {
		return usagef("--%s %d: want %d to %d", flag, v, lo, hi)
	}
	return nil
}

// checkMetricsAddr checks the form of a --metrics address (HOST:PORT or
// :PORT) before anything starts, so that a typo is a usage error and not a
// mount that goes live and then fails.
func checkMetricsAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			err = errors.New(ae.Err)
		}
		return usagef("--metrics %q: %v (want HOST:PORT, such as 127.0.0.1:9464)", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		// 0 lets the kernel choose; the log names the address taken.
		return usagef("--metrics %q: port %q: want a number from 0 to 65535", addr, port)
	}
	if strings.ContainsAny(host, " /") {
		return usagef("--metrics %q: host %q is not a host name or address", addr, host)
	}
	return nil
}

// listenMetrics opens the --metrics listener before the mount starts. An
// address this machine cannot have (no such host, no such interface
// address) is a usage error; a port taken or not permitted is a runtime
// one (the same flags work elsewhere, or later).
func listenMetrics(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
	}
	if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	return nil, usagef("--metrics %s: %v", addr, err)
}

// subcommandsOnly makes a command that only groups others (zarrfs, zarrfs
// cache) refuse an unknown subcommand as a usage error (cobra would print
// a group's help and exit 0), with cobra's suggestions; given no
// arguments it prints its help, as kubectl and gh do for their groups.
func subcommandsOnly(cmd *cobra.Command) {
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's own for the root
	}
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			return usagef("unknown command %q for %q; did you mean %s? (see %s --help)", args[0], c.CommandPath(), strings.Join(s, " or "), c.CommandPath())
		}
		return usagef("unknown command %q for %q (see %s --help)", args[0], c.CommandPath(), c.CommandPath())
	}
	cmd.RunE = func(c *cobra.Command, args []string) error { return c.Help() }
}
