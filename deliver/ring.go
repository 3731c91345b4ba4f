package deliver

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Memory makes rings: device memory of the mount's GPUs, or host memory
// in the test mode.
type Memory interface {
	// Kind is MemoryCUDA or MemoryHost.
	Kind() string
	// NewRing allocates slots slots of slotBytes each for the reader that
	// req describes. An error wrapping ErrUnavailable says the reader must
	// read files instead (another GPU, memory of another kind).
	NewRing(ctx context.Context, req *OpenRequest, slots int, slotBytes int64) (Ring, error)
}

// Ring is one connection's shared memory. Its methods are called for
// different slots concurrently; a slot's calls come one at a time.
type Ring interface {
	// Bytes is the ring's size.
	Bytes() int64
	// Device is the daemon's ordinal of the ring's GPU (0 for host memory).
	Device() int
	// Describe adds the ring's handles to the open reply and returns the
	// files to pass with it.
	Describe(r *openReply) []*os.File
	// Begin readies slot k for writing: on a GPU, the slot's writes wait
	// for the reader's consumer event of slot k, recorded before it asked.
	Begin(k int) error
	// Host returns slot k's memory when the host may write it in place,
	// else nil.
	Host(k int) []byte
	// Stage returns host memory for n bytes headed for a slot (pinned on a
	// GPU); Unstage gives it back once Write returned.
	Stage(n int) []byte
	Unstage(b []byte)
	// Write copies b into slot k at off; b may be reused when it returns.
	Write(ctx context.Context, k int, off int64, b []byte) error
	// Done makes slot k's writes visible to the reader (records its event).
	Done(k int) error
	// Close frees the ring once nothing writes it.
	Close() error
}

// ErrUnavailable is wrapped when the mount cannot make the ring a reader
// asked for; the reader then reads the mount's files.
var ErrUnavailable = errors.New("delivery unavailable")

// DeviceFill decodes samples straight into a ring's slot: the device path.
// FillSlot fills blobs' data into slot k at offs, and returns per blob nil
// when every byte came from its path, or why not: the sample then goes
// through the host path, which decides (a damaged chunk fails there too).
// A nil DeviceFill sends every sample through the host path.
type DeviceFill interface {
	FillSlot(ctx context.Context, r Ring, k int, job *slotJob) []error
}

// HostMemory is Memory in host shared memory: a memfd per ring, mapped by
// the daemon and passed to the reader, who maps it too. It is the test
// mode of delivery on machines without a GPU: the whole protocol, the
// ring's lifecycle and the fills run as on a GPU, with the CPU decoding
// into the slots (HostFill). What its rings hold together is bounded by
// the Server (MaxHeldBytes).
type HostMemory struct{}

func (HostMemory) Kind() string { return MemoryHost }

func (m HostMemory) NewRing(_ context.Context, req *OpenRequest, slots int, slotBytes int64) (Ring, error) {
	if req.Memory != MemoryHost {
		return nil, fmt.Errorf("%w: this mount delivers into host memory (a test mode: --delivery host), not %s", ErrUnavailable, req.Memory)
	}
	n := int64(slots) * slotBytes
	fd, err := unix.MemfdCreate("zarrfs-ring", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "zarrfs-ring")
	if err := f.Truncate(n); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd of %d bytes: %w", n, err)
	}
	mem, err := unix.Mmap(fd, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("map a ring of %d bytes: %w", n, err)
	}
	return &hostRing{f: f, mem: mem, slot: slotBytes}, nil
}

type hostRing struct {
	f    *os.File
	mem  []byte
	slot int64
}

func (r *hostRing) Bytes() int64 { return int64(len(r.mem)) }
func (r *hostRing) Device() int  { return 0 }

func (r *hostRing) Describe(o *openReply) []*os.File { return []*os.File{r.f} }

func (r *hostRing) Begin(int) error { return nil }

func (r *hostRing) Host(k int) []byte {
	return r.mem[int64(k)*r.slot : int64(k+1)*r.slot : int64(k+1)*r.slot]
}

func (r *hostRing) Stage(n int) []byte { return make([]byte, n) }
func (r *hostRing) Unstage([]byte)     {}

func (r *hostRing) Write(_ context.Context, k int, off int64, b []byte) error {
	s := r.Host(k)
	if off < 0 || off+int64(len(b)) > int64(len(s)) {
		return fmt.Errorf("deliver: a write of %d bytes at %d passes slot %d's %d bytes", len(b), off, k, len(s))
	}
	copy(s[off:], b)
	return nil
}

func (r *hostRing) Done(int) error { return nil }

// Close unmaps the daemon's view; the reader's mapping, if any, keeps the
// memory until it goes.
func (r *hostRing) Close() error {
	err := unix.Munmap(r.mem)
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	return err
}
