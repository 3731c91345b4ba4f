package integration

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/integration/miniotest"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// soakCounts are what a soak run did.
type soakCounts struct {
	reads, ok, errs, mismatches atomic.Int64
	restartErrs                 atomic.Int64 // reads that failed while the daemon was being killed or restarted
	warms, warmsOK              atomic.Int64
	restarts                    int
	peakRSS                     int64
	faults, requests            int64
	errnos                      sync.Map // errno -> *atomic.Int64
}

func (c *soakCounts) String() string {
	var en []string
	c.errnos.Range(func(k, v any) bool {
		en = append(en, fmt.Sprintf("%v=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(en)
	// Worded so that a passing run reads as one: errors and reads cut off
	// by kills are what the faults are for; wrong bytes are the failure.
	errs := strconv.FormatInt(c.errs.Load(), 10)
	if len(en) > 0 {
		errs += " (" + strings.Join(en, " ") + ")"
	}
	return fmt.Sprintf("reads %d: %d correct, %d with wrong bytes; %s answered with an error and %d cut off by a daemon kill (both allowed); "+
		"warms %d, %d completed; daemon killed and restarted %d times; faults injected into %d of %d source requests; peak RSS %d MiB",
		c.reads.Load(), c.ok.Load(), c.mismatches.Load(), errs, c.restartErrs.Load(),
		c.warms.Load(), c.warmsOK.Load(), c.restarts, c.faults, c.requests, c.peakRSS>>20)
}

// TestSoak reads a store from MinIO through a proxy that injects resets,
// stalls, 5xx answers and truncated bodies, with concurrent readers over a
// cache too small for the store (evicting all the time), concurrent warms
// of the same cache, and the daemon killed with SIGKILL and restarted on
// the same cache now and then. Every byte read is compared with a
// reference; errors are allowed (the source fails, the daemon dies), wrong
// bytes are not. The counts are printed at the end. `make test` runs it
// for 20s; ZARRFS_LONG for 5 minutes (ZARRFS_SOAK sets another duration,
// ZARRFS_SOAK_KILL the time between kills).
func TestSoak(t *testing.T) {
	requireMountTools(t)
	dur := 20 * time.Second
	if os.Getenv("ZARRFS_LONG") != "" {
		dur = 5 * time.Minute
	}
	if s := os.Getenv("ZARRFS_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		dur = d
	}
	killEvery := max(min(dur/3, 30*time.Second), 5*time.Second)
	if s := os.Getenv("ZARRFS_SOAK_KILL"); s != "" {
		// Kills more often than the default: a hunt for faults of the
		// daemon's start on a cache that others are using.
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("ZARRFS_SOAK_KILL=%s: want a positive duration (%v)", s, err)
		}
		killEvery = d
	}

	ex := zarrtest.Example{Times: 48, Levels: 2, Lat: 33, Lon: 64, TimeChunk: 4}
	local := exampleStore(t, ex)
	refDir := t.TempDir()
	warm(t, local, refDir)
	ref := blobFiles(t, refDir)
	var names []string
	var total int64
	for p, b := range ref {
		names = append(names, p)
		total += int64(len(b))
	}
	sort.Strings(names)

	srv := miniotest.Start(t)
	bucket := srv.NewBucket(t)
	srv.UploadDir(t, bucket, "era5.zarr", local)
	s3Env(t, srv)
	p, err := faultproxy.New(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	kinds := []faultproxy.Fault{
		{Kind: faultproxy.Reset, After: 100},
		{Kind: faultproxy.Truncate, After: 200},
		{Kind: faultproxy.Status, Status: 503},
		{Kind: faultproxy.Status, Status: 500},
		{Kind: faultproxy.Stall, After: 50, StallFor: 3 * time.Second},
		{Kind: faultproxy.StallHeaders, StallFor: 3 * time.Second},
	}
	var rmu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 8))
	p.SetRule(func(req *http.Request, _ int64) faultproxy.Fault {
		if !faultproxy.ObjectGets(req) {
			return faultproxy.Fault{}
		}
		rmu.Lock()
		defer rmu.Unlock()
		if rng.Float64() < 0.08 {
			return kinds[rng.IntN(len(kinds))]
		}
		return faultproxy.Fault{}
	})

	src := "s3://" + bucket + "/era5.zarr"
	flags := []string{"--s3-endpoint", p.URL, "--source-stall", "1s", "--source-timeout", "5s", "--cache-size", itoa64(total / 4)}
	mnt, cacheDir := t.TempDir(), t.TempDir()
	const memory = 256 << 20
	var c soakCounts
	// gen is odd while the daemon is being killed and restarted; a read
	// that fails while it is, or across a change of it, is counted apart.
	var gen atomic.Int64
	var dmu sync.Mutex       // guards d
	var logs strings.Builder // of the daemons killed
	d := mountAt(t, src, mnt, cacheDir, append(flags, "--memory", itoa64(memory))...)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				name := names[r.IntN(len(names))]
				g := gen.Load()
				b, err := os.ReadFile(filepath.Join(mnt, name))
				restarting := g%2 == 1 || gen.Load() != g
				c.reads.Add(1)
				switch {
				case err == nil && bytes.Equal(b, ref[name]):
					c.ok.Add(1)
				case err == nil:
					c.mismatches.Add(1)
					t.Errorf("%s: %d bytes differ from the reference", name, len(b))
				default:
					var en syscall.Errno
					if !errors.As(err, &en) {
						en = 0
					}
					time.Sleep(10 * time.Millisecond) // failures are fast: do not spin
					if restarting {
						c.restartErrs.Add(1)
						continue
					}
					c.errs.Add(1)
					v, _ := c.errnos.LoadOrStore(en.Error(), new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
				}
			}
		}()
	}
	// Warms of the same cache, through the same faulty source.
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(9, 9))
		dirs := []string{"t", "z", "u10", "time.npy", "lsm.npy"}
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			cmd := exec.Command(zarrfsBin(t), "warm", src, "--cache", cacheDir, "--only", dirs[r.IntN(len(dirs))],
				"--samples", fmt.Sprintf("%d:%d", r.IntN(40), 40+r.IntN(8)), "--s3-endpoint", p.URL, "--source-stall", "1s", "--source-timeout", "5s", "--jobs", "2")
			c.warms.Add(1)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if cmd.Run() == nil {
				c.warmsOK.Add(1)
			} else {
				lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
				t.Logf("warm failed: %s", lines[len(lines)-1])
			}
		}
	}()
	// The daemon's memory, sampled.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			dmu.Lock()
			if rss := rssBytes(d.cmd.Process.Pid); rss > c.peakRSS {
				c.peakRSS = rss
			}
			dmu.Unlock()
		}
	}()

	deadline := time.Now().Add(dur)
	for time.Now().Add(killEvery).Before(deadline) {
		time.Sleep(killEvery)
		gen.Add(1)
		dmu.Lock()
		d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.done
		logs.WriteString(d.stderr.String())
		d = mountAt(t, src, mnt, cacheDir, append(flags, "--memory", itoa64(memory))...)
		c.restarts++
		dmu.Unlock()
		gen.Add(1)
	}
	time.Sleep(time.Until(deadline))
	close(stop)
	wg.Wait()
	c.faults, c.requests = p.Faults(), p.Requests()
	all := logs.String() + d.stderr.String()
	summary := fmt.Sprintf("soak %v: %v; the daemon logged %d fills given up and %d source outages (breaker open), which the faults cause",
		dur, &c, strings.Count(all, "cannot fill file"), strings.Count(all, "failing reads at once until"))
	t.Log(summary)
	for _, l := range strings.Split(all, "\n") {
		if strings.Contains(l, "failing reads at once") || strings.Contains(l, "answering again") {
			t.Log(l)
		}
	}
	fmt.Println(summary)

	if c.mismatches.Load() != 0 {
		t.Errorf("%d reads returned wrong bytes", c.mismatches.Load())
	}
	if n := c.reads.Load() - c.restartErrs.Load(); c.ok.Load() < n/4 || c.ok.Load() == 0 {
		t.Errorf("only %d of %d reads succeeded while the daemon was up", c.ok.Load(), n)
	}
	if c.peakRSS > memory {
		t.Errorf("daemon RSS peaked at %d MiB, budget %d MiB", c.peakRSS>>20, memory>>20)
	}
	if !alive(d) {
		t.Fatalf("daemon died: %v\n%s", d.err, d.stderr)
	}
	// The cache holds nothing but complete, correct blobs.
	d.stop(t)
	for p, b := range blobFiles(t, cacheDir) {
		if !bytes.Equal(b, ref[p]) {
			t.Errorf("cache holds a wrong %s", p)
		}
	}
}
