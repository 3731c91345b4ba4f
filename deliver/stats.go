package deliver

import (
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/layout"
)

// RingStats counts what one ring was filled with.
type RingStats struct {
	ID          int
	Dir         string
	Memory      string
	Device      int
	Slots       int
	SlotBytes   int64
	SampleBytes int64
	Opened      time.Time

	Fills, Errors atomic.Int64
	// DeviceSamples and HostSamples count the samples by path.
	DeviceSamples, HostSamples atomic.Int64
	// Compressed is the compressed bytes the device path read, Uploaded
	// the decoded bytes the host path copied into slots.
	Compressed, Uploaded atomic.Int64
}

func (r *RingStats) count(dev, host int, compressed, uploaded int64, err error) {
	r.Fills.Add(1)
	if err != nil {
		r.Errors.Add(1)
	}
	r.DeviceSamples.Add(int64(dev))
	r.HostSamples.Add(int64(host))
	r.Compressed.Add(compressed)
	r.Uploaded.Add(uploaded)
}

// RingInfo is a ring as status reports it.
type RingInfo struct {
	ID            int       `json:"id"`
	Dir           string    `json:"dir"`
	Memory        string    `json:"memory"`
	Device        int       `json:"device"`
	Slots         int       `json:"slots"`
	Bytes         int64     `json:"bytes"`
	SampleBytes   int64     `json:"sample_bytes"`
	Opened        time.Time `json:"opened"`
	Fills         int64     `json:"fills"`
	Errors        int64     `json:"errors"`
	DeviceSamples int64     `json:"device_samples"`
	HostSamples   int64     `json:"host_samples"`
	Compressed    int64     `json:"compressed_bytes"`
	Uploaded      int64     `json:"host_path_bytes"`
}

// Totals are the counts of all rings since the server started.
type Totals struct {
	Opened        int64 `json:"rings_opened"`
	Open          int   `json:"rings_open"`
	HeldBytes     int64 `json:"ring_bytes"`
	Fills         int64 `json:"fills"`
	Errors        int64 `json:"errors"`
	DeviceSamples int64 `json:"device_samples"`
	HostSamples   int64 `json:"host_samples"`
	// Compressed is what the device path read of compressed chunks;
	// Uploaded the decoded bytes the host path copied into slots. On a
	// GPU, together they are the bytes that crossed to the device.
	Compressed int64 `json:"compressed_bytes"`
	Uploaded   int64 `json:"host_path_bytes"`
}

// Stats returns the open rings, by ID, and the totals.
func (s *Server) Stats() ([]RingInfo, Totals) {
	s.mu.Lock()
	var out []RingInfo
	for _, r := range s.rings {
		out = append(out, RingInfo{ID: r.ID, Dir: r.Dir, Memory: r.Memory, Device: r.Device, Slots: r.Slots,
			Bytes: int64(r.Slots) * r.SlotBytes, SampleBytes: r.SampleBytes, Opened: r.Opened,
			Fills: r.Fills.Load(), Errors: r.Errors.Load(), DeviceSamples: r.DeviceSamples.Load(),
			HostSamples: r.HostSamples.Load(), Compressed: r.Compressed.Load(), Uploaded: r.Uploaded.Load()})
	}
	open := len(s.rings)
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b RingInfo) int { return a.ID - b.ID })
	t := Totals{Opened: s.stats.rings.Load(), Open: open, HeldBytes: s.stats.held.Load(), Fills: s.stats.fills.Load(),
		Errors: s.stats.errors.Load(), DeviceSamples: s.stats.device.Load(), HostSamples: s.stats.host.Load(),
		Compressed: s.stats.compressed.Load(), Uploaded: s.stats.uploaded.Load()}
	return out, t
}

// sampleType is a sample's shape and numpy dtype, from its header.
func sampleType(b layout.Blob) ([]int64, string) {
	h, err := layout.ParseNPYHeader(b.Header())
	if err != nil {
		return nil, ""
	}
	return h.Shape, h.Descr
}

// rights is the control message passing fds.
func rights(fds []int) []byte { return unix.UnixRights(fds...) }
