package gpu

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file is the memory of the rounds: device and staging buffers grown
// within Options.DeviceBytes and StagingBytes, and given back when idle.

// growth rounds allocations up so a slowly growing batch size does not
// reallocate every time.
func growth(need int64) int64 { return alignUp(need+need/4, 1<<20) }

// ErrBudget is wrapped when a round would take more device or staging
// memory than Options allow (its jobs decode on the CPU), and when the
// memory given for GPU decoding is too small for any round (package
// decode refuses its options).
var ErrBudget = errors.New("gpu: over the memory budget")

// budgeted returns the size to allocate for need bytes, given used bytes
// already held (less the buffer being replaced) and the budget: the growth
// slack where it fits, need itself where only that fits.
func budgeted(need, used, budget int64) (int64, error) {
	size := growth(need)
	if used+size > budget {
		size = need
	}
	if used+size > budget {
		return 0, fmt.Errorf("%w: %d bytes more with %d held, budget %d", ErrBudget, size, used, budget)
	}
	return size, nil
}

func (d *Decoder) growDev(b *devBuf, need int64) error {
	if b.size >= need {
		return nil
	}
	size, err := budgeted(need, d.devHeld.Load()-b.size, d.opts.DeviceBytes)
	if err != nil {
		return fmt.Errorf("device memory: %w", err)
	}
	d.freeDev(b)
	var p uintptr
	if err := d.cu.check("cuMemAlloc", d.cu.cuMemAlloc(&p, uint64(size))); err != nil {
		return err
	}
	*b = devBuf{ptr: p, size: size}
	d.devHeld.Add(size)
	return nil
}

func (d *Decoder) freeDev(b *devBuf) {
	if b.ptr != 0 {
		d.cu.cuMemFree(b.ptr)
		d.devHeld.Add(-b.size)
	}
	*b = devBuf{}
}

func (d *Decoder) growHost(b *hostBuf, need int64) error {
	if b.size >= need {
		return nil
	}
	size, err := budgeted(need, d.stagingHeld.Load()-b.size, d.opts.StagingBytes)
	if err != nil {
		return fmt.Errorf("staging memory: %w", err)
	}
	d.freeHost(b)
	if size >= mappedStagingMin {
		if m := d.mapStaging(size); m != nil {
			*b = hostBuf{p: unsafe.Pointer(&m[0]), size: size, mapped: true}
			d.stagingHeld.Add(size)
			return nil
		}
	}
	var p unsafe.Pointer
	if err := d.cu.check("cuMemAllocHost", d.cu.cuMemAllocHost(&p, uint64(size))); err != nil {
		return err
	}
	*b = hostBuf{p: p, size: size}
	d.stagingHeld.Add(size)
	return nil
}

// mappedStagingMin is the least staging buffer mapped and registered
// (mapStaging) rather than allocated by the driver.
const mappedStagingMin = 16 << 20

// mapStaging returns n bytes of anonymous memory on huge pages, faulted in
// from several goroutines and registered with the current context, or nil
// where that fails. cuMemAllocHost zeroes and pins a buffer on one thread
// in 4 KiB pages, which for a large round took longer than the GPU takes
// to decode it (BENCHMARKS.md), and every larger round after it paid that
// again. The caller holds the OS thread with the Decoder's context
// current.
func (d *Decoder) mapStaging(n int64) []byte {
	m, err := mapFaulted(int(n))
	if err != nil {
		return nil
	}
	if !d.pin(m) {
		unix.Munmap(m)
		return nil
	}
	return m
}

func (d *Decoder) freeHost(b *hostBuf) {
	switch {
	case b.p != nil && b.mapped:
		d.cu.cuMemHostUnregister(b.p)
		unix.Munmap(b.bytes())
		d.stagingHeld.Add(-b.size)
	case b.p != nil:
		d.cu.cuMemFreeHost(b.p)
		d.stagingHeld.Add(-b.size)
	}
	*b = hostBuf{}
}

// MemoryHeld reports the memory the Decoder holds now: device buffers,
// pinned staging, and lent pinned memory (mapped arenas), in bytes,
// besides the CUDA context.
func (d *Decoder) MemoryHeld() (device, staging, lent int64) {
	return d.devHeld.Load(), d.stagingHeld.Load(), d.host.stats().Mapped
}

// Pinned is the pinned host memory a Decoder holds, by use, in bytes.
type Pinned struct {
	// Staging is the rounds' own; Pool the arenas HostAlloc lends from
	// (mapped and registered), of which Lent is lent now and LentPeak the
	// most lent at once since the Decoder started: a pool far larger than
	// its peak grew for want of a span, not of memory. Missed is the bytes
	// HostAlloc lent from ordinary memory since the Decoder started, for
	// want of room in the pool (then the reads and decodes into them cost
	// the host a copy on the way to the device, and the Go heap their
	// pages).
	Staging, Pool, Lent, LentPeak, Missed int64
}

// Pinned reports the pinned host memory the Decoder holds now.
func (d *Decoder) Pinned() Pinned {
	st := d.host.stats()
	return Pinned{Staging: d.stagingHeld.Load(), Pool: st.Mapped, Lent: st.Lent, LentPeak: st.Peak, Missed: st.Missed}
}

// trimWhenIdle frees the rounds' device and staging buffers after
// Options.HostIdle without a round, so that an idle mount gives the GPU's
// memory back to training. It takes every buffer set (waiting for none:
// a set in use means the Decoder is not idle).
func (d *Decoder) trimWhenIdle(stop <-chan struct{}) {
	idle := d.opts.HostIdle
	if idle <= 0 {
		idle = defaultHostIdle
	}
	t := time.NewTicker(max(idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if d.hung.Load() {
			return // what the buffers hold may still be in use: never freed
		}
		if time.Since(time.Unix(0, d.lastRound.Load())) < idle || (d.devHeld.Load() == 0 && d.stagingHeld.Load() <= d.stagingBase) {
			continue
		}
		var held []int
	take:
		for range d.sets {
			select {
			case s := <-d.free:
				held = append(held, s)
			default:
				break take
			}
		}
		if len(held) == len(d.sets) {
			d.trim()
			// The buffers a cut made room beside are gone: rounds start
			// again at their share.
			d.roundCap.Store(0)
		}
		for _, s := range held {
			d.free <- s
		}
	}
}

// trim frees every set's round buffers (not their argument blocks). The
// caller holds every set.
func (d *Decoder) trim() {
	d.inContext(func() {
		for i := range d.sets {
			st := &d.sets[i]
			d.freeDev(&st.dIn)
			d.freeDev(&st.dOut)
			d.freeDev(&st.dTemp)
			d.freeHost(&st.hIn)
			d.freeHost(&st.hOut)
		}
	})
	d.log.Debug("idle: GPU buffers given back", "device", d.opts.Device)
}
