package cache

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
)

// Two instances on one directory (OFD and flock locks belong to open
// files, so two Cache values in one process exclude and share exactly as
// two processes do), filling overlapping keys under one budget.
func TestTwoInstancesShareDir(t *testing.T) {
	dir := t.TempDir()
	const budget = 96 << 10
	a := mustOpen(t, Options{Dir: dir, Size: budget})
	b := mustOpen(t, Options{Dir: dir, Size: budget})
	var wg sync.WaitGroup
	for w, c := range []*Cache{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 80 {
				p := key(r.IntN(40))
				getBlob(t, c, p)
				k := fmt.Sprint("chunk", r.IntN(40))
				got, err := c.GetChunk(context.Background(), k, func(context.Context) ([]byte, error) { return content(k, 2000), nil })
				if err != nil || !bytes.Equal(got, content(k, 2000)) {
					t.Errorf("chunk %s: %v", k, err)
				}
			}
		}()
	}
	wg.Wait()
	// A blob pinned by one instance cannot be evicted by the other.
	pk := BlobKey{Layout: "L", Path: "pinned.npy"}
	data := content("pinned", 8000)
	h, _, err := a.GetBlob(context.Background(), pk, 8000, writeFill(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		getBlob(t, b, key(100+i))
	}
	if _, err := os.Stat(a.BlobPath(pk)); err != nil {
		t.Fatalf("blob pinned in one instance evicted by the other: %v", err)
	}
	if !bytes.Equal(readAll(t, h), data) {
		t.Fatal("pinned blob: wrong contents")
	}
	h.Close()
	getBlob(t, a, key(200)) // a catches up with b's log and evicts
	getBlob(t, b, key(201))
	if d, _ := diskUsage(t, dir); d > budget+12<<10 {
		t.Fatalf("%d bytes on disk, budget %d", d, budget)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	checkCache(t, dir)
}

// checkCache reopens dir and checks that every indexed blob and chunk has
// exactly the bytes its key implies, that no temp file is left and that
// the index accounts for every file.
func checkCache(t *testing.T, dir string) (blobs int) {
	t.Helper()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	c.mu.Lock()
	keys := make([]string, 0, len(c.idx))
	for k := range c.idx {
		keys = append(keys, k)
	}
	c.mu.Unlock()
	for _, k := range keys {
		got, err := os.ReadFile(dir + "/" + k)
		if err != nil {
			t.Errorf("%s: %v", k, err)
			continue
		}
		if p, ok := cutPrefix(k, "blobs/L/"); ok {
			blobs++
			if !bytes.Equal(got, content(p, sizeOf(p))) {
				t.Errorf("blob %s: wrong contents after recovery", p)
			}
		}
	}
	checkChunks(t, c)
	if tf := tempFiles(t, dir); len(tf) != 0 {
		t.Errorf("temp files left: %v", tf)
	}
	used, files := c.Usage()
	if d, f := diskUsage(t, dir); d != used || f != files {
		t.Errorf("index has %d bytes in %d files, disk %d in %d", used, files, d, f)
	}
	return blobs
}

// checkCacheL is checkCache for caches without chunks.
func checkCacheL(t *testing.T, dir string) int { return checkCache(t, dir) }

func checkChunks(t *testing.T, c *Cache) {
	for i := range 40 {
		k := fmt.Sprint("chunk", i)
		got, err := c.GetChunk(context.Background(), k, func(context.Context) ([]byte, error) { return content(k, 2000), nil })
		if err != nil || !bytes.Equal(got, content(k, 2000)) {
			t.Errorf("chunk %s: %v", k, err)
		}
	}
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return s, false
}

const childEnv = "ZARRFS_CACHE_TEST_CHILD"

// TestMain runs the package's tests, or, in a child process that
// TestKill9DuringFills started (childEnv set), the child's body instead:
// the child is no test of its own, so a normal run neither runs nor skips it.
func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		killChild(dir)
	}
	os.Exit(m.Run())
}

// killChild is the body of the child process that TestKill9DuringFills
// kills: it fills blobs and chunks forever, printing a line after each.
func killChild(dir string) {
	c, err := Open(Options{Dir: dir, Size: 160 << 10})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	var mu sync.Mutex
	for w := range 4 {
		go func() {
			r := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(w)))
			for {
				p := key(r.IntN(60))
				data := content(p, sizeOf(p))
				h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: p}, int64(len(data)), writeFill(data), nil)
				if err == nil {
					got := make([]byte, len(data))
					h.File().ReadAt(got, 0)
					if !bytes.Equal(got, data) {
						fmt.Println("bad blob", p)
						os.Exit(4)
					}
					h.Close()
				}
				k := fmt.Sprint("chunk", r.IntN(40))
				c.GetChunk(context.Background(), k, func(context.Context) ([]byte, error) { return content(k, 2000), nil })
				mu.Lock()
				fmt.Println("ok")
				mu.Unlock()
			}
		}()
	}
	select {}
}

// kill -9 during fills at random moments, then restart: only complete,
// correct blobs are served, torn temp files are gone and the index matches
// the disk. The last round kills two children sharing the directory.
func TestKill9DuringFills(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	start := func() (*exec.Cmd, *bufio.Scanner) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewScanner(out)
	}
	r := rand.New(rand.NewPCG(7, 7))
	total := 0
	for round := range 6 {
		n := 1
		if round == 5 {
			n = 2
		}
		var cmds []*exec.Cmd
		var wg sync.WaitGroup
		for range n {
			cmd, sc := start()
			cmds = append(cmds, cmd)
			target := 1 + r.IntN(150)
			wg.Add(1)
			go func() {
				defer wg.Done()
				seen := 0
				for seen < target && sc.Scan() {
					if line := sc.Text(); line == "ok" {
						seen++
					} else if len(line) > 3 && line[:3] != "===" && line[:3] != "---" {
						t.Errorf("child: %s", line)
					}
				}
				cmd.Process.Signal(syscall.SIGKILL)
				for sc.Scan() {
				}
			}()
		}
		wg.Wait()
		for _, cmd := range cmds {
			err := cmd.Wait()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("child did not die by SIGKILL: %v", err)
			}
		}
		blobs := checkCache(t, dir)
		total += blobs
		t.Logf("round %d: %d correct blobs after kill", round, blobs)
	}
	if total == 0 {
		t.Fatal("no blob ever survived: the test checked nothing")
	}
}
