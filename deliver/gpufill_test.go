package deliver

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// The host copies into the slot exactly what the device did not write, of
// the samples it is asked for.
func TestGaps(t *testing.T) {
	for _, tc := range []struct {
		covered [][2]int64
		lo, hi  int64
		want    string
	}{
		{nil, 0, 10, "[[0 10]]"},
		{[][2]int64{{0, 10}}, 0, 10, "[]"},
		{[][2]int64{{2, 4}, {4, 6}, {8, 9}}, 0, 10, "[[0 2] [6 8] [9 10]]"},
		{[][2]int64{{0, 3}, {5, 10}}, 0, 12, "[[3 5] [10 12]]"},
		{[][2]int64{{0, 3}, {5, 10}, {12, 14}, {16, 20}}, 10, 16, "[[10 12] [14 16]]"},
		{[][2]int64{{0, 3}}, 5, 8, "[[5 8]]"},
	} {
		if got := fmt.Sprint(gapsIn(tc.covered, tc.lo, tc.hi)); got != tc.want {
			t.Errorf("gapsIn(%v, %d, %d) = %s, want %s", tc.covered, tc.lo, tc.hi, got, tc.want)
		}
	}
}

// devStore writes a Zarr v3 store of 6 time steps: a (2 levels, zstd with
// a content checksum, a chunk per step holding both levels), c (zstd with
// one), b (zstd without one) and a static s (zstd with one), all float32
// 128x128, and the view v stacking a's levels, s, c and b; every element
// differs.
func devStore(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	zs, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	nosum, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(false))
	put := func(p string, b []byte) { writeFile(t, dir, p, b) }
	meta := arrayMeta
	field := func(n int, seed float32) []byte {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(seed+float32(i%97)*0.5))
		}
		return b
	}
	put("zarr.json", []byte(`{"zarr_format":3,"node_type":"group"}`))
	const ny, nx = 128, 128
	put("a/zarr.json", meta([]int{6, 2, ny, nx}, []int{1, 2, ny, nx}, []string{"time", "level", "y", "x"}, "zstd"))
	put("b/zarr.json", meta([]int{6, ny, nx}, []int{1, ny, nx}, []string{"time", "y", "x"}, "zstd"))
	put("c/zarr.json", meta([]int{6, ny, nx}, []int{1, ny, nx}, []string{"time", "y", "x"}, "zstd"))
	put("s/zarr.json", meta([]int{ny, nx}, []int{ny, nx}, []string{"y", "x"}, "zstd"))
	for k := range 6 {
		put(fmt.Sprintf("a/c/%d/0/0/0", k), zs.EncodeAll(field(2*ny*nx, float32(100*k)), nil))
		put(fmt.Sprintf("b/c/%d/0/0", k), nosum.EncodeAll(field(ny*nx, float32(100*k+7)), nil))
		put(fmt.Sprintf("c/c/%d/0/0", k), zs.EncodeAll(field(ny*nx, float32(100*k+3)), nil))
	}
	put("s/c/0/0", zs.EncodeAll(field(ny*nx, -5), nil))
	return dir
}

// testDevice is a ring in "device memory" for the device path's tests: the
// slots are host shared memory (hostRing) that decode writes as a GPU
// would, refusing zstd frames without a checksum (ErrUnsupported: the host
// decodes them); the shadow
// is a mapping of its own; memory lends what compressed chunks are read
// into, and decode checks that every chunk it is given lies there.
var _ deviceRing = (*testDevice)(nil)

type testDevice struct {
	*hostRing
	shadow   []byte
	slot     int64
	lent     sync.Map // *byte -> true while lent
	foreign  atomic.Int64
	decoded  atomic.Int64
	runs     atomic.Int64 // runs of decoded chunks copied into a slot
	refusals atomic.Int64
	copied   atomic.Int64 // bytes copied within a slot on the device
	rt       router
	// slow, when set, is how long a decode with a chunk of a large part
	// takes (nvCOMP on a few large zstd frames); slowCalls counts them.
	slow      time.Duration
	slowCalls atomic.Int64
	// idle, when set, makes decode do nothing, and releaseShadow keep no
	// record (benchmarks of the host's part).
	idle bool
	mu   sync.Mutex
	free map[int][][]byte // memory lent and given back, by size
	// last is, per slot, a copy of its shadow as the fills left it, each
	// range taken before its pages went back (releaseShadow).
	last map[int][]byte
	// budget is the fills' memory budget; uncharged the most bytes of the
	// shadow's pages in memory that it did not count when pages went back
	// (-1: mincore failed), and releasedMost the most bytes in memory then.
	budget                  *memory.Budget
	uncharged, releasedMost atomic.Int64
	// lost, when set, is the error of every write (gpu.ErrRingLost: a
	// context rebuild freed the ring).
	lost atomic.Pointer[error]
}

func (d *testDevice) Begin(k int) error {
	if p := d.lost.Load(); p != nil {
		return *p
	}
	return d.hostRing.Begin(k)
}

func (d *testDevice) Write(ctx context.Context, k int, off int64, b []byte) error {
	if p := d.lost.Load(); p != nil {
		return *p
	}
	return d.hostRing.Write(ctx, k, off, b)
}

func (d *testDevice) releaseShadow(k int, off, n int64) {
	if d.idle {
		// A benchmark of the host's part: no bookkeeping of the tests'.
		dropPages(d.shadowOf(k), off, n)
		return
	}
	if res, err := d.resident(); err == nil {
		// The shadow's pages in memory must be counted in the budget
		// while they are.
		if over := res - d.budget.Used(); over > d.uncharged.Load() {
			d.uncharged.Store(over)
		}
		d.releasedMost.Store(max(d.releasedMost.Load(), res))
	} else {
		d.uncharged.Store(-1)
	}
	d.mu.Lock()
	if d.last == nil {
		d.last = map[int][]byte{}
	}
	if d.last[k] == nil {
		d.last[k] = make([]byte, d.slot)
	}
	copy(d.last[k][off:off+n], d.shadowOf(k)[off:off+n])
	d.mu.Unlock()
	dropPages(d.shadowOf(k), off, n)
}

// lastShadow is slot k's shadow as its fills left it, n bytes of it.
func (d *testDevice) lastShadow(k int, n int64) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return bytes.Clone(d.last[k][:n])
}

// resident is the bytes of the shadow's pages in memory (mincore).
func (d *testDevice) resident() (int64, error) {
	page := os.Getpagesize()
	vec := make([]byte, (len(d.shadow)+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&d.shadow[0])), uintptr(len(d.shadow)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, e
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * int64(page), nil
}

// mustResident is resident, failing the test on error.
func (d *testDevice) mustResident(t testing.TB) int64 {
	t.Helper()
	n, err := d.resident()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (d *testDevice) route() *router { return &d.rt }

func (d *testDevice) copyInSlot(_ context.Context, k int, dst, src, n int64) error {
	slot := d.Host(k)
	copy(slot[dst:dst+n], slot[src:src+n])
	d.copied.Add(n)
	return nil
}

func (d *testDevice) shadowOf(k int) []byte {
	return d.shadow[int64(k)*d.slot : int64(k+1)*d.slot]
}

func (d *testDevice) memory() codec.HostMemory { return lender{d} }

type lender struct{ d *testDevice }

// HostAlloc lends memory given back before where it can, as a GPU's
// pinned arenas do (it is not cleared).
func (l lender) HostAlloc(n int) []byte {
	l.d.mu.Lock()
	var b []byte
	if free := l.d.free[n]; len(free) > 0 {
		b = free[len(free)-1]
		l.d.free[n] = free[:len(free)-1]
	}
	l.d.mu.Unlock()
	if b == nil {
		b = make([]byte, n)
	}
	l.d.lent.Store(&b[0], true)
	return b
}

// Retain holds nothing: the fills give each buffer back once.
func (l lender) Retain([]byte) bool { return false }

func (l lender) HostFree(b []byte) {
	l.d.lent.Delete(&b[:1][0])
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	if l.d.free == nil {
		l.d.free = map[int][][]byte{}
	}
	l.d.free[len(b)] = append(l.d.free[len(b)], b)
}

func (d *testDevice) decode(ctx context.Context, k int, jobs []codec.Job, runs [][]gpu.Run, t *gpu.RingTimes) error {
	if d.idle {
		for i := range jobs {
			d.decoded.Add(1)
			if _, ok := d.lent.Load(&jobs[i].Src[0]); !ok {
				d.foreign.Add(1)
			}
		}
		return nil
	}
	slot := d.Host(k)
	t0 := time.Now()
	defer func() { t.Wait += time.Since(t0) }()
	for i := range jobs {
		if d.slow > 0 && gpu.LargestPiece(&jobs[i]) >= minHostPiece {
			d.slowCalls.Add(1)
			time.Sleep(d.slow)
			break
		}
	}
	for i := range jobs {
		j := &jobs[i]
		if _, ok := d.lent.Load(&j.Src[0]); !ok {
			d.foreign.Add(1)
		}
		if j.Codec == codec.Zstd && len(j.Src) > 4 && j.Src[4]&0x04 == 0 {
			d.refusals.Add(1)
			j.Err = fmt.Errorf("test device: %w", codec.ErrUnsupported)
			continue
		}
		// Into a buffer of its own, as the GPU decodes into the round's,
		// whence its runs are copied.
		out := make([]byte, len(j.Dst))
		if j.Err = codec.Decode(j.Codec, out, j.Src); j.Err == nil {
			for _, r := range runs[i] {
				copy(slot[r.At:r.At+r.N], out[r.From:r.From+r.N])
			}
			d.runs.Add(int64(len(runs[i])))
		}
		d.decoded.Add(1)
	}
	t.Checks += time.Microsecond
	return nil
}

type testDeviceMemory struct {
	dev    chan *testDevice
	budget *memory.Budget
}

func (testDeviceMemory) Kind() string { return MemoryCUDA }

func (m testDeviceMemory) NewRing(ctx context.Context, req *OpenRequest, slots int, slotBytes int64) (Ring, error) {
	hr, err := HostMemory{}.NewRing(ctx, &OpenRequest{Memory: MemoryHost}, slots, slotBytes)
	if err != nil {
		return nil, err
	}
	shadow, err := unix.Mmap(-1, 0, int(int64(slots)*slotBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	d := &testDevice{hostRing: hr.(*hostRing), shadow: shadow, slot: slotBytes, budget: m.budget}
	m.dev <- d
	return d, nil
}

// A ring lost to a context rebuild fails its fills with code ring_lost,
// not as a damaged sample: the reader lets go of the ring and opens
// another, rather than blame a file.
func TestRingLostReply(t *testing.T) {
	dir := devStore(t)
	_, c, mem, _, _ := gpuServer(t, dir, "")
	_, dev := c.openDevice(t, mem, "a", 2, 2)
	if r := c.fill(t, 0, "0.npy", "1.npy"); r.Op != "ready" {
		t.Fatalf("a fill before the ring is lost: %+v", r)
	}
	lost := fmt.Errorf("%w: GPU 0's context was reset after a device error: open a new ring", gpu.ErrRingLost)
	dev.lost.Store(&lost)
	if r := c.fill(t, 1, "0.npy", "1.npy"); r.Op != "error" || r.Code != CodeRingLost || r.File != "" || !strings.Contains(r.Error, "open a new ring") {
		t.Fatalf("a fill of the lost ring: %+v", r)
	}
}

// The device path fills a batch as a GPU would: the chunks the device
// takes (zstd with a checksum) are decoded into the slot and never touch
// the shadow; what it refuses (without one) the host decodes into the
// shadow, and only that is
// copied into the slot; the static channel, decoded once for the batch,
// is stamped into each sample from there, never through the shadow: it
// crosses once a batch, and is copied on the device into the other
// samples; the
// compressed chunks are read into the ring's memory; every sample equals
// the mount's file. The shadow's pages go back once the slot is filled; the
// static channel is decoded once, for the first batch, and kept.
func TestGPUFillIntoSlot(t *testing.T) {
	dir := devStore(t)
	s, c, mem, filler, lay := gpuServer(t, dir, "views:\n  - name: v\n    channels:\n      - var: a\n        select: {level: all}\n      - var: s\n      - var: c\n      - var: b\n")
	rep, dev := c.openDevice(t, mem, "v", 2, 3)
	const plane = 128 * 128 * 4
	batches := [][]string{{"0.npy", "1.npy", "2.npy"}, {"3.npy", "4.npy", "5.npy"}, {"1.npy", "3.npy", "5.npy"}}
	// The slots and shadows as each fill left them, compared with the
	// files once every batch is in (a file's fill would make the view's
	// static memo the fills must make themselves).
	var slots, shadows [][]byte
	for b, batch := range batches {
		slot := b % 2
		if r := c.fill(t, slot, batch...); r.Op != "ready" || r.Device != 3 || r.Host != 0 {
			t.Fatalf("batch %d: %+v", b, r)
		}
		if r := dev.mustResident(t); r != 0 {
			t.Fatalf("batch %d: the shadow holds %d bytes of memory once the slot is filled", b, r)
		}
		slots = append(slots, bytes.Clone(dev.Host(slot)))
		shadows = append(shadows, dev.lastShadow(slot, 3*rep.SampleBytes))
	}
	// The host decoded the 9 chunks of b the device refused and the
	// static channel once: the batches after the first copy it from the
	// view's memo.
	if fb := s.Device.(GPUFill).Fallback.(*countingCPU); fb.jobs.Load() != 10 {
		t.Fatalf("the host decoded %d chunks, want 9 of b and 1 of the static channel", fb.jobs.Load())
	}
	for b, batch := range batches {
		slot, shadow := b%2, shadows[b]
		for j, n := range batch {
			want := sampleBytes(t, filler, lay, "v/"+n)
			got := slots[b][int64(j)*rep.SampleBytes : int64(j+1)*rep.SampleBytes]
			if !bytes.Equal(got, want) {
				t.Fatalf("v/%s in slot %d differs from the file", n, slot)
			}
			sh := shadow[int64(j)*rep.SampleBytes : int64(j+1)*rep.SampleBytes]
			// Channels 0, 1 (a) and 3 (c) went to the device; 4 (b) was
			// decoded on the host, into the shadow; 2 (s), static, went
			// from the memo to the slot, never through the shadow.
			for ch := range 5 {
				part := sh[ch*plane : (ch+1)*plane]
				if onHost := ch == 4; onHost != bytes.Equal(part, want[ch*plane:(ch+1)*plane]) ||
					!onHost && bytes.Count(part, []byte{0}) != plane {
					t.Fatalf("v/%s channel %d: the shadow holds the wrong bytes (host-decoded: %v; equal to the data %v, zeros %d)", n, ch, onHost, bytes.Equal(part, want[ch*plane:(ch+1)*plane]), bytes.Count(part, []byte{0}))
				}
			}
		}
	}
	if f := dev.foreign.Load(); f != 0 {
		t.Errorf("%d compressed chunks did not come from the ring's memory", f)
	}
	rings, tot := s.Stats()
	if tot.Uploaded != 12*plane || dev.copied.Load() != 6*plane || tot.DeviceSamples != 9 || dev.decoded.Load() != 18 || dev.refusals.Load() != 9 {
		t.Fatalf("uploaded %d bytes (want 9 channels of b and a static one a batch: %d), %d copied on the device (want 6 static channels), "+
			"%d device samples, %d chunks decoded on the device, %d refused",
			tot.Uploaded, 12*plane, dev.copied.Load(), tot.DeviceSamples, dev.decoded.Load(), dev.refusals.Load())
	}
	if st := rings[0].Stages; st["host_decode"] <= 0 || st["upload"] <= 0 || st["host_checks"] <= 0 || st["read"] <= 0 {
		t.Fatalf("stages %v", st)
	}
	if tot.HostShare != 0 {
		t.Fatalf("the host took %d bytes of chunks of small parts from the device", tot.HostShare)
	}
}

// What the host writes in a slot's shadow is counted in the mount's
// memory budget as long as its pages are in memory: the samples of an
// array's sample directory as those of a view; and it is all given back
// with the pages.
func TestGPUFillShadowCharged(t *testing.T) {
	for _, dir := range []string{"b", "v"} {
		t.Run(dir, func(t *testing.T) {
			// b is zstd without a checksum: the host decodes every chunk
			// of its samples, none going to the device.
			_, c, mem, filler, lay := gpuServer(t, devStore(t), "views:\n  - name: v\n    channels:\n      - var: b\n      - var: c\n")
			rep, dev := c.openDevice(t, mem, dir, 2, 3)
			budget := filler.MemoryBudget()
			for b, batch := range [][]string{{"0.npy", "1.npy", "2.npy"}, {"3.npy", "4.npy", "5.npy"}} {
				c.fillChecked(t, dev, rep, filler, lay, dir, b, batch)
				if res, used := dev.mustResident(t), budget.Used(); res != 0 || used != 0 {
					t.Fatalf("batch %d: the shadow holds %d bytes after the fill, the budget counts %d", b, res, used)
				}
			}
			const plane = 128 * 128 * 4 // b's part of a sample
			if u := dev.uncharged.Load(); u != 0 || dev.releasedMost.Load() < plane {
				t.Fatalf("%d bytes of the shadow in memory not counted in the budget (-1: not known), of %d at most (want b's %d at least)",
					u, dev.releasedMost.Load(), plane)
			}
		})
	}
}

// An array's samples go as a view's do: a chunk that lands whole in the
// sample, of a codec the device takes (c: zstd with a checksum), decodes
// on the device straight into the slot, never touching the shadow; one the
// device refuses (b: without one) is decoded by the host into the shadow,
// and copied into the slot from there, the batch's 3 samples read in one
// run, as a view's are. Every sample equals the file.
func TestGPUFillArraySamples(t *testing.T) {
	const plane = 128 * 128 * 4 // a sample
	for _, tc := range []struct {
		dir              string
		device, uploaded int64 // chunks decoded on the device, bytes uploaded, per batch
		shadow           int64 // the most bytes of the shadow in memory
	}{{"c", 3, 0, 0}, {"b", 0, 3 * plane, 3 * plane}} {
		t.Run(tc.dir, func(t *testing.T) {
			s, c, mem, filler, lay := gpuServer(t, devStore(t), "")
			rep, dev := c.openDevice(t, mem, tc.dir, 2, 3)
			fillSixSamples(t, c, dev, rep, filler, lay, tc.dir)
			_, tot := s.Stats()
			if dev.decoded.Load() != 2*tc.device || tot.Uploaded != 2*tc.uploaded || dev.releasedMost.Load() != tc.shadow {
				t.Fatalf("%d chunks decoded on the device (want %d), %d bytes uploaded (want %d), the shadow held %d bytes at most (want %d)",
					dev.decoded.Load(), 2*tc.device, tot.Uploaded, 2*tc.uploaded, dev.releasedMost.Load(), tc.shadow)
			}
		})
	}
}

// An array's sample larger than a fill's piece (l: 4 levels of 128x128, a
// chunk a level, zstd with a checksum; pieces of 2 levels) goes as one
// of a piece does: piece by piece straight into the shadow, so every
// chunk, landing whole there, decodes on the device straight into the
// slot, nothing is uploaded and the shadow holds nothing. Every sample
// equals the file.
func TestGPUFillArraySamplesInPieces(t *testing.T) {
	const plane = 128 * 128 * 4 // a level
	dir := t.TempDir()
	zs, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	writeFile(t, dir, "zarr.json", []byte(`{"zarr_format":3,"node_type":"group"}`))
	writeFile(t, dir, "l/zarr.json", arrayMeta([]int{6, 4, 128, 128}, []int{1, 1, 128, 128}, []string{"time", "level", "y", "x"}, "zstd"))
	for k := range 6 {
		for z := range 4 {
			b := make([]byte, plane)
			for i := range plane / 4 {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(1000*k+100*z)+float32(i%89)*0.5))
			}
			writeFile(t, dir, fmt.Sprintf("l/c/%d/%d/0/0", k, z), zs.EncodeAll(b, nil))
		}
	}
	s, c, mem, filler, lay := gpuServer(t, dir, "", func(o *fill.Options) { o.SlabBytes = 2 * plane })
	rep, dev := c.openDevice(t, mem, "l", 2, 3)
	fillSixSamples(t, c, dev, rep, filler, lay, "l")
	_, tot := s.Stats()
	if dev.decoded.Load() != 24 || tot.Uploaded != 0 || dev.releasedMost.Load() != 0 || filler.MemoryBudget().Used() != 0 {
		t.Fatalf("%d chunks decoded on the device (want 24), %d bytes uploaded (want 0), the shadow held %d bytes at most (want 0), the budget counts %d after",
			dev.decoded.Load(), tot.Uploaded, dev.releasedMost.Load(), filler.MemoryBudget().Used())
	}
}

// A chunk of several time steps (3 a chunk, zstd with a checksum) of which
// a fill takes some decodes on the device, its steps copied there into
// the samples that take them: nothing is decoded on the host or uploaded,
// and the shadow holds nothing, for an array's samples (a run of samples
// takes a chunk's steps, in order one run of the slot, out of order one a
// step) and a view's (the same, with the other channel's between them).
// Every sample equals the file.
func TestGPUFillStepChunks(t *testing.T) {
	const plane = 64 * 64 * 4 // a step
	dir := t.TempDir()
	zs, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	writeFile(t, dir, "zarr.json", []byte(`{"zarr_format":3,"node_type":"group"}`))
	for v, name := range []string{"p", "q"} {
		writeFile(t, dir, name+"/zarr.json", arrayMeta([]int{6, 64, 64}, []int{3, 64, 64}, []string{"time", "y", "x"}, "zstd"))
		for k := range 2 {
			b := make([]byte, 3*plane)
			for i := range 3 * plane / 4 {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(1000*(3*k+i/(plane/4))+10*v)+float32(i%97)*0.25))
			}
			writeFile(t, dir, fmt.Sprintf("%s/c/%d/0/0", name, k), zs.EncodeAll(b, nil))
		}
	}
	for _, tc := range []struct {
		dir           string
		decoded, runs int64 // chunks the device decodes for the six samples, runs it copies
	}{
		{"p", 2, 4},  // a chunk a batch: 0-2 land whole in order, 5-3 are 3 runs
		{"v", 4, 12}, // p and q of a chunk a batch (one run of samples), 3 steps each
	} {
		t.Run(tc.dir, func(t *testing.T) {
			s, c, mem, filler, lay := gpuServer(t, dir, "views:\n  - name: v\n    channels:\n      - var: p\n      - var: q\n")
			rep, dev := c.openDevice(t, mem, tc.dir, 2, 3)
			fillSixSamples(t, c, dev, rep, filler, lay, tc.dir)
			_, tot := s.Stats()
			fb := s.Device.(GPUFill).Fallback.(*countingCPU).jobs.Load()
			if dev.decoded.Load() != tc.decoded || dev.runs.Load() != tc.runs || fb != 0 || tot.Uploaded != 0 || dev.releasedMost.Load() != 0 {
				t.Fatalf("%d chunks decoded on the device (want %d), %d runs copied (want %d), %d on the host, %d bytes uploaded, the shadow held %d bytes at most (want 0 of each)",
					dev.decoded.Load(), tc.decoded, dev.runs.Load(), tc.runs, fb, tot.Uploaded, dev.releasedMost.Load())
			}
		})
	}
}

// openDevice opens a ring of slots batches of batch samples of directory
// dir in the test device's memory (mem), and returns the reply and the
// device.
func (c *client) openDevice(tb testing.TB, mem testDeviceMemory, dir string, slots, batch int) (openReply, *testDevice) {
	tb.Helper()
	rep := c.open(tb, OpenRequest{Dir: dir, Memory: MemoryCUDA, PCIBusID: "0000:3b:00.0", Slots: slots, Batch: batch})
	if !rep.OK {
		tb.Fatalf("open: %+v", rep)
	}
	return rep, <-mem.dev
}

// fillSixSamples fills samples 0-2 of array dir into slot 0 and 5-3 into
// slot 1 of the ring c opened (3 samples a batch), each batch on the
// device path, and checks every sample against the file.
func fillSixSamples(t *testing.T, c *client, dev *testDevice, rep openReply, filler *fill.Filler, lay *layout.Layout, dir string) {
	t.Helper()
	for b, batch := range [][]string{{"0.npy", "1.npy", "2.npy"}, {"5.npy", "4.npy", "3.npy"}} {
		c.fillChecked(t, dev, rep, filler, lay, dir, b, batch)
	}
}

// fillChecked fills batch (sample files of directory dir) into slot k of
// the ring c opened on the test device, every sample on the device path,
// and checks each against its file.
func (c *client) fillChecked(t *testing.T, dev *testDevice, rep openReply, filler *fill.Filler, lay *layout.Layout, dir string, k int, batch []string) {
	t.Helper()
	if r := c.fill(t, k, batch...); r.Op != "ready" || r.Device != len(batch) {
		t.Fatalf("slot %d, %v: %+v", k, batch, r)
	}
	for j, n := range batch {
		if got := dev.Host(k)[int64(j)*rep.SampleBytes : int64(j+1)*rep.SampleBytes]; !bytes.Equal(got, sampleBytes(t, filler, lay, dir+"/"+n)) {
			t.Fatalf("%s/%s in slot %d differs from the file", dir, n, k)
		}
	}
}

// gpuServer serves the store in dir with views (YAML, "" for none) on a
// socket, the device path on a testDevice, and returns a client. opts
// change the Filler's options after gpuServer's (a smaller SlabBytes).
func gpuServer(t testing.TB, dir, viewsYAML string, opts ...func(*fill.Options)) (*Server, *client, testDeviceMemory, *fill.Filler, *layout.Layout) {
	t.Helper()
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	var views []*layout.View
	if viewsYAML != "" {
		specs, err := layout.ParseViews("v.yaml", []byte(viewsYAML))
		if err != nil {
			t.Fatal(err)
		}
		if views, err = layout.BindViews(context.Background(), h, specs, layout.BindOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lay, err := layout.Build(h, layout.Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	// A budget that bounds nothing here, but counts what the fills hold.
	budget := memory.New(1 << 40)
	fo := fill.Options{Reader: h, MemoryBudget: budget}
	for _, o := range opts {
		o(&fo)
	}
	filler, err := fill.New(fo)
	if err != nil {
		t.Fatal(err)
	}
	mem := testDeviceMemory{dev: make(chan *testDevice, 1), budget: budget}
	cpu := must(codec.NewCPU(codec.Options{Workers: 2}))
	t.Cleanup(func() { cpu.Close() })
	s := &Server{Layout: func() *layout.Layout { return lay }, Blobs: &fileBlobs{fill: filler, dir: t.TempDir(), opens: map[string]int{}},
		Memory: mem, Device: GPUFill{Filler: filler, Fallback: &countingCPU{inner: cpu}, CPU: &countingCPU{inner: cpu}}}
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Serve(ctx, ln)
	return s, dial(t, sock), mem, filler, lay
}

// countingCPU is the mount's CPU decoder as GPUFill.CPU, counting the
// jobs and decoded bytes it was given. workers, when set, is what it says
// its workers are (0: it does not say).
type countingCPU struct {
	inner       codec.BatchDecoder
	jobs, bytes atomic.Int64
	workers     atomic.Int64
}

func (c *countingCPU) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	c.jobs.Add(int64(len(jobs)))
	for _, j := range jobs {
		c.bytes.Add(int64(len(j.Dst)))
	}
	return c.inner.DecodeBatch(ctx, jobs)
}

func (c *countingCPU) Workers() int { return int(c.workers.Load()) }

// sampleBytes is sample p's data as the mount's file holds it.
func sampleBytes(t *testing.T, f *fill.Filler, lay *layout.Layout, p string) []byte {
	t.Helper()
	e, ok := lay.Lookup(p)
	if !ok {
		t.Fatalf("%s: not in the layout", p)
	}
	var buf bytes.Buffer
	if err := f.Fill(context.Background(), lay, e.Blob, nil, &bufWriter{b: &buf}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()[len(e.Blob.Header()):]
}

// beStores writes two stores of one big-endian array x of 4 time steps of
// 64x64, zstd with a content checksum (a codec the device takes): a Zarr
// v3 one, float32 whose byte order only the bytes codec gives, and a v2
// one of ">f8".
func beStores(t *testing.T) (v3, v2 string) {
	t.Helper()
	zs, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	put := func(dir, p string, b []byte) {
		p = filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const n = 64 * 64
	v3, v2 = t.TempDir(), t.TempDir()
	put(v3, "zarr.json", []byte(`{"zarr_format":3,"node_type":"group"}`))
	meta, _ := json.Marshal(map[string]any{"zarr_format": 3, "node_type": "array", "shape": []int{4, 64, 64}, "data_type": "float32",
		"chunk_grid":         map[string]any{"name": "regular", "configuration": map[string]any{"chunk_shape": []int{1, 64, 64}}},
		"chunk_key_encoding": map[string]any{"name": "default"}, "fill_value": 0, "dimension_names": []string{"time", "y", "x"},
		"codecs": []any{map[string]any{"name": "bytes", "configuration": map[string]any{"endian": "big"}},
			map[string]any{"name": "zstd", "configuration": map[string]any{"level": 3}}}})
	put(v3, "x/zarr.json", meta)
	put(v2, ".zgroup", []byte(`{"zarr_format":2}`))
	put(v2, "x/.zarray", []byte(`{"zarr_format":2,"shape":[4,64,64],"chunks":[1,64,64],"dtype":">f8","compressor":{"id":"zstd","level":3},"fill_value":0,"order":"C","filters":null}`))
	put(v2, "x/.zattrs", []byte(`{"_ARRAY_DIMENSIONS":["time","y","x"]}`))
	for k := range 4 {
		b4, b8 := make([]byte, 4*n), make([]byte, 8*n)
		for i := range n {
			v := float64(1000*k) + float64(i)*0.25
			binary.BigEndian.PutUint32(b4[4*i:], math.Float32bits(float32(v)))
			binary.BigEndian.PutUint64(b8[8*i:], math.Float64bits(v))
		}
		put(v3, fmt.Sprintf("x/c/%d/0/0", k), zs.EncodeAll(b4, nil))
		put(v2, fmt.Sprintf("x/%d.0.0", k), zs.EncodeAll(b8, nil))
	}
	return v3, v2
}

// A big-endian source, of Zarr v3 (byte order from the bytes codec) or v2
// (">f8"), comes out of the device path as the mount's file holds it,
// through a view or the array's own sample directory: the host swaps such
// chunks after decoding them, so none may decode on the device straight
// into the slot.
func TestGPUFillBigEndian(t *testing.T) {
	v3, v2 := beStores(t)
	for _, tc := range []struct {
		name, dir, samples string
		size               int
	}{{"v3 big-endian float32", v3, "v", 4}, {"v2 >f8", v2, "v", 8}, {"v3 array", v3, "x", 4}, {"v2 array", v2, "x", 8}} {
		t.Run(tc.name, func(t *testing.T) {
			_, c, mem, filler, lay := gpuServer(t, tc.dir, "views:\n  - name: v\n    channels:\n      - var: x\n")
			rep, dev := c.openDevice(t, mem, tc.samples, 1, 4)
			batch := []string{"0.npy", "1.npy", "2.npy", "3.npy"}
			if r := c.fill(t, 0, batch...); r.Op != "ready" || r.Device != 4 {
				t.Fatalf("fill: %+v", r)
			}
			for j, n := range batch {
				p := tc.samples + "/" + n
				want := sampleBytes(t, filler, lay, p)
				if got := dev.Host(0)[int64(j)*rep.SampleBytes : int64(j+1)*rep.SampleBytes]; !bytes.Equal(got, want) {
					t.Fatalf("%s in the slot differs from the file (first bytes % x, want % x)", p, got[:8], want[:8])
				}
				if v := math.Float64frombits(binary.LittleEndian.Uint64(want[8:])); tc.size == 8 && v != float64(1000*j)+0.25 {
					t.Fatalf("%s: element 1 is %v in the file", p, v)
				}
			}
			if d := dev.decoded.Load(); d != 0 {
				t.Fatalf("%d big-endian chunks decoded on the device into the slot", d)
			}
		})
	}
}

// writeFile writes data at the slash path p below dir, making its
// directories.
func writeFile(tb testing.TB, dir, p string, data []byte) {
	tb.Helper()
	p = filepath.Join(dir, filepath.FromSlash(p))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		tb.Fatal(err)
	}
}

// arrayMeta is the zarr.json of a float32 Zarr v3 array of shape, chunked
// by chunks, compressed by codec at level 3.
func arrayMeta(shape, chunks []int, dims []string, codec string) []byte {
	js, _ := json.Marshal(map[string]any{"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "float32",
		"chunk_grid":         map[string]any{"name": "regular", "configuration": map[string]any{"chunk_shape": chunks}},
		"chunk_key_encoding": map[string]any{"name": "default"}, "fill_value": 0, "dimension_names": dims,
		"codecs": []any{map[string]any{"name": "bytes", "configuration": map[string]any{"endian": "little"}},
			map[string]any{"name": codec, "configuration": map[string]any{"level": 3}}}})
	return js
}
