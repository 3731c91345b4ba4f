package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// tinyChunksSide is the side of the tiny-chunk arrays' samples: 300 in
// tests (90,000 chunks a sample), $ZARRFS_TINY_CHUNKS when set (1000,
// 2000 and 4000 for BENCHMARKS.md: 1, 4 and 16 million).
func tinyChunksSide(t *testing.T) int {
	if v := os.Getenv("ZARRFS_TINY_CHUNKS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10_000 {
			t.Fatalf("ZARRFS_TINY_CHUNKS=%q: want 1 to 10000", v)
		}
		return n
	}
	return 300
}

// A fill's memory does not grow with its sample's chunk count: arrays of
// shape [2, N, N] uint8 in chunks of one element (none stored: every chunk
// missing, read as the fill value), N*N chunks a sample, mounted with
// --memory 256MiB. cat of a sample, of a view stacking two such arrays,
// and `zarrfs warm` of the store stay within 300 MiB of peak RSS (VmHWM,
// and the warm's maximum RSS) and serve the fill values.
func TestManyTinyChunks(t *testing.T) {
	requireMountTools(t)
	n := tinyChunksSide(t)
	src := filepath.Join(t.TempDir(), "tiny.zarr")
	writeDoc(t, filepath.Join(src, "zarr.json"), `{"zarr_format":3,"node_type":"group"}`)
	for name, fill := range map[string]int{"a": 3, "b": 5} {
		writeDoc(t, filepath.Join(src, name, "zarr.json"), `{"zarr_format":3,"node_type":"array","shape":[2,`+
			strconv.Itoa(n)+`,`+strconv.Itoa(n)+`],"data_type":"uint8",`+
			`"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,1,1]}},"chunk_key_encoding":{"name":"default"},`+
			`"codecs":[{"name":"bytes"}],"fill_value":`+strconv.Itoa(fill)+`,"dimension_names":["time","y","x"]}`)
	}
	view := filepath.Join(t.TempDir(), "views.yaml")
	writeDoc(t, view, "views:\n  - name: v\n    channels:\n      - var: a\n      - var: b\n")
	const limit = 300 << 20
	plane := int64(n) * int64(n)

	d := mount(t, src, "--memory", "256MiB", "--readahead", "0", "--view", view)
	for _, c := range []struct {
		path  string
		fills []byte // one per plane
	}{
		{"a/0.npy", []byte{3}},
		{"v/0.npy", []byte{3, 5}},
	} {
		start := time.Now()
		got, err := os.ReadFile(filepath.Join(d.mnt, c.path))
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		data := got[len(got)-int(plane)*len(c.fills):]
		for i, f := range c.fills {
			if p := data[int64(i)*plane : int64(i+1)*plane]; !bytes.Equal(p, bytes.Repeat([]byte{f}, len(p))) {
				t.Errorf("%s: plane %d is not all %d", c.path, i, f)
			}
		}
		peak := peakRSS(d.cmd.Process.Pid)
		t.Logf("cat %s (%d chunks): %.1f s, daemon peak RSS %d MiB", c.path, plane*int64(len(c.fills)), took.Seconds(), peak>>20)
		if peak > limit {
			t.Errorf("%s: peak RSS %d MiB, want at most %d MiB", c.path, peak>>20, limit>>20)
		}
	}

	cmd := exec.Command(zarrfsBin(t), "warm", src, "--cache", t.TempDir(), "--memory", "256MiB")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("warm: %v\n%s", err, stderr.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		t.Logf("warm of the store (a, b and v; %d chunks an array sample): %.1f s, peak RSS %d MiB", plane, time.Since(start).Seconds(), ru.Maxrss>>10)
		if ru.Maxrss<<10 > limit {
			t.Errorf("warm: peak RSS %d MiB, want at most %d MiB", ru.Maxrss>>10, limit>>20)
		}
	}
}

// Fills get the memory budget but the decoded-chunk cache and the
// runtime's reserve: --memory 256MiB fills an array of 64 MiB chunks
// (zstd, a few kilobytes stored), each sample one chunk decoded straight
// into its blob's buffer, within the budget's RSS. When fills got half of
// --memory (128 MiB) such a chunk, charged its buffer and its compressed
// bound (136 MiB), was refused with EIO.
func TestLargeChunksFit(t *testing.T) {
	requireMountTools(t)
	const side = 8192 // 64 MiB a chunk
	src := filepath.Join(t.TempDir(), "big.zarr")
	writeDoc(t, filepath.Join(src, "zarr.json"), `{"zarr_format":3,"node_type":"group"}`)
	writeDoc(t, filepath.Join(src, "big", "zarr.json"), `{"zarr_format":3,"node_type":"array","shape":[2,8192,8192],"data_type":"uint8",`+
		`"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,8192,8192]}},"chunk_key_encoding":{"name":"default"},`+
		`"codecs":[{"name":"bytes"},{"name":"zstd","configuration":{"level":1,"checksum":false}}],"fill_value":0,"dimension_names":["time","y","x"]}`)
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	// One buffer for both chunks, and the samples compared block by
	// block: the test process stays small, since every process it starts
	// later reports at least its peak as theirs (exec records the peak of
	// the memory it replaces, which a child shares with its parent until
	// then), and TestMetadataLimits measures one.
	chunk := func(b []byte, k int) []byte {
		for i := range b {
			b[i] = byte(i*7 + k) // a period of 256 bytes: compresses to little
		}
		return b
	}
	buf := make([]byte, side*side)
	for k := range 2 {
		writeDoc(t, filepath.Join(src, "big", "c", strconv.Itoa(k), "0", "0"), string(enc.EncodeAll(chunk(buf, k), nil)))
	}
	enc.Close()

	d := mount(t, src, "--memory", "256MiB", "--readahead", "0")
	const block = 1 << 20
	want, got := make([]byte, block), make([]byte, block)
	for k := range 2 {
		p := filepath.Join(d.mnt, "big", strconv.Itoa(k)+".npy")
		start := time.Now()
		f, err := os.Open(p)
		if err != nil {
			t.Fatalf("%s: %v\n%s", p, err, d.stderr.String())
		}
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		base := fi.Size() - side*side
		for off := int64(0); off < side*side; off += block {
			if _, err := f.ReadAt(got, base+off); err != nil {
				t.Fatalf("%s at %d: %v\n%s", p, base+off, err, d.stderr.String())
			}
			for i := range want {
				want[i] = byte((off+int64(i))*7 + int64(k))
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("big/%d.npy: wrong bytes in the block at %d", k, off)
			}
		}
		f.Close()
		t.Logf("cat big/%d.npy (one 64 MiB chunk): %.2f s", k, time.Since(start).Seconds())
	}
	peak := peakRSS(d.cmd.Process.Pid)
	t.Logf("--memory 256MiB, 64 MiB chunks: daemon peak RSS %d MiB", peak>>20)
	if peak > 256<<20 {
		t.Errorf("peak RSS %d MiB, past --memory 256MiB", peak>>20)
	}
}
