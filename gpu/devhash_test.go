package gpu

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
)

// On the GPU (make test-gpu; with -gpu.ptx when the embedded PTX predates
// the kernel): zstd frames with a content checksum decode into a ring slot
// held to their checksum by xxh64_check, every length's tail path and a
// frame of megabytes among them, byte for byte the data compressed; one
// whose checksum does not match is corrupt.
func TestGPURingXXH64(t *testing.T) {
	d, err := New(Options{})
	if err != nil {
		t.Skipf("no GPU decoding here: %v", err)
	}
	defer d.Close()
	if !d.hashKernel {
		if *flagPTX != "" {
			t.Fatalf("%s defines no xxh64_check", *flagPTX)
		}
		t.Skip("the embedded PTX predates xxh64_check: compile kernels.cu and pass -gpu.ptx")
	}
	ringXXH64(t, d)
}

// The same on the fake GPU, whose xxh64_check is emuXXH64.
func TestFakeGPURingXXH64(t *testing.T) {
	d, _, _ := ringDecoder(t, Options{KernelsPTX: testPTX(t, true)})
	ringXXH64(t, d)
}

func ringXXH64(t *testing.T, d *Decoder) {
	rng := rand.New(rand.NewPCG(43, 2))
	var datas [][]byte
	for _, n := range []int{1, 3, 4, 7, 8, 31, 32, 33, 63, 64, 127, 128, 129, 1000, 4096 + 17, 1 << 20, 4<<20 + 5} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32() >> 29) // compressible, not constant
		}
		datas = append(datas, b)
	}
	datas = append(datas, field(721, 1440, 5), make([]byte, 3<<20))
	var slot int64
	offs := make([]int64, len(datas)+1)
	for i, b := range datas {
		offs[i] = slot
		slot += alignUp(int64(len(b)), 256)
	}
	// The damaged frame, a copy of the field's, goes where the field's
	// went, in a round of its own.
	offs[len(datas)] = offs[len(datas)-2]
	r, err := d.NewRing(1, slot, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var jobs []codec.Job
	for _, b := range append(datas, datas[len(datas)-2]) {
		src := zstdCompress(b, 3)
		jobs = append(jobs, codec.Job{Codec: codec.Zstd, Src: src, Dst: make([]byte, len(b))})
	}
	last := jobs[len(jobs)-1].Src
	last[len(last)-2] ^= 0x10 // the checksum: the frame decodes as before
	if err := r.Decode(context.Background(), 0, jobs[:len(datas)], offs[:len(datas)], nil); err != nil {
		t.Fatal(err)
	}
	for i, b := range datas {
		if jobs[i].Err != nil {
			t.Fatalf("frame %d (%d bytes): %v", i, len(b), jobs[i].Err)
		}
		if got := ringBytes(t, r, offs[i], int64(len(b))); !bytes.Equal(got, b) {
			t.Fatalf("frame %d (%d bytes): the slot's bytes differ from the data compressed", i, len(b))
		}
	}
	bad := jobs[len(datas):]
	if err := r.Decode(context.Background(), 0, bad, offs[len(datas):], nil); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(bad[0].Err, codec.ErrCorrupt) || !strings.Contains(bad[0].Err.Error(), "XXH64") {
		t.Fatalf("a frame whose checksum does not match: %v, want corrupt (XXH64)", bad[0].Err)
	}
}

// ringBytes copies n bytes of slot 0 at off to the host.
func ringBytes(t *testing.T, r *Ring, off, n int64) []byte {
	t.Helper()
	buf := r.d.HostAllocWait(int(n), 10*time.Second)
	defer r.d.HostFree(buf)
	err := r.call(func() error {
		cu := r.d.cu
		if err := cu.check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(unsafe.Pointer(&buf[0]), r.Addr(0, off), uint64(n), r.streams[0])); err != nil {
			return err
		}
		return cu.check("cuEventRecord", cu.cuEventRecord(r.copied[0], r.streams[0]))
	})
	if err == nil {
		err = r.await(0, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(buf)
}
