package integration

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The test binary doubles as a filesystem that can be made to hang: run
// with hungFSEnv set to "SRC:MNT", it serves a loopback of SRC at MNT
// with go-fuse until it is killed. Stopped with SIGSTOP, its filesystem
// stops answering the way a dead NFS or Lustre server does: every access
// blocks in the kernel.
const hungFSEnv = "ZARRFS_TEST_HUNGFS"

func TestMain(m *testing.M) {
	if spec := os.Getenv(hungFSEnv); spec != "" {
		os.Exit(serveHungFS(spec))
	}
	os.Exit(runTests(m))
}

func serveHungFS(spec string) int {
	var src, mnt string
	for i := range spec {
		if spec[i] == ':' {
			src, mnt = spec[:i], spec[i+1:]
			break
		}
	}
	root, err := gofs.NewLoopbackRoot(src)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// No kernel caching: every read reaches the (stopped) daemon.
	zero := time.Duration(0)
	server, err := gofs.Mount(mnt, root, &gofs.Options{EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "hungfs", DirectMount: os.Geteuid() == 0, DisableXAttrs: true}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("serving")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() { <-sig; server.Unmount() }()
	server.Wait()
	return 0
}

// hungFS serves a loopback of src in a child process; stop makes it stop
// answering (SIGSTOP). Cleanup lets it go on, kills it and unmounts.
type hungFS struct {
	mnt string
	cmd *exec.Cmd
}

func startHungFS(t *testing.T, src string) *hungFS {
	t.Helper()
	requireMountTools(t)
	mnt := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hungFSEnv+"="+src+":"+mnt)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &hungFS{mnt: mnt, cmd: cmd}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make([]byte, 8)
	if n, err := out.Read(line); err != nil || string(line[:n]) != "serving\n" {
		t.Fatalf("hung filesystem did not start: %q %v", line[:n], err)
	}
	return h
}

func (h *hungFS) stop(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

func (h *hungFS) resume(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}
