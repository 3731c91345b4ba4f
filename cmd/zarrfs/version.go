package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, whether a GPU and nvCOMP were found, and the zstd decoder",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "zarrfs %s\n", version)
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", gpu.Probe(gpu.LibrariesFrom(os.Getenv)))
			fmt.Fprintf(cmd.OutOrStdout(), "zstd: %s\n", codec.ZstdDecoder())
			return nil
		},
	}
}
