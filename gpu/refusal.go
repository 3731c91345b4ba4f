package gpu

import (
	"errors"
	"fmt"

	"github.com/zarrfs/zarrfs/codec"
)

// ErrUnverified is wrapped by Refusal for a chunk that a Decoder decodes
// only with Options.Unverified: no checksum the host can verify holds
// nvCOMP's result to the CPU decoder's.
var ErrUnverified = errors.New("no checksum the host can verify")

// Refusal returns why a Decoder with Options o would leave job j to the CPU
// (an error wrapping codec.ErrUnsupported, and ErrUnverified where
// Options.Unverified would change that; codec.ErrCorrupt where its framing
// is damaged), or nil where it would decode it. It reads the job's framing
// on the host, as the Decoder does before a round, with no device: package
// decode's auto mode routes by it, and before any GPU starts, learns from
// it whether one could take a share of the work at all. Blocks are not
// walked: a chunk it passes may still be found corrupt by the Decoder.
func Refusal(j *codec.Job, o Options) error {
	p := frame(j)
	return o.refusal(j, &p)
}

// refusal is why a job framed as p goes to the CPU under these Options,
// or nil: the one decision Refusal and the Decoder's batches
// (decodeBatch) make, so that auto's routing and the decoder never
// disagree. A damaged framing (p.err) is its own answer.
func (opts Options) refusal(j *codec.Job, p *prepared) error {
	switch {
	case p.err != nil:
		return p.err
	case !opts.Deflate && p.uses(algoDeflate):
		return fmt.Errorf("gpu: %s chunk: deflate decodes on the CPU (Options.Deflate is off): %w", j.Codec, codec.ErrUnsupported)
	case !opts.Unverified && p.unverified != "":
		return fmt.Errorf("gpu: %s chunk: %s: %w, decoded on the CPU (Options.Unverified is off): %w", j.Codec, p.unverified, ErrUnverified, codec.ErrUnsupported)
	case !opts.Unverified && opts.SkipChecksums && (p.check != checkNone || len(p.sums) > 0):
		return fmt.Errorf("gpu: %s chunk: only its checksum verifies it, and Options.SkipChecksums is on: decoded on the CPU (Options.Unverified is off): %w",
			j.Codec, codec.ErrUnsupported)
	case opts.MaxBatchBytes > 0 && opts.Streams > 0 && p.cost(int64(len(j.Dst))) > opts.share():
		// Options as a Decoder normalises them always bound a round.
		return fmt.Errorf("gpu: %d-byte chunk exceeds one round's share (%d bytes) of the batch memory bound: %w",
			len(j.Dst), opts.share(), codec.ErrUnsupported)
	}
	return nil
}
