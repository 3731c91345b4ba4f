package decode

import (
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/gpu"
)

func TestNegativeHostIdleRefused(t *testing.T) {
	_, err := New(Options{Mode: CPU, GPU: gpu.Options{HostIdle: -time.Second}})
	if err == nil || !strings.Contains(err.Error(), "HostIdle") {
		t.Errorf("HostIdle -1s: %v", err)
	}
}

// Without devices, --decode gpu says why in the probe's words (a missing
// driver library), not "the driver sees no device".
func TestNoDeviceReason(t *testing.T) {
	var made []*fakeGPU
	o := fakes(GPU, 0, &made)
	o.noDevice = func() string { return "CUDA driver library libcuda.so.1 not found" }
	_, err := New(o)
	if err == nil || !strings.Contains(err.Error(), "libcuda.so.1 not found") || strings.Contains(err.Error(), "sees no device") {
		t.Errorf("no device: %v", err)
	}
	o.noDevice = func() string { return "" }
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), "sees no device") {
		t.Errorf("no device, no reason known: %v", err)
	}
}
