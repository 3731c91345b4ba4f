// Command chunkdamage damages chunk files of a Zarr store in place, with
// the kinds of damage the GPU decoder's tests apply to chunks (package
// internal/damage), so that a whole path (the mount's files, the device
// path's ring) faces the same damage as the decoders do:
// integration/gpu/deliver_check.py's damage part runs it.
//
// Each line of standard input is "KIND CODEC SEED FILE": KIND one of
// internal/damage's kinds, CODEC the chunk's codec as package codec names
// it (blosc, zstd, lz4, gzip, zlib), SEED the draw (an unsigned integer).
// For each line it prints "applied FILE" after rewriting FILE, or "n/a
// FILE" when the kind does not apply to that chunk (a block boundary in a
// chunk of one block, a size field zstd does not have), leaving FILE as
// it was.
//
// Usage: chunkdamage <PLAN    (chunkdamage -kinds lists the kinds)
// Exit status 0 on success, 1 when a file cannot be read or written, 2 on
// a malformed line.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/damage"
)

func main() {
	kinds := flag.Bool("kinds", false, "print the kinds of damage, one a line, and exit")
	flag.Parse()
	if *kinds {
		for _, k := range damage.Kinds {
			fmt.Println(k)
		}
		return
	}
	sc := bufio.NewScanner(os.Stdin)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.SplitN(line, " ", 4)
		if len(f) != 4 {
			fail(2, "line %d: %q: want KIND CODEC SEED FILE", n, line)
		}
		seed, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil || !slices.Contains(damage.Kinds, f[0]) {
			fail(2, "line %d: %q: want a kind of -kinds and an unsigned seed", n, line)
		}
		if err := apply(f[0], codec.Name(f[1]), seed, f[3]); err != nil {
			fail(1, "%v", err)
		}
	}
	if err := sc.Err(); err != nil {
		fail(1, "standard input: %v", err)
	}
}

// apply damages file with kind, drawn from seed, and says whether it did.
func apply(kind string, c codec.Name, seed uint64, file string) error {
	src, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	out := damage.Apply(kind, c, src, rand.New(rand.NewPCG(seed, uint64(len(src)))))
	if out == nil {
		fmt.Println("n/a", file)
		return nil
	}
	if err := os.WriteFile(file, out, 0o644); err != nil {
		return err
	}
	fmt.Println("applied", file)
	return nil
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "chunkdamage: "+format+"\n", args...)
	os.Exit(code)
}
