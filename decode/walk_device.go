//go:build gpuwalk

package decode

// walkOnDevice is true in a build with -tags gpuwalk: the experiment of
// walking on the GPU the LZ4 blocks sent there (gpu.Options.WalkOnDevice).
const walkOnDevice = true
