package deliver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
)

// GPUs gives delivery the decoder of the GPU a reader names, awake until
// release: decode.Pipeline.
type GPUs interface {
	GPUFor(ctx context.Context, busID string) (g *gpu.Decoder, release func(), err error)
}

// CUDAMemory is Memory in the mount's GPUs: a ring is device memory of the
// reader's GPU (named by PCI bus id), counted in that GPU's --gpu-memory,
// shared through CUDA IPC.
type CUDAMemory struct {
	GPUs GPUs
	// StartTimeout bounds the wait for the GPUs to start. Zero means 2
	// minutes.
	StartTimeout time.Duration
}

func (CUDAMemory) Kind() string { return MemoryCUDA }

func (m CUDAMemory) NewRing(ctx context.Context, req *OpenRequest, slots int, slotBytes int64) (Ring, error) {
	if req.Memory != MemoryCUDA {
		return nil, fmt.Errorf("%w: this mount delivers into GPU memory, not %s", ErrUnavailable, req.Memory)
	}
	if req.PCIBusID == "" {
		return nil, fmt.Errorf("%w: the reader named no GPU (pci_bus_id)", ErrUnavailable)
	}
	if req.ConsumerEvent != "" && len(req.ConsumerEvents) == 0 {
		return nil, fmt.Errorf("%w: the reader sent one consumer event for the ring; this mount waits for one per slot (consumer_events): use the zarrfs Python package of the daemon's version", ErrUnavailable)
	}
	wait := m.StartTimeout
	if wait == 0 {
		wait = 2 * time.Minute
	}
	// The connection's context: a mount that closes stops the wait for
	// the GPUs to start.
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	d, release, err := m.GPUs.GPUFor(ctx, req.PCIBusID)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	// The shadow: address space for the slots, of which only what the
	// host writes is ever faulted in, until it is copied into the slot
	// (GPUFill).
	shadow, err := unix.Mmap(-1, 0, int(int64(slots)*slotBytes), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		release()
		return nil, fmt.Errorf("map a shadow of %d slots of %d bytes: %w", slots, slotBytes, err)
	}
	r, err := d.NewRing(slots, slotBytes, req.ConsumerEvents)
	if err != nil {
		unix.Munmap(shadow)
		release()
		if errors.Is(err, gpu.ErrBudget) {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, err
	}
	// Pinned memory for the compressed chunks of the fills in flight,
	// registered before the first: a pipeline that registers it on demand
	// would read the first batches into memory the device cannot copy from
	// directly. As much as the slots: a fill reads each chunk into room
	// for its decoded size before it gives back the rest, and a pool
	// short of that registers more during the epoch, pinning on the cores
	// the fills need (half the slots: 97-100 samples/s in a first epoch
	// on 4 cores, against 111-115; BENCHMARKS.md).
	d.HostReserve(int64(slots)*slotBytes, reserveWait)
	return &cudaRing{d: d, r: r, release: release, shadow: shadow, slotBytes: slotBytes}, nil
}

// reserveWait bounds what opening a ring waits for pinned memory.
const reserveWait = 5 * time.Second

// cudaRing is a gpu.Ring as delivery's Ring: the host path stages in the
// Decoder's pinned memory. shadow is host address space as large as the
// ring, a slot's shadow at the slot's offset: the device path fills a
// batch into it, the device decoding straight into the slot what lands
// there whole, so only the pages the host writes are ever touched, and
// those only until they are copied into the slot (releaseShadow): a ring
// holds no host memory between its fills.
type cudaRing struct {
	d         *gpu.Decoder
	r         *gpu.Ring
	release   func()
	shadow    []byte
	slotBytes int64
	rt        router
}

var _ deviceRing = (*cudaRing)(nil)

func (c *cudaRing) route() *router { return &c.rt }

// shadowOf is slot k's shadow.
func (c *cudaRing) shadowOf(k int) []byte {
	return c.shadow[int64(k)*c.slotBytes : int64(k+1)*c.slotBytes]
}

func (c *cudaRing) decode(ctx context.Context, k int, jobs []codec.Job, runs [][]gpu.Run, t *gpu.RingTimes) error {
	return c.r.DecodeRuns(ctx, k, jobs, runs, t)
}

func (c *cudaRing) memory() codec.HostMemory { return c.d }

func (c *cudaRing) releaseShadow(k int, off, n int64) { dropPages(c.shadowOf(k), off, n) }

func (c *cudaRing) copyInSlot(ctx context.Context, k int, dst, src, n int64) error {
	return c.r.Copy(ctx, k, dst, c.r.Addr(k, src), n)
}

func (c *cudaRing) Bytes() int64 { return c.r.Bytes() }
func (c *cudaRing) Device() int  { return c.r.Device() }

func (c *cudaRing) Describe(o *openReply) []*os.File {
	o.Handle, o.Events = c.r.Handle(), c.r.EventHandles()
	return nil
}

func (c *cudaRing) Begin(k int) error  { return c.r.Begin(k) }
func (c *cudaRing) Host(int) []byte    { return nil }
func (c *cudaRing) Stage(n int) []byte { return c.d.HostAlloc(n) }
func (c *cudaRing) Unstage(b []byte)   { c.d.HostFree(b) }
func (c *cudaRing) Done(k int) error   { return c.r.Done(k) }

func (c *cudaRing) Write(ctx context.Context, k int, off int64, b []byte) error {
	return c.r.Write(ctx, k, off, b)
}

func (c *cudaRing) Close() error {
	err := c.r.Close()
	c.release()
	if c.shadow != nil {
		unix.Munmap(c.shadow)
		c.shadow = nil
	}
	return err
}
