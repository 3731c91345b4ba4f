package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/deliver"
	"github.com/zarrfs/zarrfs/fill"
	zfs "github.com/zarrfs/zarrfs/fs"
	"github.com/zarrfs/zarrfs/internal/memory"
)

// A running mount delivers samples into its readers' memory on a second
// Unix socket beside its status socket (package deliver): the record's
// name with ".ring.sock", owner-only. zarrfs.torch.Loader finds it there.

// Delivery modes (--delivery, hidden).
const (
	// deliveryAuto: rings in device memory where the mount decodes on
	// the reader's GPU; elsewhere the socket answers why it cannot.
	deliveryAuto = "auto"
	// deliveryHost rings in host shared memory, the CPU decoding into
	// them: the test mode of machines without a GPU.
	deliveryHost = "host"
	deliveryOff  = "off"
)

// registerDeliveryFlag adds --delivery to mount, hidden: its one value
// besides the default is the test mode.
func registerDeliveryFlag(cmd *cobra.Command, v *string) {
	cmd.Flags().StringVar(v, "delivery", deliveryAuto, "where zarrfs.torch.Loader's rings live: auto (device memory where the mount decodes on a GPU), host (host shared memory, decoded on the CPU: a test mode) or off")
	_ = cmd.Flags().MarkHidden("delivery")
}

func checkDelivery(v string) error {
	switch v {
	case deliveryAuto, deliveryHost, deliveryOff:
		return nil
	}
	return usagef("--delivery %q: want auto, host or off", v)
}

// deliverySocket is where the mount at mountpoint (absolute, resolved)
// answers delivery requests.
func deliverySocket(mountpoint string) string {
	return strings.TrimSuffix(recordFile(mountpoint), ".json") + ".ring.sock"
}

// serveDelivery starts the delivery server of a mount on sock until ctx
// ends; nil when --delivery is off or no memory is there to deliver into.
// wait returns once the server stopped after ctx ended: every fill
// returned and every ring freed, so that the decoders and the cache they
// use may close.
func serveDelivery(ctx context.Context, mode, sock string, o *opened, m *zfs.Mounted, blobs fill.Blobs, log *slog.Logger) (s *deliver.Server, wait func(), err error) {
	wait = func() {}
	if mode == deliveryOff {
		return nil, wait, nil
	}
	s = &deliver.Server{Layout: m.Layout, Blobs: blobs, Logger: log}
	switch mode {
	case deliveryHost:
		// What all fills hold is bounded by --memory; the rings, which
		// live as long as their readers, together by a quarter of it.
		s.Memory = deliver.HostMemory{}
		s.MaxHeldBytes = o.fill.MemoryBudget().Total() / 4
		s.Device = deliver.HostFill{Filler: o.fill, Decoder: o.dec}
	default:
		// Rings in the memory of the GPU a reader names, where the
		// pipeline decodes on it (decode.Pipeline.GPUFor says why not).
		s.Memory = deliver.CUDAMemory{GPUs: o.dec}
		s.Device = deliver.GPUFill{Filler: o.fill, Fallback: o.dec, CPU: o.dec.CPU()}
	}
	ln, err := listenPrivate(sock)
	if err != nil {
		return nil, wait, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer os.Remove(sock)
		if err := s.Serve(ctx, ln); err != nil {
			log.Warn("delivery socket stopped", "socket", sock, "err", err)
		}
	}()
	return s, func() { <-done }, nil
}

// statusDelivery is the delivery part of the status document.
type statusDelivery struct {
	Socket string `json:"socket"`
	deliver.Totals
	Rings []deliver.RingInfo `json:"rings"`
}

func deliveryDoc(s *deliver.Server, sock string) *statusDelivery {
	if s == nil {
		return nil
	}
	rings, tot := s.Stats()
	if rings == nil {
		rings = []deliver.RingInfo{}
	}
	return &statusDelivery{Socket: sock, Totals: tot, Rings: rings}
}

// printDelivery adds the delivery lines to `zarrfs status`.
func printDelivery(w io.Writer, d *statusDelivery) {
	if d == nil {
		return
	}
	samples := d.DeviceSamples + d.HostSamples
	perSample := "-"
	if samples > 0 {
		perSample = memory.Human((d.Compressed+d.Uploaded)/samples) + " a sample"
	}
	fmt.Fprintf(w, "delivery\t%d rings open (%s), %d opened; %d samples (%d device path, %d host path, %d of them from the cache), %s to the ring: %s compressed, %s decoded by the host path\n",
		d.Open, memory.Human(d.HeldBytes), d.Opened, samples, d.DeviceSamples, d.HostSamples, d.CachedSamples, perSample,
		memory.Human(d.Compressed), memory.Human(d.Uploaded))
	if samples > 0 {
		var parts []string
		for _, name := range deliver.StageNames() {
			parts = append(parts, fmt.Sprintf("%s %.1f", name, 1e3*d.Stages[name]/float64(samples)))
		}
		fmt.Fprintf(w, "\tms a sample by stage (summed over fills): %s\n", strings.Join(parts, ", "))
	}
	for _, r := range d.Rings {
		fmt.Fprintf(w, "\tring %d: %s, %s memory (device %d), %d slots, %s; %d fills, %d errors; %d device path, %d host path samples (%d from the cache)\n",
			r.ID, r.Dir, r.Memory, r.Device, r.Slots, memory.Human(r.Bytes), r.Fills, r.Errors, r.DeviceSamples, r.HostSamples, r.CachedSamples)
		if rt := r.Route; rt != nil {
			wait, rate := "not measured", "not measured"
			if rt.DeviceWait > 0 {
				wait = fmt.Sprintf("%.0f ms", 1e3*rt.DeviceWait)
			}
			if rt.HostRate > 0 {
				rate = memory.Human(int64(rt.HostRate)) + "/s"
			}
			fmt.Fprintf(w, "\t  chunks of large parts (zstd frames of 1 MiB or more): %d on the host, %d on the GPU, in %d fills (%d all on the host); the GPU's wait %s, the host's rate %s\n",
				rt.OnHost, rt.OnDevice, rt.Fills, rt.AllOnHost, wait, rate)
		}
	}
}

// registerDeliveryMetrics adds the delivery counters to reg, read from the
// server when scraped; nothing when the mount delivers none.
func registerDeliveryMetrics(reg *prometheus.Registry, s *deliver.Server) {
	if s == nil {
		return
	}
	tot := func(f func(deliver.Totals) int64) func() float64 {
		return func() float64 { _, t := s.Stats(); return float64(f(t)) }
	}
	for _, m := range []struct {
		name, help string
		gauge      bool
		f          func(deliver.Totals) int64
	}{
		{"delivery_rings", "Rings of zarrfs.torch.Loader readers open now.", true, func(t deliver.Totals) int64 { return int64(t.Open) }},
		{"delivery_ring_bytes", "Memory the open rings hold.", true, func(t deliver.Totals) int64 { return t.HeldBytes }},
		{"delivery_device_samples_total", "Samples decoded straight into a ring slot (the device path).", false, func(t deliver.Totals) int64 { return t.DeviceSamples }},
		{"delivery_host_samples_total", "Samples read from the cache into a ring slot (the host path).", false, func(t deliver.Totals) int64 { return t.HostSamples }},
		{"delivery_cached_samples_total", "Samples of the host path whose file the cache held already (not decoded again).", false, func(t deliver.Totals) int64 { return t.CachedSamples }},
		{"delivery_compressed_bytes_total", "Compressed bytes the device path read.", false, func(t deliver.Totals) int64 { return t.Compressed }},
		{"delivery_host_path_bytes_total", "Decoded bytes the host path copied into ring slots.", false, func(t deliver.Totals) int64 { return t.Uploaded }},
		{"delivery_fill_errors_total", "Fill requests that failed (a sample could not be filled).", false, func(t deliver.Totals) int64 { return t.Errors }},
	} {
		if m.gauge {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "zarrfs", Name: m.name, Help: m.help}, tot(m.f)))
		} else {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "zarrfs", Name: m.name, Help: m.help}, tot(m.f)))
		}
	}
}
