package main

import (
	"testing"

	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/zarr/codec"
)

// gpuOf finds the GPU decoder whose Stats warm and the metrics report,
// alone or inside --decode auto's Overflow, and nothing in a CPU decoder.
func TestGPUOf(t *testing.T) {
	g := &gpu.Decoder{} // never opened: only its identity matters here
	cpu := codec.NewCPU(codec.Options{})
	defer cpu.Close()
	for _, tc := range []struct {
		name string
		dec  codec.BatchDecoder
		want *gpu.Decoder
	}{
		{"gpu", g, g},
		{"auto", &codec.Overflow{First: cpu, Then: g}, g},
		{"gpu first", &codec.Overflow{First: g, Then: cpu}, g},
		{"cpu", cpu, nil},
		{"nil", nil, nil},
	} {
		if got := gpuOf(tc.dec); got != tc.want {
			t.Errorf("%s: gpuOf = %p, want %p", tc.name, got, tc.want)
		}
	}
}
