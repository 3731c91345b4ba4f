package fill

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// Options configure New. The zero value of every field but Cache means
// its default.
type Options struct {
	// Cache is where complete blobs live (Filler.Open). Nil: the Filler
	// only fills (Fill, FillInto), as a benchmark does.
	Cache *cache.Cache
	// Reader reads the source. Nil means the hierarchy of the layout a
	// blob belongs to.
	Reader zarr.Reader
	// SlabBytes bounds the memory one fill holds at a time: a larger blob
	// is read in slabs cut at chunk boundaries, so each chunk is still
	// decoded once. Zero means 64 MiB.
	SlabBytes int64
	// MemoryBudget bounds the memory all fills hold at once: a fill
	// acquires what its buffers and its reads will hold (sized by the
	// store's metadata) before it allocates, waiting while others hold
	// the budget, and fails with an error wrapping memory.ErrExceeded when
	// it needs more than the whole budget even in pieces. Nil means no
	// bound.
	MemoryBudget *memory.Budget
	// Memory lends the buffers fills hold (the process's one lender,
	// decode.Pipeline.Memory); a reader that lends its own (Lender: a
	// hierarchy decoding on a GPU) lends those the decoder writes. Nil
	// means ordinary memory, allocated per fill.
	Memory memory.Lender
	// Observe, when set, is told of every fill Open runs (the reader's and
	// readahead's): the array or view it belongs to (Group), how long it
	// took and how it ended. Hits run no fill and report nothing.
	Observe func(group string, took time.Duration, err error)
}

// Lender is a Reader that lends the buffers fills decode into: a
// zarr.Hierarchy whose decoder is the GPU's writes its pinned memory
// without a copy.
type Lender interface {
	Memory() codec.HostMemory
}

var _ Lender = (*zarr.Hierarchy)(nil)

// Filler makes blobs' bytes and, given a cache, keeps them there. It is
// safe for concurrent use, and outlives the layouts it fills blobs of (a
// mount replaces its layout every --metadata-ttl).
type Filler struct {
	o Options
}

// New returns a Filler, or an error naming the first bad option.
func New(o Options) (*Filler, error) {
	if o.SlabBytes < 0 {
		return nil, fmt.Errorf("fill: slab bytes %d: want 0 (64 MiB) or more", o.SlabBytes)
	}
	if o.SlabBytes == 0 {
		o.SlabBytes = 64 << 20
	}
	return &Filler{o: o}, nil
}

// MemoryBudget is the bound of what all fills hold at once (nil: none).
func (f *Filler) MemoryBudget() *memory.Budget { return f.o.MemoryBudget }

// Fill writes the whole file of blob b of lay (header, then data at its
// alignment) to w, reading the source under pin (nil: the arrays' current
// listings). Every chunk it needs is decoded once. On error, w holds
// garbage the caller must discard.
func (f *Filler) Fill(ctx context.Context, lay *layout.Layout, b layout.Blob, pin *zarr.Pin, w io.WriterAt) error {
	return f.run(lay, pin).fill(ctx, b, w)
}

// fill writes the whole file of b to w.
func (r run) fill(ctx context.Context, b layout.Blob, w io.WriterAt) error {
	switch b := b.(type) {
	case *layout.RegionBlob:
		return r.fillRegion(ctx, b, w)
	case *layout.ViewBlob:
		return r.fillView(ctx, b, w)
	}
	return fmt.Errorf("fill: %s: a blob of type %T", b.Path(), b)
}

// run is one fill's reader, memory and pin.
type run struct {
	*Filler
	r   zarr.Reader
	mem codec.HostMemory // lends the fill's buffers; nil: pooled memory
	pin *zarr.Pin
	// held says that the caller acquired what the fill holds (blobCost)
	// with what it holds itself: the fill acquires nothing, never
	// acquiring while its caller holds.
	held bool
	// stamp, when set, takes the static channels of FillInto's samples
	// (Stamper).
	stamp Stamper
}

func (f *Filler) run(lay *layout.Layout, pin *zarr.Pin) run {
	r := f.o.Reader
	if r == nil {
		r = lay.Hierarchy()
	}
	var mem codec.HostMemory
	if l, ok := r.(Lender); ok {
		mem = l.Memory()
	}
	return run{Filler: f, r: r, mem: mem, pin: pin}
}

// fillRegion writes the header, then the region, read in pieces that fit
// the memory limits (see planPieces).
func (r run) fillRegion(ctx context.Context, b *layout.RegionBlob, w io.WriterAt) error {
	if _, err := w.WriteAt(b.Header(), 0); err != nil {
		return fmt.Errorf("%s: write header: %w", b.Path(), err)
	}
	q := b.Region()
	if err := r.readRegion(ctx, w, int64(len(b.Header())), q.Array, q.Start, q.Count); err != nil {
		return fmt.Errorf("%s: %w", b.Path(), err)
	}
	return nil
}

// slab returns a buffer the decoder writes: lent by the reader's memory
// when it lends, else by the Filler's.
func (r run) slab(n int64) []byte {
	if r.mem != nil && n > 0 {
		return r.mem.HostAlloc(int(n))
	}
	return r.scratch(n)
}

func (r run) freeSlab(b []byte) {
	if r.mem != nil {
		r.mem.HostFree(b)
		return
	}
	r.freeScratch(b)
}

// scratch returns a buffer only the fill reads and writes (a cast's
// output): lent by the Filler's memory, a kept mapping lent again, so that
// a steady stream of fills neither faults fresh pages in nor has the
// collector zero them.
func (r run) scratch(n int64) []byte {
	if m := r.o.Memory; m != nil && n > 0 {
		return m.HostAlloc(int(n))
	}
	return make([]byte, n)
}

func (r run) freeScratch(b []byte) {
	if m := r.o.Memory; m != nil {
		m.HostFree(b)
	}
}

// pieceBytes bounds the buffer one piece of a fill reads into.
func (f *Filler) pieceBytes() int64 {
	n := f.o.SlabBytes
	if t := f.o.MemoryBudget.Total(); t > 0 {
		n = min(n, max(t/4, 1))
	}
	return n
}

// pieceCost bounds a piece's buffer and the memory its read holds, where
// the chunk grid lets a cut reach it.
func (f *Filler) pieceCost() int64 {
	n := 4 * f.o.SlabBytes
	if t := f.o.MemoryBudget.Total(); t > 0 {
		n = min(n, max(t/2, 1))
	}
	return n
}

// acquire takes n bytes of the memory budget for what.
func (f *Filler) acquire(ctx context.Context, n int64, what string) (func(), error) {
	release, err := f.o.MemoryBudget.Acquire(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return release, nil
}

// acquire is the Filler's, or nothing when the caller holds what the
// fill needs (held).
func (r run) acquire(ctx context.Context, n int64, what string) (func(), error) {
	if r.held {
		return func() {}, nil
	}
	return r.Filler.acquire(ctx, n, what)
}

// blobCost is the most that fill(b) into w acquires at once, besides the
// buffer of w it reads into (regionPlan): what the caller of a held run
// acquires for it with that buffer.
func (r run) blobCost(b layout.Blob, w io.WriterAt) int64 {
	switch b := b.(type) {
	case *layout.RegionBlob:
		q := b.Region()
		return r.regionCost(w, int64(len(b.Header())), q.Array, q.Start, q.Count, q.Array.DType)
	case *layout.ViewBlob:
		v, align := b.View(), int64(len(b.Header()))
		if cost := fillCost(v, b.Size()-align, []int64{b.Index()}); r.o.MemoryBudget.Fits(cost) {
			return cost // fillView
		}
		var most int64 // fillByChannel
		per := prod(v.SampleShape[1:]) * int64(v.DType.Size)
		t := v.Start + b.Index()*v.Step
		for c := range v.Channels {
			ch := &v.Channels[c]
			start, count := ch.Region(t)
			most = max(most, r.regionCost(w, align+int64(c)*per, ch.Array, start, count, v.DType))
		}
		return most
	}
	return 0
}

func prod(s []int64) int64 {
	p := int64(1)
	for _, v := range s {
		p *= v
	}
	return p
}
