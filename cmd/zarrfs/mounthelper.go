package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
)

// The zarrfs binary called as mount.fuse.zarrfs (a link under /sbin) is
// mount(8)'s helper for `mount -t fuse.zarrfs SOURCE MOUNTPOINT -o OPTIONS`
// and /etc/fstab entries of type fuse.zarrfs: it turns the options into
// `zarrfs mount` flags, starts the daemon in a session of its own, waits
// until the mount is live (the daemon's READY=1, as systemd's notify
// protocol) and exits 0, or prints the daemon's error and exits 32, as
// mount(8) expects of a failed mount.

const (
	helperName      = "mount.fuse.zarrfs"
	exitUsage       = 1
	exitMountFailed = 32
)

// helperOptions maps -o options to the flags of `zarrfs mount` (a flag's
// name with _ for -): "flag" takes the option's value, "bool" is a switch.
// It is made from the command's flags, so every flag is an option.
func helperOptions() map[string]string {
	m := map[string]string{"log_level": "flag", "log_format": "flag"} // the root command's
	newMountCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		kind := "flag"
		if f.Value.Type() == "bool" {
			kind = "bool"
		}
		m[strings.ReplaceAll(f.Name, "-", "_")] = kind
	})
	return m
}

// splitOptions splits a -o argument at commas outside double quotes and
// takes the quotes away: gpus="0,1" is one option, gpus=0,1.
func splitOptions(o string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range o {
		switch {
		case r == '"':
			quoted = !quoted
		case r == ',' && !quoted:
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	return append(out, cur.String())
}

// helperIgnored are the generic mount options that mean nothing here (the
// mount is always read-only, without devices or set-id files).
// mount(8) passes rw unless told ro; the mount is read-only either way.
var helperIgnored = map[string]bool{
	"ro": true, "rw": true, "defaults": true, "auto": true, "noauto": true, "user": true, "nouser": true, "users": true,
	"_netdev": true, "nofail": true, "noatime": true, "relatime": true, "atime": true, "nodev": true,
	"nosuid": true, "dev": true, "suid": true, "exec": true, "noexec": true, "async": true, "sync": true,
}

// helperArgs parses mount(8)'s arguments: SOURCE MOUNTPOINT [-o OPTS]...
// [-n] [-s] [-f] [-v] [-N NS]. It returns the `zarrfs mount` arguments,
// the log file for the daemon ("" for the default), and whether -f asked
// for a fake mount.
func helperArgs(args []string) (mountArgs []string, logFile string, fake bool, err error) {
	var pos []string
	var opts []string
	sloppy := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" && i+1 < len(args):
			i++
			opts = append(opts, args[i])
		case strings.HasPrefix(a, "-o") && len(a) > 2:
			opts = append(opts, a[2:])
		case a == "-n" || a == "-v":
		case a == "-s":
			sloppy = true
		case a == "-f":
			fake = true
		case a == "-N" && i+1 < len(args):
			i++
		case strings.HasPrefix(a, "-"):
			return nil, "", false, fmt.Errorf("unknown argument %q", a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return nil, "", false, fmt.Errorf("want SOURCE MOUNTPOINT [-o OPTIONS], got %d arguments", len(pos))
	}
	mountArgs = []string{"mount", pos[0], pos[1]}
	helperOptions := helperOptions()
	for _, o := range opts {
		for _, kv := range splitOptions(o) {
			if kv == "" {
				continue
			}
			k, v, hasV := strings.Cut(kv, "=")
			switch {
			case k == "log":
				logFile = v
			case helperIgnored[k] || strings.HasPrefix(k, "x-") || k == "comment":
			case helperOptions[k] == "bool" && !hasV:
				mountArgs = append(mountArgs, "--"+strings.ReplaceAll(k, "_", "-"))
			case helperOptions[k] == "flag" && hasV:
				mountArgs = append(mountArgs, "--"+strings.ReplaceAll(k, "_", "-"), v)
			case sloppy:
			case helperOptions[k] != "":
				return nil, "", false, fmt.Errorf("option %s: wrong form (want %s)", kv, map[string]string{"bool": k, "flag": k + "=VALUE"}[helperOptions[k]])
			default:
				return nil, "", false, fmt.Errorf("unknown option %q", k)
			}
		}
	}
	return mountArgs, logFile, fake, nil
}

// runMountHelper is main for the binary called as mount.fuse.zarrfs.
func runMountHelper(args []string) int {
	mountArgs, logFile, fake, err := helperArgs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
		return exitUsage
	}
	if fake {
		return 0
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
		return exitMountFailed
	}
	// The default log, beside the mount's record, is removed once it has
	// served: by the helper when the daemon fails to start (its error is
	// printed), by the daemon when it exits after unmounting (helperLogEnv);
	// one that log= names is the user's, and kept.
	ownLog := logFile == ""
	if ownLog {
		if err := privateRegistry(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
			return exitMountFailed
		}
		logFile = strings.TrimSuffix(recordFile(absMountpoint(mountArgs[2])), ".json") + ".log"
	}
	lf, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: log %v\n", helperName, err)
		return exitMountFailed
	}
	defer lf.Close()
	start, _ := lf.Seek(0, io.SeekEnd)

	// The daemon says READY=1 on this socket once the mount is live.
	dir, err := os.MkdirTemp("", "zarrfs-helper-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
		return exitMountFailed
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
		return exitMountFailed
	}
	defer conn.Close()

	cmd := exec.Command(self, mountArgs...)
	cmd.Args[0] = "zarrfs"
	// The daemon tells the helper, not a service manager the helper may
	// run under, that the mount is live.
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, "NOTIFY_SOCKET=")
	}), readySocketEnv+"="+sock)
	if ownLog {
		cmd.Env = append(cmd.Env, helperLogEnv+"="+logFile)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
		return exitMountFailed
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			if strings.Contains(string(buf[:n]), "READY=1") {
				close(ready)
				return
			}
		}
	}()
	select {
	case <-ready:
		return 0
	case err := <-exited:
		fmt.Fprintf(os.Stderr, "%s: zarrfs mount %s failed (%v)%s\n", helperName, mountArgs[2], err, lastLines(logFile, start))
		if ownLog {
			os.Remove(logFile)
		}
		return exitMountFailed
	case <-time.After(10 * time.Minute):
		// SIGTERM first: the daemon unmounts what it mounted.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		fmt.Fprintf(os.Stderr, "%s: zarrfs mount %s not live after 10 minutes%s\n", helperName, mountArgs[2], lastLines(logFile, start))
		return exitMountFailed
	}
}

// helperLogEnv names, in the environment of a daemon the helper started,
// the log file the helper made for it, which the daemon removes when it
// exits after unmounting (runMount).
const helperLogEnv = "ZARRFS_HELPER_LOG"

// lastLines returns what the daemon wrote to the log from offset start,
// its error line first: ": zarrfs: ...".
func lastLines(logFile string, start int64) string {
	f, err := os.Open(logFile)
	if err != nil {
		return ""
	}
	defer f.Close()
	f.Seek(start, io.SeekStart)
	var last, errLine string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		last = sc.Text()
		if strings.HasPrefix(last, "zarrfs: ") {
			errLine = last
		}
	}
	switch {
	case errLine != "":
		return ": " + strings.TrimPrefix(errLine, "zarrfs: ")
	case last != "":
		return ": " + last
	}
	return ""
}
