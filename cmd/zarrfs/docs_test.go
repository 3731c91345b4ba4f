package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readDoc returns a file of the repository with its whitespace runs made
// single spaces, so that a phrase matches however the Markdown wraps it.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile("../../" + rel)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// The memory default is worded once: --help, the README and docs/cli.md
// say the same thing.
func TestMemoryDefaultWordedAlike(t *testing.T) {
	help := newMountCmd().Flags().Lookup("memory").Usage
	if !strings.Contains(help, memoryDefault) {
		t.Errorf("--memory help %q lacks %q", help, memoryDefault)
	}
	for _, doc := range []string{"README.md", "docs/cli.md"} {
		if !strings.Contains(readDoc(t, doc), memoryDefault) {
			t.Errorf("%s does not word the memory default as --help does: %q", doc, memoryDefault)
		}
	}
}

// Defaults the docs state are the flags' defaults: every mention of a flag
// (up to the next flag, the end of its table row, or 300 characters) that
// gives a default gives the flag's, and each doc listed gives it at least
// once.
func TestDocumentedDefaults(t *testing.T) {
	mount := newMountCmd().Flags()
	for _, tt := range []struct {
		flag string
		docs []string
	}{
		{"readahead", []string{"docs/cli.md", "docs/troubleshooting.md"}},
		{"sample-dim", []string{"README.md", "docs/cli.md", "docs/mount.md", "docs/design.md"}},
		{"align", []string{"docs/cli.md", "docs/mount.md", "docs/design.md"}},
		{"metadata-ttl", []string{"docs/cli.md", "docs/design.md"}},
		{"lease", []string{"docs/cli.md", "docs/direct.md", "docs/design.md"}},
		{"decode", []string{"docs/cli.md"}},
	} {
		want := mount.Lookup(tt.flag).DefValue
		for _, doc := range tt.docs {
			got := statedDefaults(readDoc(t, doc), tt.flag)
			if len(got) == 0 {
				t.Errorf("%s gives no default for --%s (want %s)", doc, tt.flag, want)
			}
			for _, g := range got {
				if !sameDefault(g, want) {
					t.Errorf("%s gives --%s's default as %q, the flag's is %q", doc, tt.flag, g, want)
				}
			}
		}
	}
}

// statedDefaults returns the value after "default" in each mention of
// `--flag in doc that has one, backticks dropped.
func statedDefaults(doc, flag string) []string {
	var out []string
	for rest := doc; ; {
		i := strings.Index(rest, "`--"+flag)
		if i < 0 {
			return out
		}
		rest = rest[i+len("`--"+flag):]
		if rest != "" && (rest[0] == '-' || rest[0] >= 'a' && rest[0] <= 'z') {
			continue // a longer flag's name (--lease-x)
		}
		w := rest[:min(len(rest), 300)]
		for _, end := range []string{"`--", "| |"} {
			if j := strings.Index(w, end); j >= 0 {
				w = w[:j]
			}
		}
		w = strings.ReplaceAll(w, "`", "")
		_, after, ok := strings.Cut(w, "default")
		if !ok {
			continue
		}
		v := strings.TrimLeft(after, " :(")
		if j := strings.IndexAny(v, " );"); j >= 0 {
			v = v[:j]
		}
		out = append(out, strings.TrimRight(v, ",.:"))
	}
}

// sameDefault compares a documented default with a flag's DefValue,
// durations by value (10m is 10m0s).
func sameDefault(doc, def string) bool {
	if doc == def {
		return true
	}
	a, errA := time.ParseDuration(doc)
	b, errB := time.ParseDuration(def)
	return errA == nil && errB == nil && a == b
}

// Fills get --memory but the decoded-chunk cache and an eighth, as
// docs/design.md §12 and docs/cli.md quote it, and always some of it.
func TestFillMemory(t *testing.T) {
	for _, c := range []struct{ mem, want int64 }{
		{64 << 20, 32 << 20},
		{256 << 20, 160 << 20},
		{8 << 30, 6912 << 20},
	} {
		if got := fillMemory(c.mem, chunkCacheBytes(0, c.mem)); got != c.want {
			t.Errorf("--memory %d MiB: fills get %d MiB, want %d MiB", c.mem>>20, got>>20, c.want>>20)
		}
	}
	for _, doc := range []string{"docs/design.md", "docs/cli.md"} {
		if !strings.Contains(readDoc(t, doc), "160 MiB of `") {
			t.Errorf("%s does not say what fills get of 256MiB", doc)
		}
	}
}

// docParagraphs returns the paragraphs of README.md and docs/*.md (text
// between blank lines, code blocks too), by file.
func docParagraphs(t *testing.T) map[string][]string {
	t.Helper()
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	out := map[string][]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(f, "../../")
		out[rel] = strings.Split(string(b), "\n\n")
	}
	return out
}

// The docs lead with zarrfs unmount: fusermount3 is missing on some nodes
// and umount needs root, and neither waits for the daemon. A paragraph
// that shows either names zarrfs unmount first.
func TestDocsLeadWithZarrfsUnmount(t *testing.T) {
	others := regexp.MustCompile("fusermount3 -u|(?m)^umount |`umount")
	for doc, paras := range docParagraphs(t) {
		for _, p := range paras {
			loc := others.FindStringIndex(p)
			if loc == nil {
				continue
			}
			if i := strings.Index(p, "zarrfs unmount"); i < 0 || i > loc[0] {
				t.Errorf("%s: %q shows %q before zarrfs unmount", doc, strings.Join(strings.Fields(p), " "), p[loc[0]:loc[1]])
			}
		}
	}
}

// What README.md claims of the cache and the build, the code does: a chunk
// rewritten in place is served as cached until the next --metadata-ttl
// (docs/cache.md), and make install's HELPERDIR is documented.
func TestReadmeClaims(t *testing.T) {
	for doc, paras := range docParagraphs(t) {
		for _, p := range paras {
			if strings.Contains(strings.Join(strings.Fields(p), " "), "never served stale") {
				t.Errorf("%s says a rewritten chunk is never served stale; it is, until the next --metadata-ttl", doc)
			}
		}
	}
	readme := readDoc(t, "README.md")
	i := strings.Index(readme, "rewritten in place")
	if i < 0 || !strings.Contains(readme[max(0, i-300):min(len(readme), i+300)], "--metadata-ttl") {
		t.Error("README.md does not say a chunk rewritten in place is noticed at the next --metadata-ttl")
	}
	if !strings.Contains(readme, "HELPERDIR") {
		t.Error("README.md does not document make install's HELPERDIR")
	}
}
