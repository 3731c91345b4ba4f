package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// A mount that ends while a reader holds a ring with fills in flight (the
// test mode: a memfd ring, the CPU decoding) returns only once every fill
// returned and the ring was freed: the fills decode with the mount's
// decoders into its cache, which close after. Run with -race. Three
// mounts: whether the fills outlast the mount's own unmount is a race, and
// a mount that returned without waiting for them is seen in most rounds,
// not all.
func TestUnmountWithFillsInFlight(t *testing.T) {
	requireFUSE(t)
	store := filepath.Join(t.TempDir(), "s.zarr")
	if err := (zarrtest.Example{Times: 24, Levels: 3, Lat: 181, Lon: 360, TimeChunk: 1}).Write(store); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if unmountWithFillsInFlight(t, store); t.Failed() {
			return
		}
	}
}

func unmountWithFillsInFlight(t *testing.T, store string) {
	mnt := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, errs := &syncBuilder{}, &syncBuilder{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"mount", store, mnt, "--delivery", "host", "--cache", filepath.Join(t.TempDir(), "c"), "--log-level", "info"}, out, errs)
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "\n"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("mount not live after 30s: %s", errs.String())
		}
	}
	sock := deliverySocket(absMountpoint(mnt))
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	const slots, batch = 4, 6
	send := func(v any) {
		b, _ := json.Marshal(v)
		if _, err := uc.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	send(map[string]any{"op": "open", "dir": "t", "memory": "host", "slots": slots, "batch": batch})
	buf, oob := make([]byte, 1<<16), make([]byte, unix.CmsgSpace(4))
	uc.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil || !strings.Contains(string(buf[:n]), `"ok":true`) {
		t.Fatalf("open: %q, %v", buf[:n], err)
	}
	if msgs, _ := unix.ParseSocketControlMessage(oob[:oobn]); len(msgs) == 1 {
		if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
	}
	ents, err := os.ReadDir(filepath.Join(mnt, "t"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	for k := range slots {
		send(map[string]any{"op": "fill", "slot": k, "files": names[k*batch : (k+1)*batch]})
	}
	cancel() // SIGTERM: unmount while the fills run
	var log string
	select {
	case code := <-done:
		// The log as the mount returned, before anything below gives
		// a server still closing time to finish.
		log = errs.String()
		if code != 0 {
			t.Fatalf("mount exited %d: %s", code, log)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("mount still running 60s after it was told to stop")
	}
	// By the time the mount returned, the server is gone: its socket
	// removed, the connection closed, the ring freed.
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the delivery socket is still there once the mount returned (%v)", err)
	}
	uc.SetReadDeadline(time.Now().Add(time.Second))
	// Closed: read to its end, or reset (the server closed it with
	// requests of ours unread, as a fill request sent while it stopped).
	if _, err := io.Copy(io.Discard, bufio.NewReader(uc)); err != nil && !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("the delivery connection is still open once the mount returned: %v", err)
	}
	if !strings.Contains(log, "delivery ring closed") {
		t.Errorf("no ring freed before the mount returned:\n%s", log)
	}
}

// A mount's sockets are owner-only, and one left by a killed daemon is
// replaced.
func TestListenPrivate(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "m.sock")
	if err := os.WriteFile(sock, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	ln, err := listenPrivate(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	st, err := os.Lstat(sock)
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, %v; want a socket of mode 0600", sock, st.Mode(), err)
	}
}

// A shutdown that does not end (a ring's Close held by a GPU whose kernel
// does not end) is bounded: past the limit the daemon logs an error, then
// where every goroutine waits, and exits with status 1; a shutdown that
// ends first stops the bound.
func TestBoundShutdown(t *testing.T) {
	var logBuf, out bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logBuf, mu: &mu}, nil))
	exited := make(chan int, 1)
	stuck := make(chan struct{})
	defer close(stuck)
	go func() { waitForTheGPU(stuck) }()
	boundShutdown(log, &lockedWriter{w: &out, mu: &mu}, 50*time.Millisecond, func(code int) { exited <- code })
	select {
	case code := <-exited:
		if code != 1 {
			t.Fatalf("exit status %d, want 1", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a shutdown past its bound did not exit")
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logBuf.String(), "shutdown did not end in time") || !strings.Contains(out.String(), "waitForTheGPU") {
		t.Fatalf("log %q, goroutines %d bytes without the stuck one", logBuf.String(), out.Len())
	}

	done := make(chan int, 1)
	b := boundShutdown(log, io.Discard, 50*time.Millisecond, func(code int) { done <- code })
	if !b.Stop() {
		t.Fatal("the bound fired before the shutdown ended")
	}
	select {
	case <-done:
		t.Fatal("a shutdown that ended in time exited")
	case <-time.After(200 * time.Millisecond):
	}
}

//go:noinline
func waitForTheGPU(c chan struct{}) { <-c }

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
