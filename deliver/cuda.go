package deliver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

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

func (m CUDAMemory) NewRing(req *OpenRequest, slots int, slotBytes int64) (Ring, error) {
	if req.Memory != MemoryCUDA {
		return nil, fmt.Errorf("%w: this mount delivers into GPU memory, not %s", ErrUnavailable, req.Memory)
	}
	if req.PCIBusID == "" {
		return nil, fmt.Errorf("%w: the reader named no GPU (pci_bus_id)", ErrUnavailable)
	}
	wait := m.StartTimeout
	if wait == 0 {
		wait = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	d, release, err := m.GPUs.GPUFor(ctx, req.PCIBusID)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	r, err := d.NewRing(slots, slotBytes, req.ConsumerEvent)
	if err != nil {
		release()
		if errors.Is(err, gpu.ErrBudget) {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, err
	}
	return &cudaRing{d: d, r: r, release: release}, nil
}

// cudaRing is a gpu.Ring as delivery's Ring: the host path stages in the
// Decoder's pinned memory.
type cudaRing struct {
	d       *gpu.Decoder
	r       *gpu.Ring
	release func()
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

func (c *cudaRing) Write(k int, off int64, b []byte) error { return c.r.Write(k, off, b) }

func (c *cudaRing) Close() error {
	err := c.r.Close()
	c.release()
	return err
}
