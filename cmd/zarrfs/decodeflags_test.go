package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// --gpu-trust-unchecked is what turns on the GPU's acceptance of chunks no
// checksum verifies (gpu.Options.Unverified), for every decoding mode that
// uses a GPU; without it they stay on the CPU, and with --decode cpu it is
// refused rather than ignored.
func TestGPUTrustUncheckedFlag(t *testing.T) {
	parse := func(args ...string) (*sourceFlags, error) {
		var f sourceFlags
		cmd := &cobra.Command{Use: "mount"}
		f.register(cmd, true)
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		o, err := f.decodeOptions()
		if err == nil && o.GPU.Unverified != f.gpuTrust {
			t.Errorf("%q: Unverified %v", args, o.GPU.Unverified)
		}
		return &f, err
	}
	for _, args := range [][]string{{}, {"--decode", "gpu"}, {"--decode", "cpu"}} {
		if f, err := parse(args...); err != nil || f.gpuTrust {
			t.Errorf("%q: trusted %v, %v", args, f.gpuTrust, err)
		}
	}
	for _, mode := range []string{"auto", "gpu"} {
		if f, err := parse("--decode", mode, "--gpu-trust-unchecked"); err != nil || !f.gpuTrust {
			t.Errorf("--decode %s --gpu-trust-unchecked: trusted %v, %v", mode, f.gpuTrust, err)
		}
	}
	_, err := parse("--decode", "cpu", "--gpu-trust-unchecked")
	var u usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "--gpu-trust-unchecked: --decode cpu") {
		t.Errorf("--decode cpu --gpu-trust-unchecked: %v, want a usage error naming both", err)
	}
	// The help says what it trusts.
	var f sourceFlags
	cmd := &cobra.Command{Use: "mount"}
	f.register(cmd, true)
	help := cmd.Flags().Lookup("gpu-trust-unchecked").Usage
	for _, w := range []string{"zstd frames without a content checksum", "nvCOMP", "wrong bytes"} {
		if !strings.Contains(help, w) {
			t.Errorf("--gpu-trust-unchecked's help lacks %q: %s", w, help)
		}
	}
}

// --gpu-kernels (hidden) hands a PTX file's text to the GPUs, and refuses
// a file that is not PTX or is missing.
func TestGPUKernelsFlag(t *testing.T) {
	dir := t.TempDir()
	ptx := filepath.Join(dir, "kernels.ptx")
	text := ".version 9.0\n.target sm_75\n.visible .entry xxh64_check(\n"
	if err := os.WriteFile(ptx, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	notPTX := filepath.Join(dir, "x.txt")
	if err := os.WriteFile(notPTX, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := func(args ...string) (string, error) {
		var f sourceFlags
		cmd := &cobra.Command{Use: "mount"}
		f.register(cmd, true)
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		o, err := f.decodeOptions()
		return o.GPU.KernelsPTX, err
	}
	if got, err := opts("--gpu-kernels", ptx); err != nil || got != text {
		t.Errorf("--gpu-kernels %s: %q, %v", ptx, got, err)
	}
	if got, err := opts(); err != nil || got != "" {
		t.Errorf("no --gpu-kernels: %q, %v", got, err)
	}
	for _, bad := range []string{notPTX, filepath.Join(dir, "missing.ptx")} {
		var u usageError
		if _, err := opts("--gpu-kernels", bad); !errors.As(err, &u) || !strings.Contains(err.Error(), "--gpu-kernels") {
			t.Errorf("--gpu-kernels %s: %v, want a usage error", bad, err)
		}
	}
}

// --pinned-memory left out follows --gpu-memory (decode.Options), so that
// --gpu-memory alone sizes GPU decoding; given too small for the rounds
// of --decode gpu, it is a usage error of one line naming it.
func TestPinnedMemoryFollowsGPUMemory(t *testing.T) {
	parse := func(args ...string) *sourceFlags {
		var f sourceFlags
		cmd := &cobra.Command{Use: "mount"}
		f.register(cmd, true)
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		return &f
	}
	o, err := parse("--gpu-memory", "8GiB").decodeOptions()
	if err != nil || o.PinnedMemory != 0 || o.GPUMemory != 8<<30 {
		t.Errorf("--gpu-memory 8GiB alone: pinned %d, %v; want 0 (it follows)", o.PinnedMemory, err)
	}
	if _, err := parse("--pinned-memory", "0").decodeOptions(); err == nil {
		t.Error("--pinned-memory 0 accepted")
	}
	_, err = parse("--decode", "gpu", "--gpu-memory", "8GiB", "--pinned-memory", "2GiB").newPipeline(discardLogger())
	var u usageError
	if !errors.As(err, &u) || !strings.HasPrefix(errorLine(err), "zarrfs: --pinned-memory 2GiB: ") || strings.Contains(err.Error(), "\n") {
		t.Errorf("--decode gpu --gpu-memory 8GiB --pinned-memory 2GiB: %v, want a usage error naming --pinned-memory", err)
	}
	// The help says what it follows.
	var f sourceFlags
	cmd := &cobra.Command{Use: "mount"}
	f.register(cmd, true)
	if help := cmd.Flags().Lookup("pinned-memory").Usage; !strings.Contains(help, "follows --gpu-memory") {
		t.Errorf("--pinned-memory's help: %s", help)
	}
}
