// Command mkstore writes the small ERA5-like example store that `make demo`
// mounts.
package main

import (
	"fmt"
	"os"

	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mkstore DIR")
		os.Exit(2)
	}
	ex := zarrtest.DefaultExample
	if err := ex.Write(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "mkstore: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s (%s)\n", os.Args[1], ex)
}
