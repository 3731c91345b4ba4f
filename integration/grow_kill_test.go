package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// rawStore writes a v3 store with one float32 array r shaped (n, 64, 128)
// in uncompressed chunks of (4, 64, 128), element [t, y, x] = t*1e4 +
// y*128 + x + round. Existing chunk files are rewritten in place (same
// file, same size), as a writer that updates preliminary data does.
func rawStore(t testing.TB, dir string, n, round int) {
	t.Helper()
	doc := `{"zarr_format":3,"node_type":"array","shape":[` + strconv.Itoa(n) + `,64,128],"data_type":"float32",
 "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4,64,128]}},
 "chunk_key_encoding":{"name":"default"},"fill_value":0,
 "codecs":[{"name":"bytes","configuration":{"endian":"little"}}],"dimension_names":["time","y","x"]}`
	os.MkdirAll(filepath.Join(dir, "r"), 0o755)
	os.WriteFile(filepath.Join(dir, "zarr.json"), []byte(`{"zarr_format":3,"node_type":"group"}`), 0o644)
	os.WriteFile(filepath.Join(dir, "r", "zarr.json"), []byte(doc), 0o644)
	for c := 0; c*4 < n; c++ {
		b := make([]byte, 4*64*128*4)
		for i := range 4 {
			copy(b[i*64*128*4:], rawSample(c*4+i, round))
		}
		p := filepath.Join(dir, "r", "c", strconv.Itoa(c), "0", "0")
		os.MkdirAll(filepath.Dir(p), 0o755)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteAt(b, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func rawSample(k, round int) []byte {
	b := make([]byte, 64*128*4)
	for y := range 64 {
		for x := range 128 {
			v := float32(k*10000 + y*128 + x + round)
			binary.LittleEndian.PutUint32(b[(y*128+x)*4:], math.Float32bits(v))
		}
	}
	return b
}

// checkRawBlobs compares the cache's blobs of r with round's values and
// returns how many differ.
func checkRawBlobs(t testing.TB, cacheDir string, n, round int) int {
	t.Helper()
	bad := 0
	got := blobFiles(t, cacheDir)
	for k := range n {
		name := fmt.Sprintf("r/%0*d.npy", len(strconv.Itoa(n-1)), k)
		b, ok := got[name]
		if !ok || len(b) != 4096+64*128*4 || !bytes.Equal(b[4096:], rawSample(k, round)) {
			bad++
		}
	}
	return bad
}

// kill -9 in the middle of a revalidation, again and again: every chunk of
// the store was rewritten in place, so every blob is stale and the warm
// (which checks every blob against the store's listing) replaces them one
// by one. After each kill, a warm that runs to the end leaves every blob
// with the new bytes: no replacement cut short is taken for current. Then
// a mount with --metadata-ttl, killed while readers refill the blobs of
// the next rewrite, leaves a cache a warm completes with only correct
// blobs.
func TestGrowKill9Revalidation(t *testing.T) {
	requireMountTools(t)
	const n = 400
	src := filepath.Join(t.TempDir(), "raw.zarr")
	rawStore(t, src, n, 0)
	cacheDir := t.TempDir()
	warm(t, src, cacheDir)
	journal := filepath.Join(cacheDir, "journal")
	rng := rand.New(rand.NewPCG(3, 4))
	interrupted := 0
	for round := 1; round <= 4; round++ {
		rawStore(t, src, n, round)
		st, _ := os.Stat(journal)
		start := st.Size()
		cmd := exec.Command(zarrfsBin(t), "warm", src, "--cache", cacheDir, "--jobs", "2")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		// Kill once a growing share of the blobs were replaced (one journal
		// record each, about 100 bytes).
		target := start + int64(round*n/6)*100
	poll:
		for {
			select {
			case <-exited:
				break poll
			case <-time.After(time.Duration(1+rng.IntN(3)) * time.Millisecond):
				if st, err := os.Stat(journal); err == nil && st.Size() >= target {
					cmd.Process.Signal(syscall.SIGKILL)
					<-exited
					interrupted++
					break poll
				}
			}
		}
		if bad := checkRawBlobs(t, cacheDir, n, round); bad == 0 {
			t.Logf("round %d: the warm finished before the kill", round)
		} else {
			t.Logf("round %d: %d of %d blobs still stale after the kill", round, bad, n)
		}
		warm(t, src, cacheDir)
		if bad := checkRawBlobs(t, cacheDir, n, round); bad != 0 {
			t.Fatalf("round %d: %d blobs wrong after a warm that followed the kill", round, bad)
		}
	}
	if interrupted == 0 {
		t.Fatal("no warm was interrupted")
	}

	// A mount refreshing every 200ms, its readers refilling what a rewrite
	// made stale, killed.
	round := 5
	mnt := t.TempDir()
	cmd := exec.Command(zarrfsBin(t), "mount", src, mnt, "--cache", cacheDir, "--metadata-ttl", "200ms")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exec.Command("fusermount3", "-uz", mnt).Run()
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	deadline := time.Now().Add(30 * time.Second)
	for !isMounted(mnt) {
		if time.Now().After(deadline) {
			t.Fatal("mount not live")
		}
		time.Sleep(20 * time.Millisecond)
	}
	rawStore(t, src, n, round)
	time.Sleep(500 * time.Millisecond) // a refresh or two
	reads := make(chan int, 1)
	go func() {
		k := 0
		for ; k < n; k++ {
			if _, err := os.ReadFile(filepath.Join(mnt, "r", fmt.Sprintf("%03d.npy", k))); err != nil {
				break
			}
		}
		reads <- k
	}()
	time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	exec.Command("fusermount3", "-uz", mnt).Run()
	syscall.Unmount(mnt, syscall.MNT_DETACH)
	t.Logf("mount killed after its reader got %d of %d files", <-reads, n)
	warm(t, src, cacheDir)
	if bad := checkRawBlobs(t, cacheDir, n, round); bad != 0 {
		t.Fatalf("after the killed mount: %d blobs wrong", bad)
	}
	d := mountAt(t, src, t.TempDir(), cacheDir)
	for _, k := range []int{0, 199, 399} {
		b, err := os.ReadFile(filepath.Join(d.mnt, "r", fmt.Sprintf("%03d.npy", k)))
		if err != nil || !bytes.Equal(b[4096:], rawSample(k, round)) {
			t.Errorf("r/%03d.npy through the mount: %v", k, err)
		}
	}
}
