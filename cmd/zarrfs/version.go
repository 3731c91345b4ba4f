package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/zarrfs/zarrfs/gpu"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version and whether a GPU and nvCOMP were found",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "zarrfs %s\n", version)
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", gpu.Probe())
			return nil
		},
	}
}

func init() { rootCmd.AddCommand(newVersionCmd()) }
