package integration

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/objectstore/webtest"
)

// withoutDACOverride starts a daemon as root without the capabilities
// that override file permissions: it reads only what a file's owner,
// group and mode let uid 0 read, while the test, with them, reads all.
var withoutDACOverride = []string{"setpriv",
	"--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"}

// requireUnreadable checks what hiding a store's chunks from a daemon
// needs: root (to give files to another user) and setpriv.
func requireUnreadable(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "hiding a store's chunks from the daemon needs root")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		testenv.Missing(t, "setpriv (util-linux) is needed to drop the daemon's DAC override")
	}
}

// isMetadata reports whether a store's file is Zarr metadata.
func isMetadata(name string) bool {
	return name == "zarr.json" || strings.HasPrefix(name, ".z")
}

// hideChunks gives every chunk file of the store at dir to another user,
// readable by it alone: a daemon under withoutDACOverride cannot read
// one, while stat still answers (the chunk's version: size, times,
// inode). It returns how many it hid.
func hideChunks(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || isMetadata(e.Name()) {
			return err
		}
		n++
		if err := os.Chown(p, 54321, 54321); err != nil {
			return err
		}
		return os.Chmod(p, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// zarrPythonStores writes the zarr-python conformance stores (and their
// references) and returns their directory and the stores' names.
func zarrPythonStores(t *testing.T) (string, []string) {
	t.Helper()
	requirePython(t)
	script := filepath.Join(repoRoot(t), "integration", "zarrpy", "make_stores.py")
	if err := exec.Command("python3", "-c", "import zarr, numcodecs").Run(); err != nil {
		testenv.Missing(t, "zarr-python and numcodecs are needed (make pydeps)")
	}
	out := t.TempDir()
	if b, err := exec.Command("python3", script, out).CombinedOutput(); err != nil {
		t.Fatalf("make_stores.py: %v\n%s", err, b)
	}
	ents, _ := os.ReadDir(out)
	var names []string
	for _, e := range ents {
		if e.IsDir() && strings.HasSuffix(e.Name(), ".zarr") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		t.Fatal("make_stores.py wrote no stores")
	}
	return out, names
}

// tierStatus is the chunk tier's part of `zarrfs status --json`.
type tierStatus struct {
	Cache struct {
		BlobFiles   int   `json:"blob_files"`
		ChunkFiles  int   `json:"chunk_files"`
		ChunkBytes  int64 `json:"chunk_bytes"`
		ChunkHits   int64 `json:"chunk_hits"`
		ChunkMisses int64 `json:"chunk_misses"`
		Damaged     int64 `json:"chunk_damaged"`
	} `json:"cache"`
	Reads struct {
		BytesFetched int64 `json:"bytes_fetched"`
	} `json:"source_reads"`
}

func mountTierStatus(t *testing.T, mnt string) tierStatus {
	t.Helper()
	stdout, stderr, code := run(t, "status", mnt, "--json")
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, stderr)
	}
	var st tierStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, stdout)
	}
	return st
}

// `zarrfs warm --compressed` of every zarr-python store, then a mount
// whose daemon cannot read a single chunk file of the source (they belong
// to another user, and the daemon runs without DAC override) serves every
// file byte for byte as zarr-python reads it: every chunk comes from the
// cache's chunk tier, and the decoded files are filled from there. The
// same mount over an empty cache fails its reads, so the source really is
// unreadable to it. A second warm finds every chunk in the cache and
// fetches nothing; chunk files are read-only to their owner, blobs shared
// or not; status shows both tiers.
func TestWarmCompressedServesWithoutSource(t *testing.T) {
	requireUnreadable(t)
	out, stores := zarrPythonStores(t)
	srcRoot, cacheDir := t.TempDir(), t.TempDir()
	for _, s := range stores {
		copyTree(t, filepath.Join(out, s), filepath.Join(srcRoot, s))
		hideChunks(t, filepath.Join(srcRoot, s))
		w := warm(t, filepath.Join(srcRoot, s), cacheDir, "--compressed", "--cache-mode", "all")
		if !strings.Contains(w, "zarrfs: kept the compressed chunks of ") {
			t.Fatalf("%s: no summary line:\n%s", s, w)
		}
	}
	again := warm(t, filepath.Join(srcRoot, "v3_blosc.zarr"), cacheDir, "--compressed", "--cache-mode", "all")
	if !strings.Contains(again, ": 0 chunks (0 B) stored") || !strings.Contains(again, "; 0 B fetched;") {
		t.Errorf("a second warm --compressed stored or fetched chunks:\n%s", again)
	}
	if blobs := blobFiles(t, cacheDir); len(blobs) != 0 {
		t.Errorf("warm --compressed wrote %d decoded files", len(blobs))
	}
	chunks := 0
	filepath.WalkDir(filepath.Join(cacheDir, "chunks"), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := e.Info()
		want := fs.FileMode(0o400)
		if e.IsDir() {
			want = 0o700
		} else {
			chunks++
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", p, fi.Mode().Perm(), want)
		}
		return nil
	})
	if chunks == 0 {
		t.Fatal("no chunk in the cache")
	}

	for _, s := range stores {
		t.Run(s, func(t *testing.T) {
			d := mountUnder(t, withoutDACOverride, filepath.Join(srcRoot, s), t.TempDir(), cacheDir, "--cache-mode", "all")
			runCheck(t, checkZarrPython, d.mnt, out, s)
			st := mountTierStatus(t, d.mnt)
			if st.Reads.BytesFetched != 0 || st.Cache.ChunkFiles < 1 {
				t.Errorf("status: %+v", st)
			}
			if text, _, _ := run(t, "status", d.mnt); !strings.Contains(text, "decoded: ") || !strings.Contains(text, "compressed: ") {
				t.Errorf("status does not show both tiers:\n%s", text)
			}
		})
	}

	// Control: the same daemon over an empty cache cannot read the store.
	d := mountUnder(t, withoutDACOverride, filepath.Join(srcRoot, "v3_blosc.zarr"), t.TempDir(), t.TempDir())
	if _, err := os.ReadFile(filepath.Join(d.mnt, "lz4_shuffle.npy")); err == nil {
		t.Fatal("a daemon without DAC override read a hidden chunk: the test proves nothing")
	}
	d.logs("permission denied")
}

// The chunk tier never hands a sample wrong bytes: every chunk file of the
// tier damaged (one byte flipped, raw chunks among them, which would
// decode to wrong values) is caught by its checksum, dropped and read from
// the source; a chunk rewritten at the source after it was kept is read
// anew, never served from the tier; a warm that cannot keep its chunks
// within --cache-size fails saying so.
func TestCompressedTierFaults(t *testing.T) {
	out, _ := zarrPythonStores(t)
	const store = "v3_codecs.zarr"
	src := filepath.Join(t.TempDir(), store)
	copyTree(t, filepath.Join(out, store), src)
	cacheDir := t.TempDir()
	warm(t, src, cacheDir, "--compressed")

	damaged := 0
	filepath.WalkDir(filepath.Join(cacheDir, "chunks"), func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 0 {
			b[len(b)/2] ^= 0x10
			if err := os.WriteFile(p, b, 0o400); err != nil {
				t.Fatal(err)
			}
			damaged++
		}
		return nil
	})
	if damaged == 0 {
		t.Fatal("no chunk file to damage")
	}
	d := mountAt(t, src, t.TempDir(), cacheDir)
	runCheck(t, checkZarrPython, d.mnt, out, store)
	if st := mountTierStatus(t, d.mnt); st.Cache.Damaged != int64(damaged) || st.Cache.ChunkHits != 0 || st.Cache.ChunkFiles != 0 {
		t.Errorf("%d chunk files damaged; status: %+v", damaged, st)
	}
	d.stop(t)

	// Keep them again, then rewrite an array at the source.
	w := warm(t, src, cacheDir, "--compressed")
	if !strings.Contains(w, ": "+strconv.Itoa(damaged)+" chunks (") || !strings.Contains(w, "stored, 0 (0 B) already in the cache") {
		t.Errorf("the damaged chunks were not all stored again:\n%s", w)
	}
	python(t, `
import sys, numpy as np, zarr
a = zarr.open_array(sys.argv[1] + '/raw', mode='r+')
a[...] = (np.asarray(a[...]) + 1).astype(a.dtype)
`, src)
	d = mountAt(t, src, t.TempDir(), cacheDir)
	got := python(t, `
import sys, numpy as np, zarr
a = np.asarray(zarr.open_array(sys.argv[2] + '/raw', mode='r')[...])
m = np.load(sys.argv[1] + '/raw.npy')
print('same' if m.tobytes() == np.ascontiguousarray(a).tobytes() else 'differs')
`, d.mnt, src)
	if strings.TrimSpace(got) != "same" {
		t.Errorf("raw.npy after the source's chunks were rewritten: %s from zarr-python's values", strings.TrimSpace(got))
	}
	if st := mountTierStatus(t, d.mnt); st.Reads.BytesFetched == 0 {
		t.Errorf("the rewritten chunks were not read from the source: %+v", st)
	}
	d.stop(t)

	stdout, stderr, code := run(t, "warm", src, "--cache", t.TempDir(), "--compressed", "--cache-size", "4KiB")
	if code != 1 || !strings.Contains(stderr, "compressed chunks warmed are not in the cache") || !strings.Contains(stderr, "raise --cache-size") {
		t.Errorf("warm --compressed over its budget: exit %d\n%s%s", code, stdout, stderr)
	}
}

// An HTTP source learns its chunks' versions from the reads that fetch
// them: after `zarrfs warm --compressed`, a mount asks each chunk's version
// first (HEAD) and reads the chunk from the cache, so it serves every
// file, byte for byte, without one GET of a chunk. A warm of the decoded
// files on the same cache fetches none either.
func TestWarmCompressedHTTP(t *testing.T) {
	out, _ := zarrPythonStores(t)
	dir := t.TempDir()
	const store = "v3_consolidated.zarr" // HTTP cannot list: consolidated metadata
	copyTree(t, filepath.Join(out, store), filepath.Join(dir, store))
	web := webtest.Start(t, dir)
	cacheDir := t.TempDir()
	warm(t, web.Join(store), cacheDir, "--compressed")
	d := mountAt(t, web.Join(store), t.TempDir(), cacheDir)
	gets := web.Requests() - web.Heads() // the metadata's
	heads := web.Heads()
	runCheck(t, checkZarrPython, d.mnt, out, store)
	if n := web.Requests() - web.Heads() - gets; n != 0 {
		t.Errorf("%d GET requests for chunks kept in the cache", n)
	}
	if web.Heads() == heads {
		t.Error("no chunk version asked: the files came from somewhere else than the chunk tier")
	}
	st := mountTierStatus(t, d.mnt)
	if st.Cache.ChunkHits == 0 || st.Cache.ChunkMisses != 0 || st.Reads.BytesFetched != 0 {
		t.Errorf("status: %+v", st)
	}
	d.stop(t)
	gets = web.Requests() - web.Heads()
	// Files of another --align: none in the cache, all decoded anew.
	if w := warm(t, web.Join(store), cacheDir, "--align", "192"); !strings.Contains(w, "zarrfs: warmed ") || strings.Contains(w, " 0 files") {
		t.Errorf("warm:\n%s", w)
	}
	// The metadata is read again (one GET); no chunk.
	if n := web.Requests() - web.Heads() - gets; n > 1 {
		t.Errorf("warm of decoded files over the chunk tier sent %d GET requests", n)
	}
}

// pagesStorePy writes, with zarr-python, a consolidated store of one array
// x of 8 samples of 512 float64 in uncompressed chunks of one sample: one
// 4096-byte chunk file each, what the cache's budget counts exactly.
const pagesStorePy = `
import sys, numpy as np, zarr
x = zarr.create_array(sys.argv[1], name='x', shape=(8, 512), chunks=(1, 512), dtype='float64',
    compressors=None, dimension_names=['time', 'a'])
x[...] = np.arange(8 * 512, dtype='float64').reshape(8, 512) + float(sys.argv[2])
zarr.consolidate_metadata(sys.argv[1])
`

// A mount of an HTTP store whose chunks the tier holds asks their versions
// first and reads them from the tier, however many other entries filled
// the cache since: here the chunks kept first of the store and two of
// the last ones were evicted by another store's warm, and the mount
// fetches exactly the six chunks the tier lost, reading the other two
// from it.
func TestWarmCompressedHTTPUnderPressure(t *testing.T) {
	requirePython(t)
	dir := t.TempDir()
	python(t, pagesStorePy, filepath.Join(dir, "s.zarr"), "0")
	python(t, pagesStorePy, filepath.Join(dir, "f.zarr"), "1")
	web := webtest.Start(t, dir)
	cacheDir := t.TempDir()
	warm(t, web.Join("s.zarr"), cacheDir, "--compressed", "--samples", "0:4")
	warm(t, web.Join("s.zarr"), cacheDir, "--compressed", "--samples", "4:8")
	// Room for ten chunks: the filler's eight evict the six oldest.
	warm(t, web.Join("f.zarr"), cacheDir, "--compressed", "--cache-size", strconv.Itoa(10*4096))
	d := mountAt(t, web.Join("s.zarr"), t.TempDir(), cacheDir)
	gets, heads := web.Requests()-web.Heads(), web.Heads()
	for i := range 8 {
		if _, err := os.ReadFile(filepath.Join(d.mnt, "x", strconv.Itoa(i)+".npy")); err != nil {
			t.Fatal(err)
		}
	}
	if n := web.Requests() - web.Heads() - gets; n != 6 {
		t.Errorf("%d GET requests for 8 chunks, 2 of them held by the tier: want 6", n)
	}
	if n := web.Heads() - heads; n < 8 {
		t.Errorf("%d chunk versions asked, want 8", n)
	}
	if st := mountTierStatus(t, d.mnt); st.Cache.ChunkHits != 2 {
		t.Errorf("%d chunk hits, want 2", st.Cache.ChunkHits)
	}
}

// deviceStorePy writes, with zarr-python, a store of one array x with a
// time dimension: 23 samples of (2, 3) float32 in blosc chunks of 4
// samples.
const deviceStorePy = `
import sys, numpy as np, zarr
from zarr.codecs import BloscCodec
x = zarr.create_array(sys.argv[1], name='x', shape=(23, 2, 3), chunks=(4, 2, 3), dtype='float32',
    compressors=[BloscCodec(cname='lz4', clevel=5)], dimension_names=['time', 'a', 'b'])
x[...] = np.arange(23 * 6, dtype='float32').reshape(23, 2, 3) / 7
`

// deviceStatus is a mount's status: its tiers, the delivery's counts and
// the chunks it decoded.
type deviceStatus struct {
	tierStatus
	Delivery struct {
		Device int64 `json:"device_samples"`
		Host   int64 `json:"host_samples"`
		Cached int64 `json:"cached_samples"`
	} `json:"delivery"`
	Decoded struct {
		Chunks int64 `json:"chunks_decoded"`
	} `json:"source_reads"`
}

// deviceEpoch reads array x of mount d (of the store deviceStorePy wrote
// at src) with Loader(decode='device') in its test mode, fails unless its
// batches equal zarr-python's values, and returns the mount's status.
func deviceEpoch(t *testing.T, d *daemon, src string) deviceStatus {
	t.Helper()
	got := python(t, `
import sys, numpy as np, zarr
from zarrfs.loader import Loader
want = np.asarray(zarr.open_array(sys.argv[2] + '/x', mode='r')[...])
l = Loader(sys.argv[1] + '/x', 4, device='cpu', decode='device')
assert l.path_kind == 'ring-host', l.path_kind
got = np.concatenate([b.numpy().copy() for b, _ in l])
l.close()
print('same' if got.tobytes() == want.tobytes() else 'differs')
`, d.mnt, src)
	if strings.TrimSpace(got) != "same" {
		t.Fatalf("the device path's batches: %s from zarr-python's values", strings.TrimSpace(got))
	}
	stdout, _, _ := run(t, "status", d.mnt, "--json")
	var st deviceStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func requireLoader(t *testing.T) {
	t.Helper()
	requirePython(t)
	if err := exec.Command("python3", "-c", "import zarr, torch, zarrfs.loader").Run(); err != nil {
		testenv.Missing(t, "zarr-python, torch and the zarrfs package are needed (make pydeps)")
	}
}

// The device path (zarrfs.torch.Loader with decode='device', here in its
// test mode, a ring of host memory the daemon decodes into) reads its
// compressed chunks from the chunk tier: after warm --compressed, a
// daemon that cannot read a chunk file of the source fills every batch,
// equal to zarr-python's values, with no byte read from the source and no
// decoded file written to the cache.
func TestDevicePathReadsChunkTier(t *testing.T) {
	requireUnreadable(t)
	requireLoader(t)
	src := filepath.Join(t.TempDir(), "s.zarr")
	python(t, deviceStorePy, src)
	if n := hideChunks(t, src); n != 6 {
		t.Fatalf("%d chunk files, want 6", n)
	}
	cacheDir := t.TempDir()
	warm(t, src, cacheDir, "--compressed")
	d := mountUnder(t, withoutDACOverride, src, t.TempDir(), cacheDir, "--delivery", "host")
	st := deviceEpoch(t, d, src)
	if st.Delivery.Device != 23 || st.Delivery.Host != 0 || st.Cache.ChunkHits < 6 || st.Reads.BytesFetched != 0 || st.Cache.BlobFiles != 0 {
		t.Errorf("status: %+v\n%s", st, d.stderr)
	}
}

// Over a warm mount the device path copies each sample from the decoded
// file the cache holds rather than decode it again: after `zarrfs warm`,
// the mount fills every batch of Loader(decode='device'), equal to
// zarr-python's values, from the cache alone (it reads and decodes no
// chunk), and status counts them as cached.
func TestDevicePathCopiesWarmSamples(t *testing.T) {
	requireLoader(t)
	src := filepath.Join(t.TempDir(), "s.zarr")
	python(t, deviceStorePy, src)
	cacheDir := t.TempDir()
	warm(t, src, cacheDir)
	d := mountAt(t, src, t.TempDir(), cacheDir, "--delivery", "host")
	st := deviceEpoch(t, d, src)
	if st.Delivery.Device != 0 || st.Delivery.Host != 23 || st.Delivery.Cached != 23 || st.Reads.BytesFetched != 0 || st.Decoded.Chunks != 0 {
		t.Errorf("status: %+v\n%s", st, d.stderr)
	}
}
