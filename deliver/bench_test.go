package deliver

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// BenchmarkGPUFillHost measures the host's part of the device path (the
// daemon's CPU a sample): compressed chunks read into the ring's memory,
// the samples laid out, the fill request and reply, the device decoding
// nothing. A sample is 4 levels of one variable in one chunk, 4
// single-level variables and a static one (a land-sea mask), 512x1024
// float32 (18 MiB).
func BenchmarkGPUFillHost(b *testing.B) { benchGPUFillDir(b, true, "v") }

// BenchmarkGPUFillHostArray is BenchmarkGPUFillHost over a single-level
// variable's sample directory: a batch of 4 samples of one 2 MiB chunk each.
func BenchmarkGPUFillHostArray(b *testing.B) { benchGPUFillDir(b, true, "a") }

// BenchmarkGPUFillHostDecodes is BenchmarkGPUFillHost with every chunk
// left to the host (zstd frames without a checksum, which the test device
// refuses): decoded into the slot's shadow and copied into the slot.
func BenchmarkGPUFillHostDecodes(b *testing.B) { benchGPUFillDir(b, false, "v") }

// benchGPUFillDir fills batches of sample directory sd of the store
// BenchmarkGPUFillHost describes, its zstd frames with a content checksum
// or without.
func benchGPUFillDir(b *testing.B, checksum bool, sd string) {
	dir := b.TempDir()
	zs, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(checksum))
	put := func(p string, data []byte) { writeFile(b, dir, p, data) }
	meta := func(shape, chunks []int, dims []string) []byte { return arrayMeta(shape, chunks, dims, "zstd") }
	// Smooth, with noise in the low bits: zstd keeps about half, as of
	// reanalysis fields.
	field := func(n int, seed float32) []byte {
		out := make([]byte, 4*n)
		r := rand.New(rand.NewPCG(uint64(seed), 3))
		for i := range n {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(seed+float32(i%1013)*0.25)^uint32(r.IntN(1<<14)))
		}
		return out
	}
	const steps, ny, nx = 8, 512, 1024
	put("zarr.json", []byte(`{"zarr_format":3,"node_type":"group"}`))
	put("t/zarr.json", meta([]int{steps, 4, ny, nx}, []int{1, 4, ny, nx}, []string{"time", "level", "y", "x"}))
	views := "views:\n  - name: v\n    channels:\n      - var: t\n        select: {level: all}\n"
	for _, v := range []string{"a", "b", "c", "d"} {
		put(v+"/zarr.json", meta([]int{steps, ny, nx}, []int{1, ny, nx}, []string{"time", "y", "x"}))
		views += "      - var: " + v + "\n"
	}
	put("s/zarr.json", meta([]int{ny, nx}, []int{ny, nx}, []string{"y", "x"}))
	put("s/c/0/0", zs.EncodeAll(field(ny*nx, 7), nil))
	views += "      - var: s\n"
	for k := range steps {
		put(fmt.Sprintf("t/c/%d/0/0/0", k), zs.EncodeAll(field(4*ny*nx, float32(1000*k)), nil))
		for i, v := range []string{"a", "b", "c", "d"} {
			put(fmt.Sprintf("%s/c/%d/0/0", v, k), zs.EncodeAll(field(ny*nx, float32(1000*k+10*i)), nil))
		}
	}
	s, c, mem, _, _ := gpuServer(b, dir, views)
	rep, dev := c.openDevice(b, mem, sd, 2, 4)
	dev.idle = checksum
	b.SetBytes(4 * rep.SampleBytes)
	b.ResetTimer()
	for i := range b.N {
		batch := make([]string, 4)
		for j := range batch {
			batch[j] = fmt.Sprintf("%d.npy", (4*i+j)%steps)
		}
		if r := c.fill(b, i%2, batch...); r.Op != "ready" || r.Device != 4 {
			b.Fatalf("fill %d: %+v", i, r)
		}
	}
	b.StopTimer()
	_, tot := s.Stats()
	// The static channel crosses once a fill, copied on the device into
	// the batch's other samples.
	plane, static := int64(4*ny*nx), int64(0)
	if sd == "v" {
		static = int64(b.N) * plane
	}
	if !checksum {
		// Every other byte the host decoded crosses.
		if want := int64(b.N)*4*rep.SampleBytes - 3*static; tot.Uploaded != want {
			b.Fatalf("%d bytes uploaded in %d fills of %d, want %d", tot.Uploaded, b.N, 4*rep.SampleBytes, want)
		}
		return
	}
	if tot.Uploaded != tot.HostShare+static {
		b.Fatalf("%d bytes uploaded, %d of them the host's share and %d the static channel: the host decoded other chunks", tot.Uploaded, tot.HostShare, static)
	}
}
