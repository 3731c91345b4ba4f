package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

func run(t testing.TB, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(zarrfsBin(t), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// Usage and runtime errors of the commands other than mount: exit status
// and one line naming the object and the cause.
func TestCommandErrors(t *testing.T) {
	src := exampleStore(t, zarrtest.Example{Times: 3, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	badView := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(badView, []byte("views:\n  - name: train\n    channels:\n      - var: nosuch\n"), 0o644)
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"warm", src, "--cache", t.TempDir(), "--rank", "3", "--world", "2"}, 2, "--rank"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--shard", "random"}, 2, "--shard"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--samples", "5"}, 2, "--samples"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--only", "nosuch"}, 1, "nosuch"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--decode", "fpga"}, 2, "--decode"},
		// GPU memory bounds too small: one usage line naming the flag,
		// before any GPU is looked for (so on any machine).
		{[]string{"warm", src, "--cache", t.TempDir(), "--decode", "gpu", "--gpu-memory", "8GiB", "--pinned-memory", "2GiB"}, 2, "zarrfs: --pinned-memory 2GiB: too small"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--decode", "gpu", "--gpu-memory", "600MiB"}, 2, "zarrfs: --gpu-memory 600MiB: too small"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--view", badView}, 1, "bad.yaml:4"},
		{[]string{"inspect"}, 2, "expected"},
		{[]string{"inspect", src, "--decode", "gpu"}, 2, "--decode"}, // inspect decodes nothing
		// inspect reads --sample-dim as mount does.
		{[]string{"inspect", src, "--sample-dim", ","}, 2, `--sample-dim ",": empty name`},
		{[]string{"inspect", src, "--sample-dim", ""}, 2, "--sample-dim"},
		{[]string{"inspect", filepath.Join(t.TempDir(), "none.zarr")}, 1, "none.zarr"},
		{[]string{"path", "/definitely/not/mounted.npy"}, 1, "not inside a running zarrfs mount"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"inspect", src, "--bogus"}, 2, "zarrfs: inspect: unknown flag: --bogus (see zarrfs inspect --help)"},
		{[]string{"cache", "gc"}, 2, "zarrfs: cache gc: expected SOURCE, got 0 argument(s)"},
		{[]string{"version", "--log-level", "bogus"}, 2, "--log-level"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--align", "64"}, 2, "--align 64"},
		{[]string{"inspect", "s3://"}, 2, "no bucket"},
		{[]string{"inspect", "s3://b/x.zarr", "--s3-endpoint", "ftp://host"}, 2, "--s3-endpoint"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--view", filepath.Join(t.TempDir(), "none.yaml")}, 2, "--view"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--memory", "1KiB"}, 2, "--memory"},
		{[]string{"inspect", "s3://b/x.zarr", "--source-stall", "0s"}, 2, "--source-stall"},
		// A range past this store's end fits a longer one: exit 1, as a
		// view that does not fit the store.
		{[]string{"warm", src, "--cache", t.TempDir(), "--samples", "5:9"}, 1, "--samples 5:9: no sample directory has samples in that range"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--cache-size", "8KiB"}, 1, "do not fit the cache budget"},
		// mount says what warm says about a bad split.
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--rank", "3", "--world", "2"}, 2, "--rank 3 --world 2: want 0 <= rank < world"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--world", "0"}, 2, "--world 0: want 1 or more"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--world", "0"}, 2, "--world 0: want 1 or more"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--shard", "foo"}, 2, `--shard "foo": want contiguous or interleaved`},
		// Counts: refused, not turned into defaults, and bounded.
		{[]string{"warm", src, "--cache", t.TempDir(), "--jobs", "0"}, 2, "--jobs 0: want 1 to 1024"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--jobs", "-3"}, 2, "--jobs -3"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--jobs", "100000"}, 2, "--jobs 100000"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--readahead", "1000000"}, 2, "--readahead 1000000: want 0 to 256"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--readahead", "-1"}, 2, "--readahead -1"},
		// Deadlines are checked whatever the source.
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--source-stall", "-1s"}, 2, "--source-stall -1s"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--source-timeout", "0s"}, 2, "--source-timeout 0s"},
		// Flags that would do nothing are refused.
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--lease", "1h"}, 2, "--lease 1h0m0s: leases apply to --direct mounts only"},
		{[]string{"inspect", src, "--s3-anonymous"}, 2, "--s3-anonymous: " + src + " is not on S3 (s3://)"},
		{[]string{"warm", src, "--cache", t.TempDir(), "--s3-region", "eu-west-1"}, 2, "--s3-region"},
		// A bad --metrics address is a usage error, found before mounting.
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--metrics", "bogus"}, 2, `--metrics "bogus": missing port in address`},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--metrics", "127.0.0.1:99999"}, 2, "--metrics"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--metrics", "no-such-host.invalid:9464"}, 2, "--metrics no-such-host.invalid:9464"},
		{[]string{"mount", src, t.TempDir(), "--cache", t.TempDir(), "--cache-mode", "0777"}, 2, `--cache-mode "0777": 0777 gives more than read access`},
		{[]string{"cache", "bogus"}, 2, `unknown command "bogus" for "zarrfs cache"`},
		// Checked before the source is opened: a missing source is not
		// what they report.
		{[]string{"warm", "/nonexistent.zarr", "--cache", t.TempDir(), "--samples", "-1:5"}, 2, `--samples "-1:5": START -1 is negative (samples count from 0)`},
		{[]string{"mount", "/nonexistent.zarr", t.TempDir(), "--cache", t.TempDir(), "--world", "0"}, 2, "--world 0"},
		{[]string{"status", "--watch", "-1s"}, 2, "--watch -1s"},
		{[]string{"mount", src, filepath.Join(t.TempDir(), "none"), "--cache", t.TempDir()}, 1, "none: no such directory"},
		// A usage error is one whatever the mountpoint: every flag is
		// checked before it.
		{[]string{"mount", src, filepath.Join(t.TempDir(), "none"), "--cache", t.TempDir(), "--align", "100"}, 2, "--align 100"},
		{[]string{"mount", src, filepath.Join(t.TempDir(), "none"), "--cache", t.TempDir(), "--decode", "fpga"}, 2, "--decode"},
		{[]string{"mount", src, filepath.Join(t.TempDir(), "none"), "--cache", t.TempDir(), "--sample-dim", ","}, 2, "--sample-dim"},
	} {
		_, stderr, code := run(t, tt.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		// "zarrfs: " and the object, which for a mistake in a
		// command's flags is the command ("zarrfs: inspect: unknown
		// flag ...").
		if code != tt.code || len(lines) != 1 || !errorLine.MatchString(lines[0]) || !strings.Contains(lines[0], tt.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and one line with %q", tt.args, code, stderr, tt.code, tt.msg)
		}
	}
}

// errorLine is how an error line starts (docs/cli.md, Exit status and
// errors).
var errorLine = regexp.MustCompile(`^zarrfs: [^ ]`)

// A command group without a subcommand, and zarrfs alone, print their help
// and exit 0, as kubectl and gh do: nothing was asked that could fail.
func TestHelpWithoutCommand(t *testing.T) {
	for _, args := range [][]string{{}, {"cache"}} {
		out, stderr, code := run(t, args...)
		if code != 0 || !strings.Contains(out, "Usage:") || stderr != "" {
			t.Errorf("zarrfs %v: exit %d, stdout %q, stderr %q", args, code, out, stderr)
		}
	}
}

// Without a GPU (as on CI): --decode gpu refuses with a clear reason,
// --decode auto and cpu work, and version says why there is no GPU.
func TestDecodeWithoutGPU(t *testing.T) {
	if os.Getenv("ZARRFS_EXPECT_GPU") != "" {
		t.Skip("a GPU is expected on this machine")
	}
	src := exampleStore(t, zarrtest.Example{Times: 2, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	out, _, code := run(t, "version")
	if code != 0 || !strings.Contains(out, "GPU: none (") {
		t.Fatalf("version: exit %d, %q", code, out)
	}
	_, stderr, code := run(t, "warm", src, "--cache", t.TempDir(), "--decode", "gpu")
	if code != 1 || !strings.Contains(stderr, "--decode gpu") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("--decode gpu: exit %d, %q", code, stderr)
	}
	// One reason, the one version gives: without the driver library that
	// is not "the driver sees no device".
	why, _, _ := strings.Cut(out[strings.Index(out, "GPU: none (")+len("GPU: none ("):], "\n")
	why = strings.TrimSuffix(strings.TrimSpace(why), ")")
	if i := strings.Index(why, "gpu: no usable GPU: "); i >= 0 {
		why = why[i+len("gpu: no usable GPU: "):]
	}
	if !strings.Contains(stderr, why) {
		t.Errorf("--decode gpu says %q; version says %q", stderr, why)
	}
	for _, mode := range []string{"auto", "cpu"} {
		if out, stderr, code := run(t, "warm", src, "--cache", t.TempDir(), "--decode", mode); code != 0 || !strings.Contains(out, "warmed") {
			t.Errorf("--decode %s: exit %d\n%s%s", mode, code, out, stderr)
		}
	}
}

// inspect --json follows docs/design.md §7: one object per array with
// the named fields, unsupported arrays included with their reason.
func TestInspectJSON(t *testing.T) {
	fx := fixturesDir(t)
	out, stderr, code := run(t, "inspect", "--json", filepath.Join(fx, "public_b.zarr"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var entries []map[string]any
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, out)
	}
	byPath := map[string]map[string]any{}
	for _, e := range entries {
		for _, k := range []string{"path", "shape", "dtype", "chunks", "codecs", "dims", "mount", "unsupported"} {
			if _, ok := e[k]; !ok {
				t.Errorf("entry %v lacks %q", e["path"], k)
			}
		}
		byPath[e["path"].(string)] = e
	}
	tp := byPath["tp"]
	if tp["dtype"] != ">f8" || tp["mount"] != "tp/" || tp["unsupported"] != nil {
		t.Errorf("tp: %v", tp)
	}
	if lat := byPath["lat"]; lat["mount"] != "lat.npy" {
		t.Errorf("lat: %v", lat)
	}

	// An unsupported array shows with its reason and no mount.
	src := filepath.Join(t.TempDir(), "s.zarr")
	copyTree(t, filepath.Join(fx, "public_b.zarr"), src)
	os.Remove(filepath.Join(src, ".zmetadata"))
	os.WriteFile(filepath.Join(src, "t2m", ".zarray"), []byte(`{"zarr_format":2,"shape":[9,11,23],"chunks":[4,11,23],"dtype":"<f4","compressor":{"id":"bz2"},"fill_value":0,"order":"C","filters":null}`), 0o644)
	out, _, _ = run(t, "inspect", "--json", src)
	entries = nil
	json.Unmarshal([]byte(out), &entries)
	found := false
	for _, e := range entries {
		if e["path"] == "t2m" {
			found = true
			if r, _ := e["unsupported"].(string); !strings.Contains(r, "bz2") || e["mount"] != nil {
				t.Errorf("t2m: %v", e)
			}
		}
	}
	if !found || len(entries) != 7 {
		t.Errorf("want 7 arrays with t2m unsupported, got %d", len(entries))
	}
}

// warm says what it does in the plural it means, and says so when
// --samples runs past the samples a directory has.
func TestWarmMessages(t *testing.T) {
	src := exampleStore(t, zarrtest.Example{Times: 3, Levels: 1, Lat: 4, Lon: 8, TimeChunk: 1})
	out, stderr, code := run(t, "warm", src, "--cache", t.TempDir(), "--only", "t/1.npy")
	if code != 0 || !strings.Contains(out, "warmed 1 file (") {
		t.Errorf("warm of one file: exit %d, %q %q", code, out, stderr)
	}
	out, stderr, code = run(t, "warm", src, "--cache", t.TempDir(), "--samples", "2:9")
	if code != 0 || !strings.Contains(stderr, "--samples runs past the end") || !strings.Contains(stderr, "t/ has 3") {
		t.Errorf("warm --samples 2:9 of 3: exit %d, %q %q", code, out, stderr)
	}
}

// inspect shows what a sharded array decodes (its inner chunks and their
// codecs), and an array left out still shows its dimension names.
func TestInspectShardedAndUnsupported(t *testing.T) {
	requirePython(t)
	dir, dir2 := filepath.Join(t.TempDir(), "s.zarr"), filepath.Join(t.TempDir(), "v2.zarr")
	python(t, `
import sys, numcodecs, zarr
g = zarr.open_group(sys.argv[1], mode="w")
a = g.create_array("sh", shape=(4, 8, 8), chunks=(1, 4, 4), shards=(2, 8, 8), dtype="f4",
                   compressors=zarr.codecs.ZstdCodec(level=1), dimension_names=["time", "y", "x"])
a[:] = 1
v2 = zarr.open_group(sys.argv[2], mode="w", zarr_format=2)
b = v2.create_array("delta", shape=(3, 4), chunks=(3, 4), dtype="f4", filters=[numcodecs.Delta(dtype="f4")],
                    attributes={"_ARRAY_DIMENSIONS": ["time", "x"]})
b[:] = 2
`, dir, dir2)
	var out string
	for _, d := range []string{dir, dir2} {
		o, stderr, code := run(t, "inspect", "--json", d)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		out += o
	}
	out = strings.ReplaceAll(out, "]\n[", ",")
	var entries []struct {
		Path        string   `json:"path"`
		Chunks      []int64  `json:"chunks"`
		Codecs      []string `json:"codecs"`
		InnerChunks []int64  `json:"inner_chunks"`
		InnerCodecs []string `json:"inner_codecs"`
		Dims        []string `json:"dims"`
		Unsupported *string  `json:"unsupported"`
	}
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	seen := 0
	for _, e := range entries {
		switch e.Path {
		case "sh":
			seen++
			if fmt.Sprint(e.Chunks, e.Codecs, e.InnerChunks, e.InnerCodecs) != "[2 8 8] [sharding_indexed] [1 4 4] [zstd bytes]" {
				t.Errorf("sharded: chunks %v codecs %v inner chunks %v inner codecs %v", e.Chunks, e.Codecs, e.InnerChunks, e.InnerCodecs)
			}
		case "delta":
			seen++
			if e.Unsupported == nil || !strings.Contains(*e.Unsupported, "delta") || fmt.Sprint(e.Dims) != "[time x]" || e.InnerChunks != nil {
				t.Errorf("unsupported v2: %+v", e)
			}
		}
	}
	if seen != 2 {
		t.Fatalf("inspect lists %d of the 2 arrays:\n%s", seen, out)
	}
	text, _, _ := run(t, "inspect", dir)
	text2, _, _ := run(t, "inspect", dir2)
	text += text2
	for _, want := range []string{"chunks [2 8 8]  inner chunks [1 4 4]", "codecs [sharding_indexed]  inner codecs [zstd, bytes]", "dims [time, x]", "unsupported: "} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect text lacks %q:\n%s", want, text)
		}
	}
	if !strings.Contains(text, ": 1 array\n") {
		t.Errorf("inspect's count line:\n%s", text)
	}
}
