package zarr

import (
	"context"

	"github.com/zarrfs/zarrfs/codec"
)

type decoderKey struct{}

// WithDecoder returns a context under which Reads decode their chunks with
// d instead of the Hierarchy's decoder: a fill that decodes into memory of
// its own kind (a ring slot on a GPU) brings the decoder that writes it,
// or one that counts what it decoded. Everything else about the Read (its
// sources, checks and assembly) is the same.
func WithDecoder(ctx context.Context, d codec.BatchDecoder) context.Context {
	return context.WithValue(ctx, decoderKey{}, d)
}

// decoderFor is the decoder a Read under ctx uses: WithDecoder's, else
// the Hierarchy's.
func (h *Hierarchy) decoderFor(ctx context.Context) codec.BatchDecoder {
	if d, ok := ctx.Value(decoderKey{}).(codec.BatchDecoder); ok && d != nil {
		return d
	}
	return h.opts.Decoder
}
