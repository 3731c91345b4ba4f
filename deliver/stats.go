package deliver

import (
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/layout"
)

// ringStats are one ring's identity and what it was filled with.
type ringStats struct {
	ID          int
	Dir         string
	Memory      string
	Device      int
	Slots       int
	SlotBytes   int64
	SampleBytes int64
	Opened      time.Time
	counters
	// started counts the fill requests begun; the first one's start and
	// stages are kept (under the Server's mu): where a first batch's time
	// goes, which the sums over an epoch's fills hide.
	started   atomic.Int64
	firstFill *FirstFill
}

// FirstFill is a ring's first fill request: when it began, and its stages
// in seconds (Counts.Stages).
type FirstFill struct {
	Began  time.Time          `json:"began"`
	Stages map[string]float64 `json:"stages_s"`
}

// counters count what fills put in rings: one ring's, or every ring's
// since the server started.
type counters struct {
	fills, errors atomic.Int64
	// device and host count the samples by path; cached those of host
	// copied from blobs the cache held.
	device, host, cached atomic.Int64
	// compressed is the compressed bytes the device path read, uploaded
	// the decoded bytes the host path copied into slots, share those of
	// uploaded of chunks the device could take that the host decoded
	// instead (route.go).
	compressed, uploaded, share atomic.Int64
	stages                      stageTimes
}

// add counts a fill of job: dev and host samples by path, err its error.
func (c *counters) add(job *slotJob, dev, host int, err error) {
	c.fills.Add(1)
	if err != nil {
		c.errors.Add(1)
	}
	c.device.Add(int64(dev))
	c.host.Add(int64(host))
	c.cached.Add(job.cached.Load())
	c.compressed.Add(job.compressed.Load())
	c.uploaded.Add(job.uploaded.Load())
	c.share.Add(job.hostShare.Load())
	c.stages.addAll(&job.stages)
}

// counts are the counters as status reports them.
func (c *counters) counts() Counts {
	return Counts{Fills: c.fills.Load(), Errors: c.errors.Load(), DeviceSamples: c.device.Load(), HostSamples: c.host.Load(),
		CachedSamples: c.cached.Load(), Compressed: c.compressed.Load(), Uploaded: c.uploaded.Load(), HostShare: c.share.Load(), Stages: c.stages.doc()}
}

// Stages of a fill, where its time goes: what `zarrfs status` reports
// (stageNames), summed over fills. The device path's stages overlap: the
// host decodes what the device does not while the device decodes.
const (
	stFill       = iota // the whole fill request
	stRead              // reading the compressed chunks, laying the samples out (the fill code outside decoding)
	stConsumer          // waiting for the reader's consumer event before decoding into the slot
	stChecks            // reading the framing of the chunks the device decodes (host checks)
	stWait              // from those chunks queued to their bytes in the slot
	stH2D               // device time: compressed bytes to the device
	stDecode            // device time: decoding (nvCOMP, the LZ4 walk)
	stKernels           // device time: checksums, unshuffling, copies
	stD2H               // device time: results back to the host
	stHostDecode        // decoding on the host the chunks the device does not take
	stUpload            // copying what the host wrote into the slot
	stHostPath          // samples of the host path: blob opened through the cache, copied into the slot
	stHostShare         // chunks the device could take decoded on the host instead (route.go), and copied into the slot
	numStages
)

var stageNames = [numStages]string{"fill", "read", "consumer_wait", "host_checks", "device_wait", "h2d", "decode",
	"kernels", "d2h", "host_decode", "upload", "host_path", "host_share"}

// StageNames are the stages of Totals.Stages and RingInfo.Stages, in the
// order of a fill.
func StageNames() []string { return stageNames[:] }

// stageTimes are nanoseconds by stage.
type stageTimes [numStages]atomic.Int64

func (t *stageTimes) add(st int, d time.Duration) { t[st].Add(int64(d)) }

func (t *stageTimes) addAll(o *stageTimes) {
	for i := range o {
		t[i].Add(o[i].Load())
	}
}

// doc is the stages in seconds, by name.
func (t *stageTimes) doc() map[string]float64 {
	m := make(map[string]float64, numStages)
	for i, name := range stageNames {
		m[name] = time.Duration(t[i].Load()).Seconds()
	}
	return m
}

// Counts are what fills put in rings, as status reports them: of one
// ring (RingInfo) or of all (Totals).
type Counts struct {
	Fills         int64 `json:"fills"`
	Errors        int64 `json:"errors"`
	DeviceSamples int64 `json:"device_samples"`
	HostSamples   int64 `json:"host_samples"`
	// CachedSamples is the samples, among HostSamples, copied from blobs
	// the cache held (a warm mount), not decoded again.
	CachedSamples int64 `json:"cached_samples"`
	// Compressed is what the device path read of compressed chunks;
	// Uploaded the decoded bytes the host path copied into slots. On a
	// GPU, together they are the bytes that crossed to the device.
	Compressed int64 `json:"compressed_bytes"`
	Uploaded   int64 `json:"host_path_bytes"`
	// HostShare is the decoded bytes, among Uploaded, of chunks the device
	// could take that the host decoded instead, on idle cores, because it
	// was the sooner (chunks of large zstd frames, say).
	HostShare int64 `json:"host_share_bytes"`
	// Stages is where the fills' time went, in seconds by stage, summed
	// over fills (which run at once: the sum may pass the wall time):
	// fill (the whole request), read (compressed chunks read, samples laid
	// out), consumer_wait, host_checks, device_wait (queued to in the
	// slot), h2d, decode and kernels and d2h (device time of the rounds),
	// host_decode (chunks the device does not take), upload (what the
	// host wrote, into the slot), host_path, host_share (chunks the device
	// could take decoded on the host instead, and copied into the slot).
	Stages map[string]float64 `json:"stages_s"`
}

// RingInfo is a ring as status reports it.
type RingInfo struct {
	ID          int        `json:"id"`
	Dir         string     `json:"dir"`
	Memory      string     `json:"memory"`
	Device      int        `json:"device"`
	Slots       int        `json:"slots"`
	Bytes       int64      `json:"bytes"`
	SampleBytes int64      `json:"sample_bytes"`
	Opened      time.Time  `json:"opened"`
	FirstFill   *FirstFill `json:"first_fill,omitempty"`
	// Route is the ring's router, once a fill had chunks of large parts
	// (route.go).
	Route *RouteInfo `json:"route,omitempty"`
	Counts
}

// Totals are the counts of all rings since the server started.
type Totals struct {
	Opened int64 `json:"rings_opened"`
	Open   int   `json:"rings_open"`
	// HeldBytes is the memory of the rings open and of those being
	// opened (counted before they are made, so that rings opened at once
	// stay within MaxHeldBytes together).
	HeldBytes int64 `json:"ring_bytes"`
	Counts
}

// Stats returns the open rings, by ID, and the totals.
func (s *Server) Stats() ([]RingInfo, Totals) {
	s.mu.Lock()
	var out []RingInfo
	for c, r := range s.rings {
		ri := RingInfo{ID: r.ID, Dir: r.Dir, Memory: r.Memory, Device: r.Device, Slots: r.Slots,
			Bytes: int64(r.Slots) * r.SlotBytes, SampleBytes: r.SampleBytes, Opened: r.Opened, FirstFill: r.firstFill, Counts: r.counts()}
		if d, ok := c.ring.(deviceRing); ok {
			ri.Route = d.route().info()
		}
		out = append(out, ri)
	}
	open := len(s.rings)
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b RingInfo) int { return a.ID - b.ID })
	t := Totals{Opened: s.stats.rings.Load(), Open: open, HeldBytes: s.stats.held.Load(), Counts: s.stats.counts()}
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
