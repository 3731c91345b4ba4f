package main

import (
	"bytes"
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
