package integration

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// warm runs `zarrfs warm` and returns its stdout; it fails the test on a
// non-zero exit.
func warm(t testing.TB, src, cacheDir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(zarrfsBin(t), append([]string{"warm", src, "--cache", cacheDir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("zarrfs warm %v: %v\n%s\n%s", args, err, out, stderr.String())
	}
	return string(out)
}

// blobFiles lists the .npy files under a cache's blob tier, relative to
// their layout directory, with their contents.
func blobFiles(t testing.TB, cacheDir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	root := filepath.Join(cacheDir, "blobs")
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(p, ".npy") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		_, rest, _ := strings.Cut(filepath.ToSlash(rel), "/") // drop the layout directory
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[rest] = b
		return nil
	})
	return out
}

func exampleStore(t testing.TB, ex zarrtest.Example) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "era5.zarr")
	if err := ex.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Warm, then mount on the same cache: every warmed file is served
// correctly without reading, decoding or filling anything; the mount only
// asks each chunk's version (a stat). Its metrics count the work. (A
// chunk changed, even at the same size with its modification time put
// back, or deleted, is a change of the store that the mount must follow;
// see grow_test.go and stale_test.go.)
func TestWarmThenServeWithoutSource(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	fx := fixturesDir(t)
	for _, store := range []string{"public_a.zarr", "public_b.zarr"} {
		t.Run(store, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), store)
			copyTree(t, filepath.Join(fx, store), src)
			cacheDir := t.TempDir()
			out := warm(t, src, cacheDir)
			if !strings.Contains(out, "zarrfs: warmed ") {
				t.Fatalf("no summary line:\n%s", out)
			}
			if out2 := warm(t, src, cacheDir); !strings.Contains(out2, "nothing to do") {
				t.Fatalf("second warm did work:\n%s", out2)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			d := mountAt(t, src, t.TempDir(), cacheDir, "--metrics", addr)
			r := runCheck(t, checkTensorstore, d.mnt, fx, store)
			if r.Files == 0 {
				t.Fatal("checked no files")
			}
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, m := range []string{"zarrfs_source_requests_total 0\n", "zarrfs_chunks_decoded_total 0\n", "zarrfs_cache_misses_total 0\n"} {
				if !strings.Contains(string(body), m) {
					t.Errorf("a mount of a warm cache did work: metrics lack %q:\n%.3000s", strings.TrimSpace(m), body)
				}
			}
		})
	}
}

// The union of every rank's warm is the full warm, without overlap, for
// both shardings, and contiguous shards match DALI's formula.
func TestWarmRankWorld(t *testing.T) {
	ex := zarrtest.Example{Times: 10, Levels: 2, Lat: 9, Lon: 16, TimeChunk: 3}
	src := exampleStore(t, ex)
	full := blobFiles(t, func() string { c := t.TempDir(); warm(t, src, c); return c }())
	const world = 3
	for _, mode := range []string{"contiguous", "interleaved"} {
		t.Run(mode, func(t *testing.T) {
			union := map[string]int{}
			for rank := range world {
				c := t.TempDir()
				warm(t, src, c, "--rank", itoa(rank), "--world", itoa(world), "--shard", mode)
				for p, b := range blobFiles(t, c) {
					if !bytes.Equal(b, full[p]) {
						t.Errorf("rank %d: %s differs from the full warm", rank, p)
					}
					if strings.Contains(p, "/") {
						union[p]++
						k := sampleIndex(p)
						var mine bool
						if mode == "contiguous" {
							mine = k >= rank*ex.Times/world && k < (rank+1)*ex.Times/world
						} else {
							mine = k%world == rank
						}
						if !mine {
							t.Errorf("rank %d warmed %s, not its share", rank, p)
						}
					}
				}
			}
			for p := range full {
				if strings.Contains(p, "/") && union[p] != 1 {
					t.Errorf("%s warmed by %d ranks, want 1", p, union[p])
				}
			}
		})
	}
}

// --samples and --rank/--world together split the selected range, not the
// whole directory: --samples 4:10 --rank 0 --world 2 warms 04-06.
func TestWarmSamplesWithRank(t *testing.T) {
	ex := zarrtest.Example{Times: 12, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 3}
	src := exampleStore(t, ex)
	for _, tc := range []struct {
		rank int
		mode string
		want []int
	}{
		{0, "contiguous", []int{4, 5, 6}},
		{1, "contiguous", []int{7, 8, 9}},
		{0, "interleaved", []int{4, 6, 8}},
		{1, "interleaved", []int{5, 7, 9}},
	} {
		c := t.TempDir()
		warm(t, src, c, "--samples", "4:10", "--rank", itoa(tc.rank), "--world", "2", "--shard", tc.mode)
		got := map[string][]int{}
		for p := range blobFiles(t, c) {
			if dir, _, ok := strings.Cut(p, "/"); ok {
				got[dir] = append(got[dir], sampleIndex(p))
			}
		}
		if len(got) == 0 {
			t.Fatalf("rank %d %s: no samples warmed", tc.rank, tc.mode)
		}
		for dir, ks := range got {
			slices.Sort(ks)
			if !slices.Equal(ks, tc.want) {
				t.Errorf("--samples 4:10 --rank %d --world 2 --shard %s warmed %s samples %v, want %v", tc.rank, tc.mode, dir, ks, tc.want)
			}
		}
	}
}

func sampleIndex(p string) int {
	base := strings.TrimSuffix(filepath.Base(p), ".npy")
	n := 0
	for _, c := range base {
		n = n*10 + int(c-'0')
	}
	return n
}

func itoa(i int) string { return itoa64(int64(i)) }

// kill -9 at random moments during warm, then warm again: the cache ends
// complete and byte-identical to an uninterrupted warm, and holds no
// temporary files.
func TestWarmKill9Resume(t *testing.T) {
	ex := zarrtest.Example{Times: 40, Levels: 3, Lat: 121, Lon: 240, TimeChunk: 4}
	src := exampleStore(t, ex)
	ref := t.TempDir()
	warm(t, src, ref)
	want := blobFiles(t, ref)
	cacheDir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	interrupted := 0
	for round := range 6 {
		cmd := exec.Command(zarrfsBin(t), "warm", src, "--cache", cacheDir, "--jobs", "2")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill once the cache holds a growing share of the files (the
		// polling is coarse, so the kill lands at a random point of a fill).
		target := (round + 1) * len(want) / 8
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
	poll:
		for {
			select {
			case <-exited:
				break poll
			case <-time.After(time.Duration(1+rng.IntN(5)) * time.Millisecond):
				if countNPY(filepath.Join(cacheDir, "blobs")) >= target {
					cmd.Process.Signal(syscall.SIGKILL)
					<-exited
					break poll
				}
			}
		}
		// Whatever is visible now must be complete and correct.
		visible := blobFiles(t, cacheDir)
		t.Logf("round %d: %d of %d files visible", round, len(visible), len(want))
		if len(visible) < len(want) {
			interrupted++
		}
		for p, b := range visible {
			if !bytes.Equal(b, want[p]) {
				t.Fatalf("round %d: %s is visible but differs from the reference (%d vs %d bytes)", round, p, len(b), len(want[p]))
			}
		}
	}
	if interrupted == 0 {
		t.Fatal("no round was interrupted before the warm finished")
	}
	warm(t, src, cacheDir)
	got := blobFiles(t, cacheDir)
	if len(got) != len(want) {
		t.Fatalf("after resuming: %d files, want %d", len(got), len(want))
	}
	for p, b := range want {
		if !bytes.Equal(got[p], b) {
			t.Errorf("after resuming: %s differs", p)
		}
	}
	if out := warm(t, src, cacheDir); !strings.Contains(out, "nothing to do") {
		t.Errorf("a third warm did work:\n%s", out)
	}
	tmp, _ := filepath.Glob(filepath.Join(cacheDir, "tmp", "*", "*"))
	if len(tmp) > 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
}

// With a budget smaller than the data, the cache directory never holds more
// than the budget plus the blobs in flight, and a file held open through
// the mount survives eviction and reads correctly to the end.
func TestCacheBudgetAndPinnedFile(t *testing.T) {
	requireMountTools(t)
	ex := zarrtest.Example{Times: 30, Levels: 2, Lat: 91, Lon: 180, TimeChunk: 1}
	src := exampleStore(t, ex)
	ref := t.TempDir()
	warm(t, src, ref)
	want := blobFiles(t, ref)
	var total, biggest int64
	for _, b := range want {
		total += int64(len(b))
		biggest = max(biggest, int64(len(b)))
	}
	budget := total / 4
	cacheDir := t.TempDir()
	d := mountAt(t, src, t.TempDir(), cacheDir, "--cache-size", itoa64(budget), "--readahead", "0")

	held, err := os.Open(filepath.Join(d.mnt, "t", "00.npy"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	head := make([]byte, 4096)
	if _, err := held.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	var peak int64
	names := []string{"t", "z", "u10"}
	for _, arr := range names {
		ents, _ := os.ReadDir(filepath.Join(d.mnt, arr))
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(d.mnt, arr, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, want[arr+"/"+e.Name()]) {
				t.Fatalf("%s/%s differs", arr, e.Name())
			}
			peak = max(peak, dirBytes(filepath.Join(cacheDir, "blobs"))+dirBytes(filepath.Join(cacheDir, "tmp")))
		}
	}
	if limit := budget + int64(len(want["t/00.npy"])) + biggest; peak > limit {
		t.Errorf("cache peaked at %d bytes; budget %d + held file + one blob = %d", peak, budget, limit)
	}
	rest, err := os.ReadFile(held.Name())
	if err != nil {
		t.Fatal(err)
	}
	all := make([]byte, len(want["t/00.npy"]))
	if _, err := held.ReadAt(all, 0); err != nil {
		t.Fatalf("reading the held file to the end: %v", err)
	}
	if !bytes.Equal(all, want["t/00.npy"]) || !bytes.Equal(rest, want["t/00.npy"]) {
		t.Error("the file held open changed under eviction pressure")
	}
}

func itoa64(n int64) string {
	var b []byte
	if n == 0 {
		return "0"
	}
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

func countNPY(dir string) int {
	n := 0
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.HasSuffix(p, ".npy") {
			n++
		}
		return nil
	})
	return n
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// `zarrfs warm --only t1` warms what a reader of t1/ reads with its
// samples: zarrfs.torch's SampleDataset reads time.npy for each item's
// coordinate, and warm lists it among what it warmed. A mount of that
// cache then serves the dataset's every item and coordinate without
// filling anything (its metrics count no miss).
func TestWarmOnlyBringsCoordinates(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	if err := exec.Command("python3", "-c", "import zarrfs.torch").Run(); err != nil {
		testenv.Missing(t, "python3 cannot import zarrfs.torch (make pydeps)")
	}
	src := filepath.Join(t.TempDir(), "grow.zarr")
	growStore(t, "create", src, 6)
	cacheDir := t.TempDir()
	out := warm(t, src, cacheDir, "--only", "t1")
	if !strings.Contains(out, "t1/\t") || !strings.Contains(out, "time.npy\t") || !strings.Contains(out, "warmed 7 files") {
		t.Fatalf("warm --only t1 did not warm and list t1/ and time.npy:\n%s", out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d := mountAt(t, src, t.TempDir(), cacheDir, "--metrics", addr)
	res := python(t, `
import sys
from zarrfs.torch import SampleDataset
ds = SampleDataset(sys.argv[1] + '/t1')
items = [ds[i] for i in range(len(ds))]
assert [int(c) for _, c in items] == list(range(6)), [c for _, c in items]
print(len(items))
`, d.mnt)
	if strings.TrimSpace(res) != "6" {
		t.Fatalf("SampleDataset read %q items, want 6", res)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "zarrfs_cache_misses_total 0\n") || !strings.Contains(string(body), "zarrfs_source_requests_total 0\n") {
		t.Errorf("a reader of the warmed t1/ filled files: %s", regexpLines(body, "zarrfs_cache_misses_total|zarrfs_source_requests_total"))
	}
}

// regexpLines returns the lines of b that match re.
func regexpLines(b []byte, re string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if regexp.MustCompile(re).MatchString(l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}
