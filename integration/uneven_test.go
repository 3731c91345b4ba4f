package integration

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// checkUneven compares every array of a mount with the values the writers
// hold (want.npz of make_uneven.py): sample directories stacked, whole
// arrays as they are. It prints one line per array.
const checkUneven = `
import os, sys
import numpy as np
mnt, out = sys.argv[1], sys.argv[2]
want = np.load(os.path.join(out, 'want.npz'))
for name in sys.argv[3:]:
    w = want[name]
    d = os.path.join(mnt, name)
    if os.path.isdir(d):
        files = sorted(f for f in os.listdir(d) if f.endswith('.npy'))
        assert len(files) == w.shape[0], (name, files, w.shape)
        got = np.stack([np.load(os.path.join(d, f)) for f in files])
    else:
        got = np.load(d + '.npy')
    assert got.shape == w.shape, (name, got.shape, w.shape)
    bad = np.argwhere(got != w)
    assert len(bad) == 0, f'{name}: {len(bad)} of {w.size} values differ, first at {bad[0].tolist()}: {got[tuple(bad[0])]} for {w[tuple(bad[0])]}'
    print(f'{name}: {w.size} values equal')
`

// Arrays whose shapes do not divide into their chunks ((7, 3) in (2, 2),
// (7, 5, 3) in (3, 2, 2) with the last step's chunks never written, (5, 3)
// in (2, 2)), referenced by kerchunk's JSON and Parquet writers (three
// references a record, so chunk numbers cross records) and by a generator
// whose offsets are grid arithmetic, mount with every edge chunk read
// from its own reference and the unwritten ones as the fill value: the
// values equal those netCDF4 and numpy wrote.
func TestUnevenChunkGrids(t *testing.T) {
	requireVirtualWriters(t, "netCDF4", "kerchunk")
	out := t.TempDir()
	if res, err := exec.Command("python3", filepath.Join(repoRoot(t), "integration", "virtual", "make_uneven.py"), out).CombinedOutput(); err != nil {
		t.Fatalf("make_uneven.py: %v\n%s", err, res)
	}
	for _, c := range []struct {
		name, src string
		vars      []string
		args      []string
	}{
		{"json", filepath.Join(out, "u.json"), []string{"a", "b", "c", "time"}, nil},
		{"parquet", filepath.Join(out, "u.parq"), []string{"a", "b", "c", "time"}, []string{"--ref-base", out}},
		{"generator", filepath.Join(out, "gen.json"), []string{"g"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := mount(t, c.src, c.args...)
			res, err := exec.Command("python3", append([]string{"-c", checkUneven, d.mnt, out}, c.vars...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s\n%s", err, res, d.stderr)
			}
			if n := strings.Count(string(res), "values equal"); n != len(c.vars) {
				t.Fatalf("checked %d arrays, want %d:\n%s", n, len(c.vars), res)
			}
		})
	}
}

// An Icechunk repository whose manifests icechunk split by extent (two
// chunks along time and along lat: extents that end inside the grid, an
// array of shapes that do not divide into chunks, a step never written),
// with native and virtual chunks, over two commits (a split's manifest
// rewritten, a new split appended), mounts at the branch and at the first
// snapshot with every chunk read from the manifest whose extent holds it:
// the values equal icechunk's own reader's.
func TestIcechunkSplitManifests(t *testing.T) {
	requireVirtualWriters(t, "icechunk")
	dir := t.TempDir()
	repo, vdata := filepath.Join(dir, "repo.icechunk"), filepath.Join(dir, "vdata")
	script := filepath.Join(repoRoot(t), "integration", "virtual", "make_icechunk_split.py")
	res, err := exec.Command("python3", script, repo, vdata).Output()
	if err != nil {
		t.Fatalf("make_icechunk_split.py: %v\n%s", err, res)
	}
	var snaps []string
	manifests := 0
	for _, l := range strings.Split(string(res), "\n") {
		if id, ok := strings.CutPrefix(l, "snapshot "); ok {
			snaps = append(snaps, strings.TrimSpace(id))
		}
		if n, ok := strings.CutPrefix(l, "manifests "); ok {
			manifests, _ = strconv.Atoi(strings.TrimSpace(n))
		}
	}
	if len(snaps) != 2 || manifests < 8 {
		t.Fatalf("snapshots %v, %d manifests: the manifests were not split\n%s", snaps, manifests, res)
	}
	for _, ref := range []string{"main", snaps[0]} {
		t.Run(ref, func(t *testing.T) {
			args := []string{"--ref-allow", vdata}
			if ref != "main" {
				args = append(args, "--ref", ref)
			}
			d := mount(t, repo, args...)
			res, err := exec.Command("python3", script, "check", d.mnt, repo, vdata, ref).CombinedOutput()
			if err != nil {
				t.Fatalf("check: %v\n%s\n%s", err, res, d.stderr)
			}
			if n := strings.Count(string(res), "values equal"); n != 2 {
				t.Fatalf("checked %d arrays, want 2:\n%s", n, res)
			}
		})
	}
}
