package integration

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/zarrfs/zarrfs/internal/testenv"
)

var (
	kerchunkOnce sync.Once
	kerchunkDir  string
	kerchunkErr  error
)

// requireVirtualWriters needs the Python writers of the virtual-store
// fixtures (integration/requirements.txt).
func requireVirtualWriters(t testing.TB, modules ...string) {
	t.Helper()
	requirePython(t)
	imp := "import " + strings.Join(modules, ", ")
	if out, err := exec.Command("python3", "-c", imp).CombinedOutput(); err != nil {
		testenv.Missing(t, "python3 cannot %s (make pydeps): %s", imp, out)
	}
}

// kerchunkFixture writes, once per run, the NetCDF4/HDF5 files and their
// kerchunk and VirtualiZarr reference sets (virtual/make_kerchunk.py).
func kerchunkFixture(t *testing.T) string {
	t.Helper()
	requireVirtualWriters(t, "h5py", "netCDF4", "h5netcdf", "kerchunk", "virtualizarr", "xarray")
	kerchunkOnce.Do(func() {
		kerchunkDir, kerchunkErr = os.MkdirTemp("", "zarrfs-kerchunk-")
		if kerchunkErr != nil {
			return
		}
		out, err := exec.Command("python3", filepath.Join(repoRoot(t), "integration", "virtual", "make_kerchunk.py"), kerchunkDir).CombinedOutput()
		if err != nil {
			kerchunkErr = errors.New(string(out))
		}
	})
	if kerchunkErr != nil {
		t.Fatalf("make_kerchunk.py: %v", kerchunkErr)
	}
	return kerchunkDir
}

// checkVirtual compares the mount's arrays with xarray reading the
// original files (virtual/check.py).
func checkVirtual(t *testing.T, mnt, out string, vars ...string) {
	t.Helper()
	args := append([]string{filepath.Join(repoRoot(t), "integration", "virtual", "check.py"), mnt, out}, vars...)
	res, err := exec.Command("python3", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("check.py %v: %v\n%s", vars, err, res)
	}
	if n := strings.Count(string(res), "values equal"); n != len(vars) {
		t.Fatalf("check.py checked %d arrays, want %d:\n%s", n, len(vars), res)
	}
}

// Reference sets made by kerchunk (JSON and Parquet) and VirtualiZarr,
// mounted for real and read with numpy, equal xarray reading the NetCDF4
// and HDF5 files they point into.
func TestKerchunkMount(t *testing.T) {
	out := kerchunkFixture(t)
	for _, c := range []struct {
		name, src string
		vars      []string
		args      []string
	}{
		{"json", filepath.Join(out, "kerchunk.json"), []string{"t", "q", "lsm", "lat", "time"}, nil},
		{"reference url", "reference://" + filepath.Join(out, "kerchunk.json"), []string{"t", "lsm"}, nil},
		// Its targets lie beside the Parquet folder, not in it.
		{"parquet", filepath.Join(out, "kerchunk.parq"), []string{"t", "q", "lsm", "lat", "time"}, []string{"--ref-base", out}},
		{"virtualizarr fletcher32", filepath.Join(out, "virtualizarr.json"), []string{"x"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := mount(t, c.src, c.args...)
			checkVirtual(t, d.mnt, out, c.vars...)
		})
	}
}

// A Parquet reference set reads targets in its own folder only, not the
// files beside it (a reference set in a home folder would reach all of
// it): those are named with --ref-base, which reads nothing beyond it.
func TestKerchunkParquetScope(t *testing.T) {
	out := kerchunkFixture(t)
	parq := filepath.Join(out, "kerchunk.parq")
	for _, args := range [][]string{nil, {"--follow-symlinks"}} {
		_, stderr, code := run(t, append([]string{"warm", parq, "--cache", t.TempDir(), "--only", "t"}, args...)...)
		if want := "is outside the reference set's folder " + parq + " (--ref-base)"; code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("warm %v: exit %d:\n%s\nwant 1 and %q", args, code, stderr, want)
		}
	}
	hostile := filepath.Join(t.TempDir(), "hostile.parq")
	res, err := exec.Command("python3", "-c", `import sys, json, kerchunk.df
refs = json.load(open(sys.argv[1]))
refs["refs"]["t/0.0.0"] = ["/etc/passwd", 0, 64]
kerchunk.df.refs_to_dataframe(refs, sys.argv[2], record_size=4)`, filepath.Join(out, "kerchunk.json"), hostile).CombinedOutput()
	if err != nil {
		t.Fatalf("writing a Parquet set: %v\n%s", err, res)
	}
	_, stderr, code := run(t, "warm", hostile, "--cache", t.TempDir(), "--only", "t", "--ref-base", out)
	if want := "target /etc/passwd is outside --ref-base " + out; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("warm with a target outside --ref-base: exit %d:\n%s\nwant 1 and %q", code, stderr, want)
	}
}

// A GRIB-backed array is listed by inspect with the reason and left out;
// the rest of the store mounts.
func TestKerchunkUnsupported(t *testing.T) {
	out := kerchunkFixture(t)
	src := filepath.Join(out, "grib.json")
	stdout, stderr, code := run(t, "inspect", "--json", src)
	if code != 0 {
		t.Fatalf("inspect: %d %s", code, stderr)
	}
	var entries []struct {
		Path        string  `json:"path"`
		Unsupported *string `json:"unsupported"`
	}
	if err := json.Unmarshal([]byte(stdout), &entries); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		if e.Path == "g" {
			found = e.Unsupported != nil && strings.Contains(*e.Unsupported, "grib")
		} else if e.Unsupported != nil {
			t.Errorf("%s unsupported: %s", e.Path, *e.Unsupported)
		}
	}
	if !found {
		t.Fatalf("inspect does not list g as unsupported for its GRIB filter:\n%s", stdout)
	}
	d := mount(t, src)
	if _, err := os.Stat(filepath.Join(d.mnt, "g.npy")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("g.npy: %v, want it left out", err)
	}
	checkVirtual(t, d.mnt, out, "t", "lsm")
}

// References past the end of their target, to a missing file, to a scheme
// zarrfs does not read or outside the allowed folder fail their chunks
// alone (EIO, a log line naming key and target); the rest reads.
func TestKerchunkFaults(t *testing.T) {
	out := kerchunkFixture(t)
	var refs map[string]any
	b, _ := os.ReadFile(filepath.Join(out, "kerchunk.json"))
	if err := json.Unmarshal(b, &refs); err != nil {
		t.Fatal(err)
	}
	r := refs["refs"].(map[string]any)
	r["t/0.0.0"] = []any{"nc/m01.nc", 1 << 40, 100}
	r["t/1.0.0"] = []any{"nc/gone.nc", 0, 100}
	r["t/2.0.0"] = []any{"ftp://host/m01.nc", 0, 100}
	r["t/3.0.0"] = []any{"/etc/shadow", 0, 100}
	r["t/4.0.0"] = []any{"file:///etc/passwd", 0, 100}
	bad, _ := json.Marshal(refs)
	src := filepath.Join(out, "faults.json")
	if err := os.WriteFile(src, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	d := mount(t, src)
	for i, target := range []string{"m01.nc", "gone.nc", "ftp://host/m01.nc", "/etc/shadow", "/etc/passwd"} {
		p := filepath.Join(d.mnt, "t", sampleName(int64(i), 10))
		_, err := os.ReadFile(p)
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s: %v, want EIO", p, err)
		}
		key := "t/" + string(rune('0'+i)) + ".0.0"
		logs := d.logs(key, target)
		if !strings.Contains(logs, key) || !strings.Contains(logs, target) {
			t.Errorf("no log line names %s and %s:\n%s", key, target, logs)
		}
	}
	for i := 5; i < 10; i++ {
		if _, err := os.ReadFile(filepath.Join(d.mnt, "t", sampleName(int64(i), 10))); err != nil {
			t.Errorf("sample %d: %v", i, err)
		}
	}
	checkVirtual(t, d.mnt, out, "q", "lsm")
	if strings.Contains(d.stderr.String(), "root:") {
		t.Error("the daemon's log holds bytes of /etc/passwd")
	}
}

// A malformed reference set is refused at mount, with one line naming it.
func TestKerchunkMalformed(t *testing.T) {
	requireMountTools(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "broken.json")
	os.WriteFile(src, []byte(`{"version": 1, "refs": {"a": ["x", 1]}}`), 0o644)
	_, stderr, code := run(t, "mount", src, t.TempDir(), "--cache", t.TempDir())
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "broken.json") {
		t.Fatalf("exit %d, stderr %q; want 1 and one line naming the file", code, stderr)
	}
	src = filepath.Join(dir, "bad.parq")
	os.MkdirAll(filepath.Join(src, "a"), 0o755)
	os.WriteFile(filepath.Join(src, ".zmetadata"), []byte(`{"record_size": 10, "metadata": {".zgroup": {"zarr_format": 2},
		"a/.zarray": {"shape": [4], "chunks": [2], "dtype": "<i4", "compressor": null, "filters": null, "fill_value": 0, "order": "C", "zarr_format": 2}}}`), 0o644)
	os.WriteFile(filepath.Join(src, "a", "refs.0.parq"), []byte("PAR1 not really"), 0o644)
	d := mount(t, src)
	if _, err := os.ReadFile(filepath.Join(d.mnt, "a.npy")); !errors.Is(err, syscall.EIO) {
		t.Errorf("a chunk of a broken Parquet record: %v, want EIO", err)
	}
	if l := d.logs("refs.0.parq"); !strings.Contains(l, "refs.0.parq") {
		t.Errorf("no log line names the Parquet file:\n%s", l)
	}
}

// A target rewritten in place (same size, new bytes) is never served from
// the blobs of its old bytes; --ref-base resolves relative targets of a
// reference set kept elsewhere.
func TestKerchunkTargetRewritten(t *testing.T) {
	requirePython(t)
	data := t.TempDir()
	refsDir := t.TempDir()
	write := func(base float32) {
		b := make([]byte, 4*8)
		for i := range 8 {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(base+float32(i)))
		}
		if err := os.WriteFile(filepath.Join(data, "raw.bin"), append([]byte("HDR!"), b...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(1)
	refs := map[string]any{"version": 1, "refs": map[string]any{
		".zgroup":   `{"zarr_format":2}`,
		"v/.zarray": `{"zarr_format":2,"shape":[8],"chunks":[4],"dtype":"<f4","compressor":null,"filters":null,"fill_value":0,"order":"C"}`,
		"v/0":       []any{"raw.bin", 4, 16},
		"v/1":       []any{"raw.bin", 20, 16},
	}}
	doc, _ := json.Marshal(refs)
	src := filepath.Join(refsDir, "refs.json")
	os.WriteFile(src, doc, 0o644)
	cache := t.TempDir()
	read := func(want float32) {
		d := mountAt(t, src, t.TempDir(), cache, "--ref-base", data)
		out, err := exec.Command("python3", "-c", "import numpy,sys; print(numpy.load(sys.argv[1]).tolist())", filepath.Join(d.mnt, "v.npy")).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var got []float32
		if err := json.Unmarshal(out, &got); err != nil || len(got) != 8 || got[0] != want || got[7] != want+7 {
			t.Fatalf("v = %s, want %v..%v", out, want, want+7)
		}
		d.stop(t)
	}
	read(1)
	write(100) // same size, rewritten in place
	read(100)
	// Without --ref-base the targets are looked for beside refs.json.
	d := mountAt(t, src, t.TempDir(), t.TempDir())
	if _, err := os.ReadFile(filepath.Join(d.mnt, "v.npy")); !errors.Is(err, syscall.EIO) {
		t.Errorf("v.npy without --ref-base: %v, want EIO", err)
	}
}

// icechunkRepo writes an Icechunk repository (virtual/make_icechunk.py)
// into a fresh folder and returns it with its snapshot ids, oldest first.
func icechunkRepo(t *testing.T) (string, []string) {
	t.Helper()
	out := kerchunkFixture(t)
	requireVirtualWriters(t, "icechunk")
	repo := filepath.Join(t.TempDir(), "repo.icechunk")
	res, err := exec.Command("python3", filepath.Join(repoRoot(t), "integration", "virtual", "make_icechunk.py"), out, repo).Output()
	if err != nil {
		t.Fatalf("make_icechunk.py: %v", err)
	}
	var snaps []string
	for _, l := range strings.Split(string(res), "\n") {
		if id, ok := strings.CutPrefix(l, "snapshot "); ok {
			snaps = append(snaps, strings.TrimSpace(id))
		}
	}
	return repo, snaps
}

func checkIcechunk(t *testing.T, mnt, repo, ref string) {
	t.Helper()
	res, err := exec.Command("python3", filepath.Join(repoRoot(t), "integration", "virtual", "check_icechunk.py"), mnt, repo, kerchunkDir, ref).CombinedOutput()
	if err != nil {
		t.Fatalf("check_icechunk.py %s: %v\n%s", ref, err, res)
	}
	if n := strings.Count(string(res), "values equal"); n != 4 {
		t.Fatalf("check_icechunk.py checked %d arrays, want 4:\n%s", n, res)
	}
}

// An Icechunk repository written by the icechunk package, with native,
// inline and virtual chunks over two commits, mounted at a branch, a tag
// and a snapshot id, equals icechunk's own reader (and xarray for the
// virtual HDF5 array).
func TestIcechunkMount(t *testing.T) {
	repo, snaps := icechunkRepo(t)
	if len(snaps) != 2 {
		t.Fatalf("snapshots %v", snaps)
	}
	for _, ref := range []string{"main", "v1", snaps[0]} {
		t.Run(ref, func(t *testing.T) {
			args := []string{"--ref-base", kerchunkDir} // the virtual chunks' files
			if ref != "main" {
				args = append(args, "--ref", ref)
			}
			d := mount(t, repo, args...)
			want := 6
			if ref != "main" {
				want = 4
			}
			if n := len(npyFiles(t, filepath.Join(d.mnt, "t"))); n != want {
				t.Errorf("t/ holds %d samples, want %d", n, want)
			}
			checkIcechunk(t, d.mnt, repo, ref)
		})
	}
}

// Virtual chunks are read only from places the user authorized, as
// icechunk requires: by default the repository's own root, which holds no
// virtual chunk's file; the native chunks read whatever the flags say.
func TestIcechunkVirtualAuthorized(t *testing.T) {
	repo, _ := icechunkRepo(t)
	_, stderr, code := run(t, "warm", repo, "--cache", t.TempDir())
	if want := "is outside the repository " + repo + " (--ref-base)"; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("warm without authorizing the virtual chunks: exit %d:\n%s\nwant 1 and %q", code, stderr, want)
	}
	if _, stderr, code := run(t, "warm", repo, "--cache", t.TempDir(), "--only", "t"); code != 0 {
		t.Errorf("native chunks: exit %d:\n%s", code, stderr)
	}
	if _, stderr, code := run(t, "warm", repo, "--cache", t.TempDir(), "--ref-allow", filepath.Join(kerchunkDir, "nc")); code != 0 {
		t.Errorf("virtual chunks authorized by --ref-allow: exit %d:\n%s", code, stderr)
	}
}

// A new commit on the branch is picked up by --metadata-ttl like an
// append: the new sample appears, the old ones keep their values.
func TestIcechunkFollowsBranch(t *testing.T) {
	repo, _ := icechunkRepo(t)
	d := mount(t, repo, "--metadata-ttl", "1s", "--ref-base", kerchunkDir)
	checkIcechunk(t, d.mnt, repo, "main")
	res, err := exec.Command("python3", filepath.Join(repoRoot(t), "integration", "virtual", "make_icechunk.py"), kerchunkDir, repo, "commit").CombinedOutput()
	if err != nil {
		t.Fatalf("commit: %v\n%s", err, res)
	}
	if !eventually(func() bool { return len(npyFiles(t, filepath.Join(d.mnt, "t"))) == 7 }) {
		t.Fatalf("the new commit's sample did not appear: %v", npyFiles(t, filepath.Join(d.mnt, "t")))
	}
	checkIcechunk(t, d.mnt, repo, "main")
}

// A ref that does not exist, a missing manifest and an unknown spec
// version are refused at mount with one line.
func TestIcechunkRefused(t *testing.T) {
	repo, snaps := icechunkRepo(t)
	mountFails := func(src, want string, args ...string) {
		t.Helper()
		_, stderr, code := run(t, append([]string{"mount", src, t.TempDir(), "--cache", t.TempDir()}, args...)...)
		if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, want) {
			t.Errorf("mount %s %v: exit %d, %q; want 1 and one line naming %q", src, args, code, stderr, want)
		}
	}
	mountFails(repo, `ref "nope"`, "--ref", "nope")
	// Another writer's future spec version.
	bad := filepath.Join(t.TempDir(), "future")
	cpTree(t, repo, bad)
	p := filepath.Join(bad, "snapshots", snaps[1])
	b, err := os.ReadFile(p)
	if err != nil || len(b) < 40 {
		t.Fatalf("snapshot %s: %v", p, err)
	}
	b[36] = 9
	os.WriteFile(p, b, 0o644)
	mountFails(bad, "spec version 9")
	// A snapshot whose manifest is missing.
	gone := filepath.Join(t.TempDir(), "gone")
	cpTree(t, repo, gone)
	ms, _ := filepath.Glob(filepath.Join(gone, "manifests", "*"))
	for _, m := range ms {
		os.Remove(m)
	}
	mountFails(gone, "manifest")
}

func cpTree(t *testing.T, from, to string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
}
