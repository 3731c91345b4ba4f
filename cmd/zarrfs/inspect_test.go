package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// A store's names cannot forge lines of inspect's text output or send
// terminal escapes: anything unprintable is printed escaped.
func TestInspectEscapesNames(t *testing.T) {
	path := "evil\nunsupported: forged line\x1b[31m"
	dim := "time\r"
	reason := "codec \"x\x1b[2J\" is not supported"
	mnt := "evil\n/"
	entries := []inspectEntry{
		{Path: path, Shape: []int64{2}, Dims: []*string{&dim}, Codecs: []string{"zstd\n"}, Unsupported: &reason},
		{Path: "ok", Shape: []int64{2}, Dims: []*string{nil}, Codecs: []string{"bytes"}, Mount: &mnt},
	}
	var b bytes.Buffer
	printInspect(&b, "file:///s\n.zarr", "none", entries)
	out := b.String()
	if n := strings.Count(out, "\n"); n != 10 {
		t.Errorf("%d lines, want 10 (2 header lines, 4 per array):\n%s", n, out)
	}
	if strings.ContainsAny(out, "\x1b\r") {
		t.Errorf("raw escapes in the output: %q", out)
	}
	for _, want := range []string{`"evil\nunsupported: forged line\x1b[31m"`, `"time\r"`, `"zstd\n"`, `"file:///s\n.zarr"`, `mount: "evil\n/"`, "dims [-]  codecs [bytes]"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\nunsupported: forged") {
		t.Errorf("a forged line:\n%s", out)
	}
}

// inspect --json reports an array's dtype as its source holds it, byte
// order included: for Zarr v3 the bytes codec's (of the inner chunks,
// when sharded), for v2 the dtype string's.
func TestInspectSourceByteOrder(t *testing.T) {
	dir := t.TempDir()
	put := func(p, text string) {
		p = filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v3 := func(dtype, codecs string) string {
		return `{"zarr_format":3,"node_type":"array","shape":[4,8],"data_type":"` + dtype + `",` +
			`"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4,8]}},"chunk_key_encoding":{"name":"default"},` +
			`"fill_value":0,"codecs":` + codecs + `}`
	}
	put("zarr.json", `{"zarr_format":3,"node_type":"group"}`)
	put("be/zarr.json", v3("float32", `[{"name":"bytes","configuration":{"endian":"big"}}]`))
	put("le/zarr.json", v3("float32", `[{"name":"bytes","configuration":{"endian":"little"}}]`))
	put("u1/zarr.json", v3("uint8", `[{"name":"bytes","configuration":{"endian":"big"}}]`))
	put("shard/zarr.json", v3("int16", `[{"name":"sharding_indexed","configuration":{"chunk_shape":[2,8],`+
		`"codecs":[{"name":"bytes","configuration":{"endian":"big"}}],`+
		`"index_codecs":[{"name":"bytes","configuration":{"endian":"little"}}]}}]`))
	stdout, stderr, code := runCLI(t, "inspect", dir, "--json")
	var arrays []inspectEntry
	if err := json.Unmarshal([]byte(stdout), &arrays); err != nil || code != 0 {
		t.Fatalf("inspect --json: exit %d, %v:\n%s%s", code, err, stdout, stderr)
	}
	got := map[string]string{}
	for _, a := range arrays {
		got[a.Path] = a.DType
	}
	want := map[string]string{"be": ">f4", "le": "<f4", "u1": "|u1", "shard": ">i2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("dtypes %v, want %v", got, want)
	}
}
