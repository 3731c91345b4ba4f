package main

import (
	"os"
	"strings"
	"testing"
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

// Defaults the docs state are the flags' defaults.
func TestDocumentedDefaults(t *testing.T) {
	ra := newMountCmd().Flags().Lookup("readahead").DefValue
	for _, doc := range []string{"docs/cli.md", "docs/troubleshooting.md"} {
		if !strings.Contains(readDoc(t, doc), "(default "+ra+",") {
			t.Errorf("%s does not give --readahead's default as %s", doc, ra)
		}
	}
}
