package deliver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/codec"
)

// zstdJobs are n zstd chunks of size decoded bytes, one frame each.
func zstdJobs(t *testing.T, n, size int) []codec.Job {
	t.Helper()
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	jobs := make([]codec.Job, n)
	for i := range jobs {
		raw := bytes.Repeat([]byte{byte(i), 1, 2, 3}, size/4)
		jobs[i] = codec.Job{Codec: codec.Zstd, Src: enc.EncodeAll(raw, nil), Dst: make([]byte, size)}
	}
	return jobs
}

// largeJobs are 8 zstd chunks of large parts: 2 MiB each, but chunk 3 of
// 4 MiB, the largest part (first to the host).
func largeJobs(t *testing.T) []codec.Job {
	t.Helper()
	jobs := zstdJobs(t, 8, 2<<20)
	jobs[3] = zstdJobs(t, 1, 4<<20)[0]
	return jobs
}

// The host takes chunks of large parts, largest first, as far as it
// decodes them within the device's time for them, all of them where it is
// the sooner; chunks of small parts never; either side's measure not
// known, a chunk for each of its workers; shut out by its rate, one chunk
// again now and then.
func TestRouterSplit(t *testing.T) {
	big := largeJobs(t)
	small := zstdJobs(t, 4, 256<<10)
	jobs := append(big, small...)
	all := make([]int, len(jobs))
	for i := range all {
		all[i] = i
	}
	var r router
	host, large := r.split(jobs, all, 0)
	if fmt.Sprint(host) != "[3]" || !large {
		t.Fatalf("nothing measured, workers not known: the host takes %v (want the largest chunk alone), device keeps large parts %v", host, large)
	}
	if host, large = r.split(jobs, all, 3); fmt.Sprint(host) != "[3 0 1]" || !large {
		t.Fatalf("nothing measured, 3 workers: the host takes %v (want the 3 largest chunks), device keeps large parts %v", host, large)
	}
	if host, large = r.split(jobs, all, 16); len(host) != 8 || large {
		t.Fatalf("nothing measured, 16 workers: the host takes %v, want all 8 chunks of large parts", host)
	}
	r.hostRate = 1 << 30
	if host, large = r.split(jobs, all, 3); fmt.Sprint(host) != "[3 0 1]" || !large {
		t.Fatalf("the device's wait not measured, 3 workers: the host takes %v (want the 3 largest chunks), device keeps large parts %v", host, large)
	}
	r.devWait = 200 * time.Millisecond
	r.hostRate = 50 << 20 // 7.5 MiB in 150 ms: the 4 MiB chunk and one of 2
	if host, large = r.split(jobs, all, 0); fmt.Sprint(host) != "[3 0]" || !large {
		t.Fatalf("a slow host takes %v, want [3 0] and the rest on the device (%v)", host, large)
	}
	r.hostRate = 1 << 30
	if host, large = r.split(jobs, all, 0); len(host) != 8 || large {
		t.Fatalf("a fast host takes %v, want all 8 chunks of large parts, none of the small ones", host)
	}
	for _, i := range host {
		if i >= 8 {
			t.Fatalf("the host took chunk %d, of small parts", i)
		}
	}
	r.hostRate = 1 << 10
	for k := 1; k < reprobe; k++ {
		if host, _ = r.split(jobs, all, 0); len(host) != 0 {
			t.Fatalf("fill %d: a host too slow for any chunk takes %v", k, host)
		}
	}
	if host, large = r.split(jobs, all, 0); len(host) != 1 || host[0] == 3 || !large {
		t.Fatalf("after %d fills without: the host takes %v, want one chunk, not the largest, to measure itself again", reprobe, host)
	}
	if host, _ := r.split(small, []int{0, 1, 2, 3}, 0); len(host) != 0 {
		t.Fatalf("only small parts: the host takes %v", host)
	}
}

// A decoder with a worker for each of a fill's large chunks takes them all,
// so the device's wait is never measured; after probeDevice such fills the
// device decodes the smallest, once: measured, the router goes by the
// measures again.
func TestRouterProbesTheDevice(t *testing.T) {
	jobs := largeJobs(t)
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	r := router{hostRate: 1 << 30}
	for k := 1; k < probeDevice; k++ {
		if host, large := r.split(jobs, all, 16); len(host) != 8 || large {
			t.Fatalf("fill %d on 16 workers: the host takes %v (device keeps large parts %v), want all 8", k, host, large)
		}
	}
	host, large := r.split(jobs, all, 16)
	if len(host) != 7 || !large || slices.Contains(host, 7) {
		t.Fatalf("after %d fills all on the host, the device's wait not known: the host takes %v (device keeps large parts %v), want all but the smallest, chunk 7",
			probeDevice, host, large)
	}
	r.deviceDone(200 * time.Millisecond)
	for k := 0; k < 2*probeDevice; k++ {
		if host, large := r.split(jobs, all, 16); len(host) != 8 || large {
			t.Fatalf("fill %d after the device's wait is measured: the host takes %v (device keeps large parts %v), want all 8", k, host, large)
		}
	}
}

// A share of fewer chunks than the host's decoder has workers decodes
// each chunk on a worker of its own: its rate counts for the workers it
// left idle, so that the share grows to what they decode at once in the
// fill after the first measure, not over many; a share that filled them,
// or a decoder that does not say, counts as measured.
func TestRouterScalesASmallShare(t *testing.T) {
	jobs := zstdJobs(t, 8, 2<<20) // 16 MiB of large parts
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	split := func(chunks, workers int, d time.Duration) int {
		r := router{devWait: 200 * time.Millisecond}
		r.hostDone(int64(chunks)*2<<20, d, chunks, workers)
		host, _ := r.split(jobs, all, 0)
		return len(host)
	}
	// 2 MiB in 20 ms: 100 MiB/s for 150 ms (0.75 of the device's 200):
	// 15 MiB, 7 chunks.
	if n := split(1, 0, 20*time.Millisecond); n != 7 {
		t.Fatalf("one chunk, workers not known: the host takes %d chunks, want 7", n)
	}
	if n := split(8, 4, 160*time.Millisecond); n != 7 {
		t.Fatalf("8 chunks on 4 workers at 100 MiB/s: the host takes %d chunks, want 7", n)
	}
	// One chunk on 8 workers: 800 MiB/s, 120 MiB in 150 ms: all 8.
	if n := split(1, 8, 20*time.Millisecond); n != 8 {
		t.Fatalf("one chunk on 8 workers: the host takes %d chunks, want all 8", n)
	}
}

// bigStore writes a Zarr v3 store of 6 time steps: z (float32, 2 levels
// of 512x512, zstd with a content checksum, a chunk of 2 MiB per step)
// and c (512x512 in chunks of 32 rows, 64 KiB, zstd with one); every
// element differs.
func bigStore(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	zs, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	put := func(p string, b []byte) { writeFile(t, dir, p, b) }
	meta := func(shape, chunks []int, dims []string) []byte { return arrayMeta(shape, chunks, dims, "zstd") }
	field := func(n int, seed float32) []byte {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(seed+float32(i%1013)*0.25))
		}
		return b
	}
	put("zarr.json", []byte(`{"zarr_format":3,"node_type":"group"}`))
	put("z/zarr.json", meta([]int{6, 2, 512, 512}, []int{1, 2, 512, 512}, []string{"time", "level", "y", "x"}))
	put("c/zarr.json", meta([]int{6, 512, 512}, []int{1, 32, 512}, []string{"time", "y", "x"}))
	for k := range 6 {
		put(fmt.Sprintf("z/c/%d/0/0/0", k), zs.EncodeAll(field(2*512*512, float32(1000*k)), nil))
		for y := range 16 {
			put(fmt.Sprintf("c/c/%d/%d/0", k, y), zs.EncodeAll(field(32*512, float32(1000*k+10*y+7)), nil))
		}
	}
	return dir
}

// Where the device takes long for chunks of large parts (as nvCOMP does
// for a few large zstd frames), the host decodes them instead, straight
// into pinned memory and into the slot, never the shadow, after one fill
// that measures both sides; chunks of small parts stay on the device;
// every sample equals the mount's file.
func TestGPUFillHostShare(t *testing.T) {
	s, c, mem, filler, lay := gpuServer(t, bigStore(t), "views:\n  - name: w\n    channels:\n      - var: z\n        select: {level: all}\n      - var: c\n")
	rep, dev := c.openDevice(t, mem, "w", 2, 2)
	dev.slow = 300 * time.Millisecond
	const chunk = 2 << 20
	for b, batch := range [][]string{{"0.npy", "1.npy"}, {"2.npy", "3.npy"}, {"4.npy", "5.npy"}, {"1.npy", "2.npy"}} {
		slot := b % 2
		c.fillChecked(t, dev, rep, filler, lay, "w", slot, batch)
		for j, n := range batch {
			if sh := dev.lastShadow(slot, 2*rep.SampleBytes)[int64(j)*rep.SampleBytes:][:chunk]; bytes.Count(sh, []byte{0}) != chunk {
				t.Fatalf("w/%s: the host's share went through the shadow", n)
			}
		}
	}
	rings, tot := s.Stats()
	// The first fill: one z chunk on the host (its rate), one on the
	// device (its time); then every z chunk on the host, as the ring's
	// route in status says.
	if tot.HostShare != 7*chunk || dev.slowCalls.Load() != 1 || dev.decoded.Load() != 8*16+1 {
		t.Fatalf("host share %d bytes (want 7 chunks, %d), %d slow device calls (want 1), %d chunks on the device (want 128 of c and 1 of z)",
			tot.HostShare, 7*chunk, dev.slowCalls.Load(), dev.decoded.Load())
	}
	if tot.Stages["host_share"] <= 0 || tot.Uploaded < tot.HostShare {
		t.Fatalf("stages %v, uploaded %d", tot.Stages, tot.Uploaded)
	}
	if len(rings) != 1 || rings[0].Route == nil {
		t.Fatalf("rings %+v: want one, with its route", rings)
	}
	if r := rings[0].Route; r.Fills != 4 || r.AllOnHost != 3 || r.OnHost != 7 || r.OnDevice != 1 || r.DeviceWait < 0.3 || r.HostRate <= 0 {
		t.Fatalf("route %+v: want 4 fills with large parts, 3 all on the host, 7 such chunks on the host and 1 on the device, "+
			"the device's wait of at least its 0.3 s, a host rate", r)
	}
	// The share went through the mount's CPU decoder (its workers and
	// counters), not around it.
	if cpu := s.Device.(GPUFill).CPU.(*countingCPU); cpu.jobs.Load() != 7 || cpu.bytes.Load() != 7*chunk {
		t.Fatalf("the CPU decoder took %d jobs, %d bytes; want the 7 chunks of the host's share", cpu.jobs.Load(), cpu.bytes.Load())
	}
	if f := dev.foreign.Load(); f != 0 {
		t.Errorf("%d compressed chunks did not come from the ring's memory", f)
	}
}

// The first fill, before either side is measured, gives the host a chunk
// of large parts for each of its decoder's workers through the mount's
// CPU decoder (its Workers), and the device none of them to wait for.
func TestGPUFillFirstShareFillsTheWorkers(t *testing.T) {
	s, c, mem, filler, lay := gpuServer(t, bigStore(t), "views:\n  - name: w\n    channels:\n      - var: z\n        select: {level: all}\n      - var: c\n")
	rep, dev := c.openDevice(t, mem, "w", 2, 2)
	dev.slow = 300 * time.Millisecond
	cpu := s.Device.(GPUFill).CPU.(*countingCPU)
	cpu.workers.Store(2)
	c.fillChecked(t, dev, rep, filler, lay, "w", 0, []string{"0.npy", "1.npy"})
	_, tot := s.Stats()
	if n := cpu.jobs.Load(); n != 2 || tot.HostShare != 2*(2<<20) || dev.slowCalls.Load() != 0 {
		t.Fatalf("the host decoded %d chunks, %d bytes, the device %d slow rounds: want both chunks of z on the host, none on the device",
			n, tot.HostShare, dev.slowCalls.Load())
	}
}

// The host's share of a chunk of which a fill takes a part (one level of
// z's two) copies into the slot that part alone, where it goes, as the
// device does: every sample equals the mount's file.
func TestGPUFillHostSharePart(t *testing.T) {
	s, c, mem, filler, lay := gpuServer(t, bigStore(t), "views:\n  - name: w\n    channels:\n      - var: z\n        select: {level: [1]}\n      - var: c\n")
	rep, dev := c.openDevice(t, mem, "w", 2, 2)
	dev.slow = 300 * time.Millisecond
	const level = 1 << 20
	for b, batch := range [][]string{{"0.npy", "1.npy"}, {"2.npy", "3.npy"}, {"4.npy", "5.npy"}, {"1.npy", "2.npy"}} {
		c.fillChecked(t, dev, rep, filler, lay, "w", b%2, batch)
	}
	_, tot := s.Stats()
	if tot.HostShare != 7*level || tot.Uploaded != tot.HostShare {
		t.Fatalf("host share %d bytes (want a level of 7 chunks, %d), uploaded %d (want the share alone)", tot.HostShare, 7*level, tot.Uploaded)
	}
}
