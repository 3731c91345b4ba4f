package main

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// notifySystemd sends state to systemd when it started the daemon as a
// Type=notify service (NOTIFY_SOCKET set): READY=1 once the mount is live,
// STOPPING=1 at shutdown. READY=1 also goes to the socket of the
// mount.fuse.zarrfs helper that started the daemon (readySocketEnv), once:
// the helper is gone by shutdown. Elsewhere it does nothing.
func notifySystemd(state string, log *slog.Logger) {
	if sock := os.Getenv(readySocketEnv); sock != "" && strings.HasPrefix(state, "READY=1") {
		os.Unsetenv(readySocketEnv)
		notify(sock, state, log)
	}
	if sock := os.Getenv("NOTIFY_SOCKET"); sock != "" {
		notify(sock, state, log)
	}
}

// readySocketEnv names the helper's socket in the daemon's environment.
const readySocketEnv = "ZARRFS_READY_SOCKET"

func notify(sock, state string, log *slog.Logger) {
	addr := sock
	if addr[0] == '@' {
		addr = "\x00" + addr[1:] // abstract namespace
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		log.Warn("readiness notification failed", "socket", sock, "err", err)
		return
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		log.Warn("readiness notification failed", "socket", sock, "err", err)
	}
}

// absMountpoint is the mountpoint as the registry keys it: absolute, with
// symbolic links resolved.
func absMountpoint(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real
	}
	return abs
}
