package zarr

import (
	"context"

	"github.com/zarrfs/zarrfs/codec"
)

// Redecoder is an optional upgrade of a Reader that decodes chunks:
// Decoding returns a Reader that decodes them with d instead.
type Redecoder interface {
	Decoding(d codec.BatchDecoder) Reader
}

var _ Redecoder = (*Hierarchy)(nil)

// Decoding returns a Reader that reads h as Read does but decodes the
// chunks with d instead of the Hierarchy's decoder: a fill that decodes
// into memory of its own kind (a ring slot on a GPU) brings the decoder
// that writes it, or one that counts what it decoded. When d lends memory
// (codec.HostMemory: a GPU's pinned memory, which it copies from without
// staging), compressed chunks are read into it, as they are into the
// Hierarchy's decoder's (Options.Memory); otherwise into the Hierarchy's
// memory. Everything else about its Reads (their sources, checks and
// assembly) is the same.
func (h *Hierarchy) Decoding(d codec.BatchDecoder) Reader {
	return decoding{h, d}
}

type decoding struct {
	h   *Hierarchy
	dec codec.BatchDecoder
}

func (r decoding) Read(ctx context.Context, pin *Pin, reqs []Request) error {
	mem := r.h.mem
	if m, ok := r.dec.(codec.HostMemory); ok {
		mem = m
	}
	return r.h.read(ctx, r.dec, mem, pin, reqs)
}
