package deliver

// The messages of the delivery socket, one JSON object a line. Field names
// are the protocol: python/src/zarrfs/_deliver.py speaks it too.

// MaxRequest bounds a request's line, its newline included: a longer one
// is refused and its connection closed. A fill names a batch's files in
// it (about 87,000 names of 9 characters).
const MaxRequest = 1 << 20

// Memory kinds a ring may live in.
const (
	// MemoryCUDA: device memory shared through a CUDA IPC handle.
	MemoryCUDA = "cuda"
	// MemoryHost: a memfd the reader maps (the test mode: chunks decode on
	// the CPU).
	MemoryHost = "host"
)

// Error codes a reply may carry besides its message.
const (
	// CodeUnavailable: the mount cannot deliver the memory asked for (no
	// GPU decoding, another GPU, host memory not offered); a reader in
	// "auto" mode then reads files instead.
	CodeUnavailable = "unavailable"
	// CodeBadRequest: the request is malformed or names no sample
	// directory or file of the mount.
	CodeBadRequest = "bad_request"
	// CodeFill: a sample could not be filled (a damaged chunk, the source
	// down); File names it.
	CodeFill = "fill"
	// CodeRingLost: the ring is gone, whatever the samples (a GPU context
	// rebuilt after a device error freed it: gpu.ErrRingLost); the reader
	// lets go of it and opens another for what it reads next.
	CodeRingLost = "ring_lost"
)

// OpenRequest is a connection's first request: the ring to make.
type OpenRequest struct {
	Op string `json:"op"` // "open"
	// Dir is the sample directory, relative to the mount's root ("t",
	// "views/era5").
	Dir string `json:"dir"`
	// Memory is MemoryCUDA or MemoryHost.
	Memory string `json:"memory"`
	// PCIBusID names the reader's GPU ("0000:3b:00.0"): ordinals differ
	// between processes that see different CUDA_VISIBLE_DEVICES.
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// Slots and Batch: the ring holds Slots batches of up to Batch samples.
	Slots int `json:"slots"`
	Batch int `json:"batch"`
	// ConsumerEvents are the reader's interprocess events (CUDA IPC event
	// handles, hex), one per slot: it records slot k's on its consumer
	// stream when it lets go of slot k, before asking to refill it, and the
	// daemon's writes into slot k wait for that event only (a fill never
	// waits for the trainer's kernels on other slots).
	ConsumerEvents []string `json:"consumer_events,omitempty"`
	// ConsumerEvent is one event for the whole ring, as readers from
	// before per-slot events sent it: refused (unavailable), as its waits
	// are not this daemon's.
	ConsumerEvent string `json:"consumer_event,omitempty"`
}

// HoldsRequest asks, on a connection without a ring, whether the cache
// holds every sample of Share in Dir decoded (a warm mount). Readers in
// "auto" mode ask before they open a ring, and at each epoch's start: over
// a warm mount their own reads of the files are as fast as a ring's
// copies of them and take no ring memory nor daemon CPU
// (docs/python.md), and a reader with a ring lets go of it
// once a warm that ran meanwhile filled its share. The reply is
// holdsReply; the connection stays open for another request.
type HoldsRequest struct {
	Op    string `json:"op"` // "holds"
	Dir   string `json:"dir"`
	Share *Share `json:"share"`
}

// holdsReply answers a HoldsRequest.
type holdsReply struct {
	OK bool `json:"ok"`
	errorReply
	Held bool `json:"held"`
}

// Share is a reader's samples: positions First, First+Step, ... (Count of
// them) in a sample directory's listing.
type Share struct {
	First int64 `json:"first"`
	Step  int64 `json:"step"`
	Count int64 `json:"count"`
}

// openReply describes the ring.
type openReply struct {
	OK bool `json:"ok"`
	errorReply
	Memory string `json:"memory,omitempty"`
	// Handle is the ring's CUDA IPC memory handle (hex) for MemoryCUDA;
	// for MemoryHost the memfd comes with the reply (SCM_RIGHTS).
	Handle    string `json:"handle,omitempty"`
	RingBytes int64  `json:"ring_bytes,omitempty"`
	// Slot k starts at k*SlotBytes; sample j of a batch at
	// k*SlotBytes + j*SampleBytes.
	SlotBytes   int64    `json:"slot_bytes,omitempty"`
	SampleBytes int64    `json:"sample_bytes,omitempty"`
	Shape       []int64  `json:"shape,omitempty"`
	DType       string   `json:"dtype,omitempty"`
	Slots       int      `json:"slots,omitempty"`
	Batch       int      `json:"batch,omitempty"`
	Events      []string `json:"events,omitempty"` // per slot, CUDA IPC event handles (hex)
	// Device is the daemon's ordinal of the GPU (its own numbering).
	Device int `json:"device"`
	// Decode says where the mount decodes the chunks of samples put in the
	// ring: "device", or "host" in the test mode.
	Decode string `json:"decode,omitempty"`
}

type errorReply struct {
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
	// File is the sample file (relative to the mount) an error concerns.
	File string `json:"file,omitempty"`
	// Full marks a ring refused (CodeUnavailable) for room alone: the
	// memory the mount's rings may take (--gpu-memory on a GPU; in host
	// memory, a quarter of --memory) cannot hold it beside what is held
	// now. A ring of fewer or smaller slots may open.
	Full bool `json:"full,omitempty"`
}

// fillRequest asks for samples Files (names in the ring's directory, at
// most Batch) in slot Slot, sample j at offset j*SampleBytes.
type fillRequest struct {
	Op    string   `json:"op"` // "fill"
	Slot  int      `json:"slot"`
	Files []string `json:"files"`
}

// fillReply answers a fill: Op "ready" or "error".
type fillReply struct {
	Op   string `json:"op"`
	Slot int    `json:"slot"`
	errorReply
	// Device and Host count the samples each path filled.
	Device int `json:"device"`
	Host   int `json:"host"`
}

// request is any request, read before its op is known.
type request struct {
	OpenRequest
	Share *Share   `json:"share"`
	Slot  int      `json:"slot"`
	Files []string `json:"files"`
}
