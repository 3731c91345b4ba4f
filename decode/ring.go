package decode

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/zarrfs/zarrfs/gpu"
)

// ErrNoDeviceRing is wrapped when the pipeline cannot give a reader's GPU
// to delivery: it decodes on the CPU, or on other GPUs, or none started.
var ErrNoDeviceRing = errors.New("no GPU of this mount for a ring")

// busNamed is what delivery needs of a GPU decoder: *gpu.Decoder.
type busNamed interface {
	PCIBusID() (string, error)
}

// GPUFor returns the pipeline's decoder of the GPU with PCI bus id busID
// (delivery's rings live in its memory), starting the GPUs if they have
// not started or went to sleep, and keeps them awake until release is
// called: a ring in a GPU's memory must outlive no context.
func (p *Pipeline) GPUFor(ctx context.Context, busID string) (g *gpu.Decoder, release func(), err error) {
	if p.opts.Mode == CPU {
		return nil, nil, fmt.Errorf("%w: it decodes on the CPU (--decode cpu)", ErrNoDeviceRing)
	}
	if _, err := p.Ready(ctx); err != nil {
		return nil, nil, err
	}
	p.rings.Add(1) // from here the GPUs do not go to sleep
	defer func() {
		if err != nil {
			p.rings.Add(-1)
		}
	}()
	if p.asleep.Load() {
		p.wakeNow()
	}
	p.mu.Lock()
	gpus, devices := p.gpus, p.devices
	p.mu.Unlock()
	if len(gpus) == 0 {
		return nil, nil, fmt.Errorf("%w: it decodes on no GPU here (%s)", ErrNoDeviceRing, p.Placement())
	}
	want := strings.ToLower(strings.TrimSpace(busID))
	var have []string
	for i, dg := range gpus {
		bn, ok := dg.(busNamed)
		if !ok {
			continue
		}
		id, err := bn.PCIBusID()
		if err != nil {
			return nil, nil, fmt.Errorf("GPU %d: %w", devices[i], err)
		}
		have = append(have, id)
		if id == want {
			if d, ok := dg.(*gpu.Decoder); ok {
				return d, func() { p.rings.Add(-1) }, nil
			}
		}
	}
	return nil, nil, fmt.Errorf("%w: the reader's GPU %s is not one this mount decodes on (%s; --gpus)", ErrNoDeviceRing, want, strings.Join(have, ", "))
}

// wakeNow starts sleeping GPUs again and waits for them.
func (p *Pipeline) wakeNow() {
	p.wakeMu.Lock()
	defer p.wakeMu.Unlock()
	if !p.asleep.Load() {
		return
	}
	if err := p.openGPUs(); err != nil {
		p.log.Warn("GPUs did not start again for a ring", "err", err)
		return
	}
	p.asleep.Store(false)
}
