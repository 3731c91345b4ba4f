package main

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
)

// notifySystemd sends state to systemd when it started the daemon as a
// Type=notify service (NOTIFY_SOCKET set): READY=1 once the mount is live,
// STOPPING=1 at shutdown. Elsewhere it does nothing.
func notifySystemd(state string, log *slog.Logger) {
	sock := os.Getenv("NOTIFY_SOCKET")
	if sock == "" {
		return
	}
	if sock[0] == '@' {
		sock = "\x00" + sock[1:] // abstract namespace
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		log.Warn("systemd notification failed", "socket", os.Getenv("NOTIFY_SOCKET"), "err", err)
		return
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		log.Warn("systemd notification failed", "socket", os.Getenv("NOTIFY_SOCKET"), "err", err)
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
