package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/objectstore/gcstest"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
)

var (
	replicaOnce sync.Once
	replicaDir  string
	replicaErr  error
)

// replicas writes the small ARCO-ERA5-like and WeatherBench2-like stores
// with zarr-python (integration/replica/make_replica.py), once per run.
func replicas(t *testing.T) string {
	t.Helper()
	requirePython(t)
	if err := exec.Command("python3", "-c", "import zarr, numcodecs, yaml").Run(); err != nil {
		testenv.Missing(t, "zarr-python, numcodecs and PyYAML are needed (make pydeps)")
	}
	replicaOnce.Do(func() {
		replicaDir, replicaErr = os.MkdirTemp("", "zarrfs-replica-")
		if replicaErr != nil {
			return
		}
		out, err := exec.Command("python3", filepath.Join(repoRoot(t), "integration", "replica", "make_replica.py"), replicaDir).CombinedOutput()
		if err != nil {
			replicaErr = fmt.Errorf("make_replica.py: %v\n%s", err, out)
		}
	})
	if replicaErr != nil {
		t.Fatalf("writing the replicas: %v", replicaErr)
	}
	return replicaDir
}

func replicaViews(t *testing.T) []string {
	d := filepath.Join(repoRoot(t), "integration", "replica")
	return []string{filepath.Join(d, "graphcast.yaml"), filepath.Join(d, "unet.yaml")}
}

// checkReplica compares every file of the mount, views included, with
// zarr-python's reading of the replica on disk.
func checkReplica(t *testing.T, store, mnt string, views []string, extra ...string) checkResult {
	t.Helper()
	args := append([]string{filepath.Join(repoRoot(t), "integration", "replica", "check_mount.py"), store, mnt}, views...)
	cmd := exec.Command("python3", append(args, extra...)...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("check_mount.py: %v\n%s\n%s", err, out, stderr)
	}
	var r checkResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("checker output %q: %v", out, err)
	}
	for _, b := range r.Bad {
		t.Error(b)
	}
	if r.Files == 0 {
		t.Fatal("checked no files")
	}
	return r
}

func viewArgs(views []string) []string {
	var a []string
	for _, v := range views {
		a = append(a, "--view", v)
	}
	return a
}

// The replicas of ARCO-ERA5 (37 levels) and WeatherBench2 (13 levels),
// served by the GCS emulator and by a web server, mount with the
// GraphCast-like and U-Net-like views, and every value of every file
// equals zarr-python's.
func TestReplicaMounts(t *testing.T) {
	requireMountTools(t)
	dir := replicas(t)
	views := replicaViews(t)
	srv := gcstest.Start(t)
	bucket := srv.NewBucket(t)
	for _, kind := range []string{"arco", "wb2"} {
		srv.UploadDir(t, bucket, "era5/"+kind+".zarr", filepath.Join(dir, kind+".zarr"))
	}
	web := webtest.Start(t, dir)
	web.ETags.Store(true)

	for _, kind := range []string{"arco", "wb2"} {
		store := filepath.Join(dir, kind+".zarr")
		t.Run(kind+"/gcs", func(t *testing.T) {
			cacheDir := t.TempDir()
			d := mountAt(t, "gs://"+bucket+"/era5/"+kind+".zarr", t.TempDir(), cacheDir,
				append([]string{"--gcs-endpoint", srv.URL, "--gcs-anonymous", "--log-level", "debug"}, viewArgs(views)...)...)
			if !strings.Contains(d.line, "mounted gs://"+bucket+"/era5/"+kind+".zarr") {
				t.Errorf("mounted line %q", d.line)
			}
			r := checkReplica(t, store, d.mnt, views)
			t.Logf("%d files equal zarr-python's", r.Files)
			if n := countFiles(filepath.Join(cacheDir, "chunks")); n == 0 {
				t.Error("no source chunk reached the cache's chunk tier")
			}
		})
		t.Run(kind+"/http", func(t *testing.T) {
			before := web.Requests()
			d := mountAt(t, web.Join(kind+".zarr"), t.TempDir(), t.TempDir(), viewArgs(views)...)
			checkReplica(t, store, d.mnt, views)
			if web.Requests() == before {
				t.Fatal("the web server saw no request")
			}
		})
	}

	t.Run("STORAGE_EMULATOR_HOST", func(t *testing.T) {
		t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(srv.URL, "http://"))
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
		d := mount(t, "gs://"+bucket+"/era5/wb2.zarr")
		checkReplica(t, filepath.Join(dir, "wb2.zarr"), d.mnt, nil)
	})

	t.Run("gcs faults", func(t *testing.T) {
		p, err := faultproxy.New(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		kinds := []faultproxy.Fault{
			{Kind: faultproxy.Status, Status: 503},
			{Kind: faultproxy.Status, Status: 500},
			{Kind: faultproxy.Reset, After: 7},
			{Kind: faultproxy.Truncate, After: 11},
			{Kind: faultproxy.Status, Status: 429},
		}
		p.SetRule(faultproxy.Every(3, faultproxy.ObjectGets, kinds...))
		d := mountAt(t, "gs://"+bucket+"/era5/arco.zarr", t.TempDir(), t.TempDir(),
			append([]string{"--gcs-endpoint", p.URL, "--gcs-anonymous"}, viewArgs(views)...)...)
		checkReplica(t, filepath.Join(dir, "arco.zarr"), d.mnt, views)
		if p.Faults() == 0 {
			t.Fatal("the proxy injected no fault")
		}
		t.Logf("%d faults injected over %d requests", p.Faults(), p.Requests())
	})

	t.Run("http faults", func(t *testing.T) {
		p, err := faultproxy.New(web.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		p.SetRule(faultproxy.Every(3, func(req *http.Request) bool { return req.Method == http.MethodGet },
			faultproxy.Fault{Kind: faultproxy.Status, Status: 503}, faultproxy.Fault{Kind: faultproxy.Truncate, After: 9}, faultproxy.Fault{Kind: faultproxy.Reset, After: 3}))
		d := mount(t, p.URL+"/wb2.zarr", viewArgs(views)...)
		checkReplica(t, filepath.Join(dir, "wb2.zarr"), d.mnt, views)
		if p.Faults() == 0 {
			t.Fatal("the proxy injected no fault")
		}
	})
}

// writeSharded writes, with zarr-python, a consolidated v3 store whose
// array t is sharded: its reads are ranged (the index at the shard's end
// with a suffix range, then each inner chunk).
const writeSharded = `
import sys, numpy as np, zarr
g = zarr.open_group(sys.argv[1], mode='w', zarr_format=3)
a = g.create_array('t', shape=(4, 8, 16), chunks=(1, 4, 8), shards=(2, 8, 16), dtype='float32',
                   dimension_names=('time', 'latitude', 'longitude'), fill_value=float('nan'))
a[:] = np.arange(4 * 8 * 16, dtype='float32').reshape(4, 8, 16)
zarr.consolidate_metadata(sys.argv[1])
`

// A web server that ignores Range (200 with the whole object) serves the
// same values; one that sends half of every ranged body, or a body cut
// short, fails the reads that need it with EIO and logs the object, every
// other file keeps working, and nothing of the bad bodies is cached: the
// same file reads right once the server does.
func TestReplicaOddWebServers(t *testing.T) {
	requireMountTools(t)
	dir := replicas(t)
	sharded := filepath.Join(t.TempDir(), "sharded.zarr")
	python(t, writeSharded, sharded)
	t.Run("range ignored", func(t *testing.T) {
		web := webtest.Start(t, dir)
		web.IgnoreRange.Store(true)
		d := mount(t, web.Join("arco.zarr"), viewArgs(replicaViews(t))...)
		checkReplica(t, filepath.Join(dir, "arco.zarr"), d.mnt, replicaViews(t))
		web2 := webtest.Start(t, filepath.Dir(sharded))
		web2.IgnoreRange.Store(true)
		d2 := mount(t, web2.Join("sharded.zarr"))
		checkReplica(t, sharded, d2.mnt, nil)
		if web2.Ranged() == 0 {
			t.Fatal("no ranged request reached the server; the test proves nothing")
		}
	})
	t.Run("short ranges", func(t *testing.T) {
		web := webtest.Start(t, filepath.Dir(sharded))
		web.ShortRanges.Store(true)
		d := mount(t, web.Join("sharded.zarr"), "--source-timeout", "5s", "--source-stall", "2s")
		f := filepath.Join(d.mnt, "t", "1.npy")
		if errno, _ := readErrno(f); errno != syscall.EIO {
			t.Fatalf("reading %s through short ranges: %v, want EIO", f, errno)
		}
		if logs := d.logs("t/c/0/0/0"); !strings.Contains(logs, "truncated") || !strings.Contains(logs, "t/c/0/0/0") {
			t.Errorf("the daemon did not log the object and the cause:\n%s", logs)
		}
		if _, err := os.ReadFile(filepath.Join(d.mnt, "t.json")); err != nil {
			t.Errorf("a sidecar fails too: %v", err)
		}
		web.ShortRanges.Store(false)
		checkReplica(t, sharded, d.mnt, nil)
	})
	t.Run("truncated chunk", func(t *testing.T) {
		web := webtest.Start(t, dir)
		p, err := faultproxy.New(web.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		bad := "/arco.zarr/temperature/1.0.0.0"
		p.SetRule(faultproxy.Always(func(r *http.Request) bool { return r.URL.Path == bad && r.Method == http.MethodGet },
			faultproxy.Fault{Kind: faultproxy.Truncate, After: 1000}))
		d := mount(t, p.URL+"/arco.zarr", "--source-timeout", "5s", "--source-stall", "2s")
		if errno, _ := readErrno(filepath.Join(d.mnt, "temperature", "1.npy")); errno != syscall.EIO {
			t.Fatalf("reading a sample whose chunk is truncated: %v, want EIO", errno)
		}
		if logs := d.logs("temperature/1.0.0.0"); !strings.Contains(logs, "truncated") {
			t.Errorf("the daemon did not log the object and the cause:\n%s", logs)
		}
		for _, f := range []string{"temperature/0.npy", "temperature/2.npy", "2m_temperature/1.npy"} {
			if _, err := os.ReadFile(filepath.Join(d.mnt, f)); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
		p.SetRule(nil)
		checkReplica(t, filepath.Join(dir, "arco.zarr"), d.mnt, nil)
	})
}

// Over HTTP, a store without consolidated metadata, a server that wants a
// token, and one that refuses the token given, each end the command with
// one line saying what is wrong; the token is in no output.
func TestHTTPSourceErrors(t *testing.T) {
	requireMountTools(t)
	dir := replicas(t)
	plain := filepath.Join(t.TempDir(), "plain.zarr")
	copyTree(t, filepath.Join(dir, "wb2.zarr"), plain)
	os.Remove(filepath.Join(plain, ".zmetadata"))
	web := webtest.Start(t, filepath.Dir(plain))
	_, stderr, code := run(t, "inspect", web.Join("plain.zarr"))
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, ".zmetadata") || !strings.Contains(stderr, "consolidate") {
		t.Errorf("unconsolidated store over HTTP: exit %d, stderr:\n%s", code, stderr)
	}

	tok := webtest.Start(t, dir)
	const token = "secret-bearer-0123456789abcdef"
	tok.RequireToken(token)
	t.Setenv("ZARRFS_HTTP_BEARER_TOKEN", "")
	_, stderr, code = run(t, "inspect", tok.Join("arco.zarr"))
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "ZARRFS_HTTP_BEARER_TOKEN") || !strings.Contains(stderr, "401") {
		t.Errorf("no token: exit %d, stderr:\n%s", code, stderr)
	}
	t.Setenv("ZARRFS_HTTP_BEARER_TOKEN", "expired-"+token)
	_, stderr, code = run(t, "inspect", tok.Join("arco.zarr"))
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "may have expired") || strings.Contains(stderr, token) {
		t.Errorf("refused token: exit %d, stderr:\n%s", code, stderr)
	}

	t.Setenv("ZARRFS_HTTP_BEARER_TOKEN", token)
	stdout, stderr, code := run(t, "inspect", tok.Join("arco.zarr"), "--log-level", "debug")
	if code != 0 || !strings.Contains(stdout, "chunk versions: ") || strings.Contains(stdout+stderr, token) {
		t.Errorf("with the token: exit %d\n%s\n%s", code, stdout, stderr)
	}
	d := mount(t, tok.Join("arco.zarr"), append([]string{"--log-level", "debug"}, viewArgs(replicaViews(t))...)...)
	checkReplica(t, filepath.Join(dir, "arco.zarr"), d.mnt, replicaViews(t), "--samples", "1")
	d.stop(t)
	out := d.line + d.stderr.String()
	if !strings.Contains(out, "http get") {
		t.Fatal("the daemon logged no request at debug level; the check below proves nothing")
	}
	if strings.Contains(out, token) {
		t.Fatal("the bearer token appears in the daemon's output")
	}
}

// writeCDS writes, with zarr-python, a store as the new CDS service
// delivers ERA5: its time axis named valid_time.
const writeCDS = `
import sys, numpy as np, zarr
g = zarr.open_group(sys.argv[1], mode='w', zarr_format=3)
for name, dim in (('t2m', sys.argv[2]), ('msl', sys.argv[2])):
    a = g.create_array(name, shape=(3, 4, 8), chunks=(1, 4, 8), dtype='float32', dimension_names=(dim, 'latitude', 'longitude'))
    a[:] = np.arange(96, dtype='float32').reshape(3, 4, 8)
c = g.create_array(sys.argv[2], shape=(3,), chunks=(3,), dtype='int64', dimension_names=(sys.argv[2],))
c[:] = np.arange(3)
zarr.consolidate_metadata(sys.argv[1])
`

// With the default --sample-dim (time,valid_time) a store from the new CDS
// mounts one file per step, as ARCO's does; a store whose steps are named
// otherwise mounts every array whole, with one warning that says so.
func TestSampleDimNames(t *testing.T) {
	requirePython(t)
	cds := filepath.Join(t.TempDir(), "cds.zarr")
	python(t, writeCDS, cds, "valid_time")
	d := mount(t, cds)
	for _, f := range []string{"t2m/0.npy", "t2m/2.npy", "msl/1.npy", "valid_time.npy"} {
		if _, err := os.Stat(filepath.Join(d.mnt, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	checkReplica(t, cds, d.mnt, nil, "--sample-dim", "valid_time")
	if strings.Contains(d.stderr.String(), "sample dimension") {
		t.Errorf("a warning about the sample dimension:\n%s", d.stderr)
	}

	other := filepath.Join(t.TempDir(), "other.zarr")
	python(t, writeCDS, other, "step")
	d2 := mount(t, other)
	if _, err := os.Stat(filepath.Join(d2.mnt, "t2m.npy")); err != nil {
		t.Errorf("t2m is not mounted whole: %v", err)
	}
	logs := d2.logs("no array has the sample dimension")
	var warn []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "sample dimension") {
			warn = append(warn, l)
		}
	}
	if len(warn) != 1 || !strings.Contains(warn[0], "time,valid_time") || !strings.Contains(warn[0], "step") {
		t.Errorf("want one warning naming the list and the dimensions there are, got %q", warn)
	}
	// Named, the dimension mounts its samples.
	d3 := mount(t, other, "--sample-dim", "step")
	if _, err := os.Stat(filepath.Join(d3.mnt, "t2m", "1.npy")); err != nil {
		t.Errorf("--sample-dim step: %v", err)
	}
}

// A store that grows on GCS, synced as `gcloud storage rsync` does (only
// new and changed objects uploaded: each gets a new generation): a warm
// after an append decodes only the new samples and those of chunks the
// append rewrote, and a running mount shows the append and a chunk
// rewritten in place within --metadata-ttl.
func TestGrowGCS(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	srv := gcstest.Start(t)
	bucket := srv.NewBucket(t)
	local := filepath.Join(t.TempDir(), "grow.zarr")
	synced := map[string]string{}
	sync := func() {
		filepath.WalkDir(local, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(local, p)
			if sum := fmt.Sprintf("%x", sha256.Sum256(b)); synced[rel] != sum {
				srv.Put(bucket, "grow.zarr/"+filepath.ToSlash(rel), b)
				synced[rel] = sum
			}
			return nil
		})
	}
	checkGrowRemote(t, "gs://"+bucket+"/grow.zarr", local, sync, "--gcs-endpoint", srv.URL, "--gcs-anonymous")
}

// checkGrowRemote grows the store at local (growStore) and syncs it to the
// remote source src (opened with the flags ep) after each change: a warm
// after an append fills only the new samples and those whose chunks it
// rewrote, and a mount with --metadata-ttl 1s shows the append and, after
// a chunk is rewritten in place with the same size, serves its new bytes.
func checkGrowRemote(t *testing.T, src, local string, sync func(), ep ...string) {
	growStore(t, "create", local, 30)
	sync()
	cacheDir := t.TempDir()
	if files, _ := warmWork(t, src, cacheDir, ep...); files != 3*30+1 {
		t.Fatalf("first warm: %d files", files)
	}
	growStore(t, "append", local, 10)
	sync()
	files, decoded := warmWork(t, src, cacheDir, ep...)
	if want := 3*10 + 2*6 + 1; files != want || decoded < 12 || decoded > 10+16+1 {
		t.Errorf("warm after the append: %d files, %d chunks decoded; want %d files, 12 to %d chunks", files, decoded, want, 10+16+1)
	}
	d := mountAt(t, src, t.TempDir(), cacheDir, append(ep, "--metadata-ttl", "1s")...)
	if n := checkGrowMount(t, d.mnt, local); n != 3*40+1 {
		t.Errorf("checked %d files", n)
	}
	growStore(t, "append", local, 5)
	before, err := os.ReadFile(filepath.Join(d.mnt, "raw", "05.npy"))
	if err != nil {
		t.Fatal(err)
	}
	rewriteSample(t, local, 5, 0.25)
	sync()
	time.Sleep(2500 * time.Millisecond) // two TTLs and more
	if after, err := os.ReadFile(filepath.Join(d.mnt, "raw", "05.npy")); err != nil || bytes.Equal(after, before) {
		t.Fatalf("raw/05.npy two TTLs after its chunk was rewritten: %v, old bytes served %v", err, bytes.Equal(after, before))
	}
	if n := checkGrowMount(t, d.mnt, local); n != 3*45+1 {
		t.Errorf("checked %d files after the second append", n)
	}
}
