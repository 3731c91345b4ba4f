package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/integration/miniotest"
)

// stall holds a response's headers back for longer than any test waits.
var stall = faultproxy.Fault{Kind: faultproxy.StallHeaders, StallFor: 5 * time.Minute}

// Files of public_a.zarr that share no chunk, so each read needs the source
// (nothing of it is in the cache's chunk tier yet). The first needs one
// chunk: a lone request, the slowest case for the breaker.
var independentFiles = []string{
	"time.npy", "t/00.npy", "t/04.npy", "t/08.npy", "z/00.npy", "z/05.npy", "z/10.npy",
	"q/00.npy", "q/06.npy", "u10/00.npy", "u10/07.npy",
	"sub/sp/00.npy", "sub/sp/03.npy", "sub/sp/06.npy", "sub/sp/09.npy",
}

// outage measures a source outage on a mount: the time to the first EIO
// after the source goes silent, how fast reads fail while it is down, and
// the time from the source answering again to the first successful read.
type outage struct {
	firstEIO   time.Duration
	slowestEIO time.Duration // of concurrent reads once the breaker is open
	recover    time.Duration
}

func (o outage) String() string {
	return fmt.Sprintf("first EIO after %v, EIO while down within %v, recovered %v after the source answered",
		o.firstEIO.Round(10*time.Millisecond), o.slowestEIO.Round(time.Millisecond), o.recover.Round(10*time.Millisecond))
}

// measureOutage silences the source with down, reads with readers
// concurrent readers, then calls up and waits for reads to work again.
func measureOutage(t *testing.T, mnt string, readers int, down, up func()) outage {
	t.Helper()
	files := append([]string(nil), independentFiles...)
	next := func() string {
		f := files[0]
		files = files[1:]
		return f
	}
	var o outage
	down()
	// The first reads: each waits for the source until the deadlines end it.
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := time.Now()
	for range readers {
		f := filepath.Join(mnt, next())
		wg.Add(1)
		go func() {
			defer wg.Done()
			en, took := readErrno(f)
			if en != syscall.EIO {
				t.Errorf("%s with the source silent: errno %v, want EIO", f, en)
			}
			mu.Lock()
			o.firstEIO = max(o.firstEIO, took)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("%d readers got EIO within %v of the source going silent", readers, time.Since(start))
	// Later reads fail at once.
	for range 2 {
		f := filepath.Join(mnt, next())
		en, took := readErrno(f)
		if en != syscall.EIO {
			t.Errorf("%s while the source is down: errno %v, want EIO", f, en)
		}
		o.slowestEIO = max(o.slowestEIO, took)
	}
	up()
	start = time.Now()
	f := filepath.Join(mnt, next())
	for {
		if en, _ := readErrno(f); en == 0 {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("%s: no successful read within 60s of the source answering again", f)
		}
		time.Sleep(50 * time.Millisecond)
	}
	o.recover = time.Since(start)
	return o
}

// A source that stops answering (a proxy holding every request, then a
// MinIO frozen with SIGSTOP) fails reads with EIO within the deadlines,
// later reads at once, and the mount recovers by itself when the source
// answers again; the daemon logs the outage in a few lines, not one per
// request. ZARRFS_LONG runs it with the default deadlines too (the figures
// in BENCHMARKS.md).
// publicOnMinIO serves public_a.zarr from a MinIO of its own and returns
// the server and the store's s3:// URL (its bucket is the host part).
func publicOnMinIO(t *testing.T) (*miniotest.Server, string) {
	t.Helper()
	requireMountTools(t)
	fx := fixturesDir(t)
	srv := miniotest.Start(t)
	bucket := srv.NewBucket(t)
	srv.UploadDir(t, bucket, "era5/public_a.zarr", filepath.Join(fx, "public_a.zarr"))
	s3Env(t, srv)
	return srv, "s3://" + bucket + "/era5/public_a.zarr"
}

// proxyTo starts a fault proxy in front of target, closed when t ends.
func proxyTo(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestSourceOutage(t *testing.T) {
	srv, src := publicOnMinIO(t)

	type setting struct {
		name     string
		args     []string
		firstEIO time.Duration // bound on the first EIO
	}
	settings := []setting{{"short deadlines", []string{"--source-stall", "2s", "--source-timeout", "10s"}, 12 * time.Second}}
	if os.Getenv("ZARRFS_LONG") != "" {
		settings = append(settings, setting{"defaults", nil, 32 * time.Second})
	}
	for _, s := range settings {
		t.Run(s.name+"/proxy stalls", func(t *testing.T) {
			p := proxyTo(t, srv.Endpoint)
			d := mountAt(t, src, t.TempDir(), t.TempDir(), append([]string{"--s3-endpoint", p.URL, "--readahead", "0"}, s.args...)...)
			o := measureOutage(t, d.mnt, 1,
				func() {
					p.SetRule(faultproxy.Always(nil, faultproxy.Fault{Kind: faultproxy.StallHeaders, StallFor: 5 * time.Minute}))
				},
				func() { p.SetRule(nil) })
			t.Logf("%s: %v", s.name, o)
			checkOutage(t, d, o, s.firstEIO)
		})
		t.Run(s.name+"/minio frozen", func(t *testing.T) {
			d := mountAt(t, src, t.TempDir(), t.TempDir(), append([]string{"--s3-endpoint", srv.Endpoint, "--readahead", "0"}, s.args...)...)
			o := measureOutage(t, d.mnt, 8,
				func() {
					if err := srv.Freeze(); err != nil {
						t.Fatal(err)
					}
				},
				func() { srv.Thaw() })
			t.Logf("%s, 8 readers: %v", s.name, o)
			checkOutage(t, d, o, s.firstEIO)
		})
	}
}

func checkOutage(t *testing.T, d *daemon, o outage, firstEIO time.Duration) {
	t.Helper()
	if o.firstEIO > firstEIO {
		t.Errorf("first EIO after %v, want within %v", o.firstEIO, firstEIO)
	}
	if o.slowestEIO > time.Second {
		t.Errorf("reads while the source is down took up to %v, want to fail at once", o.slowestEIO)
	}
	if o.recover > 10*time.Second {
		t.Errorf("recovered %v after the source answered, want within 10s", o.recover)
	}
	if !alive(d) {
		t.Fatalf("daemon died: %v", d.err)
	}
	logs := d.logs("source not answering", "source answering again")
	t.Logf("daemon log:\n%s", logs)
	if n := strings.Count(logs, "\n"); n > 40 {
		t.Errorf("%d log lines for one outage:\n%s", n, logs)
	}
	if !strings.Contains(logs, "source not answering") || !strings.Contains(logs, "source answering again") {
		t.Errorf("outage not logged:\n%s", logs)
	}
}

// A command that starts while its source is silent waits for it, up to
// --source-timeout, instead of failing when the breaker opens: a mount
// whose first metadata reads stall twice (the breaker opens) goes live once
// the source answers, and says so in one line; a source that never answers
// fails the mount within about --source-timeout, with a line naming it.
// (The soak, which restarts the daemon through a faulty proxy, met the
// first case now and then: the restarted mount exited.)
func TestStartWhileSourceSilent(t *testing.T) {
	srv, src := publicOnMinIO(t)
	args := []string{"--source-stall", "500ms", "--source-timeout", "8s", "--readahead", "0"}

	t.Run("silent at first", func(t *testing.T) {
		p := proxyTo(t, srv.Endpoint)
		p.SetRule(faultproxy.Sequence(faultproxy.ObjectGets, stall, stall, stall))
		d := mountAt(t, src, t.TempDir(), t.TempDir(), append([]string{"--s3-endpoint", p.URL}, args...)...)
		logs := d.logs("source not answering while opening the store")
		if !strings.Contains(logs, "source not answering while opening the store") {
			t.Errorf("the wait at the start is not logged:\n%s", logs)
		}
		if p.Faults() < 2 {
			t.Errorf("%d requests stalled, want the breaker opened by 2 or more", p.Faults())
		}
		b, err := os.ReadFile(filepath.Join(d.mnt, "t", "00.npy"))
		if err != nil || len(b) == 0 {
			t.Fatalf("a read once the source answers: %d bytes, %v", len(b), err)
		}
	})

	t.Run("never answers", func(t *testing.T) {
		p := proxyTo(t, srv.Endpoint)
		p.SetRule(faultproxy.Always(faultproxy.ObjectGets, stall))
		// Bounded, so that a mount that went live fails the test instead
		// of holding it.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, zarrfsBin(t), append([]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--s3-endpoint", p.URL}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		start := time.Now()
		err := cmd.Run()
		took := time.Since(start)
		if err == nil {
			t.Fatal("the mount of a source that never answers succeeded")
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		last := lines[len(lines)-1]
		if !strings.Contains(last, "source not answering") || !strings.Contains(last, src) {
			t.Errorf("last line %q: want the source named, not answering\n%s", last, stderr.String())
		}
		// The budget less a retry interval at least; at most the budget,
		// the try under way then (two stalls and their backoff, about
		// 1.3s) and the process's start, with room for a slow machine.
		if took < 8*time.Second-2*time.Second || took > 8*time.Second+5*time.Second {
			t.Errorf("the mount gave up after %v, want about --source-timeout (8s)", took)
		}
		t.Logf("gave up after %v: %s", took.Round(10*time.Millisecond), last)
	})
}

// A remote virtual store whose reference file does not answer at first:
// `zarrfs warm` waits for it as for the metadata, instead of failing the
// moment the first reads open the breaker. The store is a kerchunk JSON on
// an HTTP server behind the fault proxy, one array whose chunks are ranges
// of a file beside it.
func TestStartWhileVirtualSourceSilent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	os.MkdirAll(dir, 0o755)
	data := make([]byte, 4*8*4) // (time 4, x 8) float32, one chunk a step
	for i := range data {
		data[i] = byte(i)
	}
	os.WriteFile(filepath.Join(dir, "data.bin"), data, 0o644)
	refs := `{"version": 1, "refs": {".zgroup": "{\"zarr_format\": 2}",
		"a/.zarray": "{\"zarr_format\": 2, \"shape\": [4, 8], \"chunks\": [1, 8], \"dtype\": \"<f4\", \"compressor\": null, \"filters\": null, \"fill_value\": 0, \"order\": \"C\"}",
		"a/.zattrs": "{\"_ARRAY_DIMENSIONS\": [\"time\", \"x\"]}"`
	for k := range 4 {
		refs += fmt.Sprintf(`, "a/%d.0": ["data.bin", %d, 32]`, k, 32*k)
	}
	os.WriteFile(filepath.Join(dir, "refs.json"), []byte(refs+"}}"), 0o644)
	srv := httptest.NewServer(http.FileServer(http.Dir(filepath.Dir(dir))))
	defer srv.Close()
	p := proxyTo(t, srv.URL)
	// The reference file's first three GETs stall: two open the first
	// try's breaker, the third is the second try's first.
	p.SetRule(faultproxy.Sequence(faultproxy.ObjectGets, stall, stall, stall))
	cache := t.TempDir()
	out, stderr, code := run(t, "warm", p.URL+"/d/refs.json", "--cache", cache, "--source-stall", "500ms", "--source-timeout", "8s")
	if code != 0 {
		t.Fatalf("warm of a reference file silent at first: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(stderr, "source not answering while opening the source") {
		t.Errorf("the wait is not logged:\n%s", stderr)
	}
	if p.Faults() != 3 {
		t.Errorf("%d requests stalled, want 3", p.Faults())
	}
	// Every sample warmed, with the file's bytes.
	blobs := blobFiles(t, cache)
	if len(blobs) != 4 {
		t.Fatalf("%d blobs warmed, want 4\n%s", len(blobs), out)
	}
	for k := range 4 {
		name := fmt.Sprintf("a/%d.npy", k)
		got := blobs[name]
		if len(got) < 32 || !bytes.Equal(got[len(got)-32:], data[32*k:32*k+32]) {
			t.Errorf("%s: %d bytes; want step %d's bytes at its end", name, len(got), k)
		}
	}
}

// listings matches S3 ListObjects requests.
func listings(req *http.Request) bool {
	return req.Method == http.MethodGet && strings.Contains(req.URL.RawQuery, "list-type")
}

// A warm run again over a warm cache learns what is warm from the chunks'
// versions, requests of their own: a source silent at that moment is
// waited for as at the open, instead of failing the command.
func TestWarmAgainWhileSourceSilent(t *testing.T) {
	srv, src := publicOnMinIO(t)
	p := proxyTo(t, srv.Endpoint)
	cache := t.TempDir()
	args := []string{"warm", src, "--cache", cache, "--s3-endpoint", p.URL, "--source-stall", "500ms", "--source-timeout", "8s"}
	if out, stderr, code := run(t, args...); code != 0 {
		t.Fatalf("first warm: exit %d\n%s%s", code, out, stderr)
	}
	before := p.Requests()
	// The open's listings of the store and its group pass; the first three
	// listings of an array's chunks (their versions) after it stall.
	p.SetRule(faultproxy.Sequence(listings, faultproxy.Fault{}, faultproxy.Fault{}, stall, stall, stall))
	out, stderr, code := run(t, args...)
	if code != 0 {
		t.Fatalf("warm again, listings silent at first: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(stderr, "source not answering while finding what is already warm") {
		t.Errorf("the wait is not logged:\n%s", stderr)
	}
	if p.Faults() != 3 || !strings.Contains(out, "nothing to do") {
		t.Errorf("%d requests stalled (want 3), %d requests in all; output:\n%s", p.Faults(), p.Requests()-before, out)
	}
}
