//go:build !gpuwalk

package decode

// walkOnDevice is false: LZ4 blocks sent to a GPU are walked on the host
// (gpu.Options.WalkOnDevice). Build with -tags gpuwalk for the experiment
// of walking them on the device.
const walkOnDevice = false
