// Command testreport reads `go test -json` on standard input and prints
// what a person needs from a whole-repository run: one line per package as
// `go test` prints it, the output of every test that failed, every skipped
// test with its reason, and the totals, so that a skip is never silent.
//
//	go test -json ./... 2>&1 | go run ./internal/testreport [-totals FILE]
//
// Lines that are not test events (the go command's own messages) pass
// through unchanged. The exit status is 1 when a test or a package failed,
// or when no test ran at all.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	totals := flag.String("totals", "", "also write the totals line to `FILE`")
	flag.Parse()
	r := newReport(os.Stdout)
	if err := r.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
	line := r.finish()
	if *totals != "" {
		if err := os.WriteFile(*totals, []byte(line+"\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(1)
		}
	}
	if !r.ok() {
		os.Exit(1)
	}
}
