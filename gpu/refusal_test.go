package gpu

import (
	"context"
	"errors"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
)

// Refusal, which reads framing alone with no device, agrees with the
// Decoder on every kind of chunk, under each option that moves a kind
// between the GPU and the CPU: it refuses exactly what the Decoder leaves
// to the CPU, and says ErrUnverified exactly where Options.Unverified
// would change that.
func TestRefusalAgreesWithDecoder(t *testing.T) {
	for _, o := range []struct {
		name string
		mod  func(*Options)
	}{
		{"default", func(*Options) {}},
		{"unverified", func(o *Options) { o.Unverified = true }},
		{"deflate", func(o *Options) { o.Deflate = true }},
	} {
		t.Run(o.name, func(t *testing.T) {
			opts := pipelineOptions()
			o.mod(&opts)
			jobs, _, names := genJobs(t, 37, 91)
			verdicts := make([]error, len(jobs))
			for i := range jobs {
				verdicts[i] = Refusal(&jobs[i], opts)
			}
			d := newFakeGPU().decoder(t, opts)
			if err := d.DecodeBatch(context.Background(), jobs); err != nil {
				t.Fatal(err)
			}
			took, left := 0, 0
			for i, j := range jobs {
				refused := errors.Is(j.Err, codec.ErrUnsupported)
				if refused != (verdicts[i] != nil) {
					t.Errorf("%s: Refusal says %v, the Decoder %v", names[i], verdicts[i], j.Err)
				}
				if refused {
					left++
				} else {
					took++
				}
				unverified := errors.Is(verdicts[i], ErrUnverified)
				if unverified && opts.Unverified {
					t.Errorf("%s: ErrUnverified with Options.Unverified on", names[i])
				}
				if !unverified && !opts.Unverified && j.Codec == codec.Zstd && names[i] == "zstd-nocrc" {
					t.Errorf("%s: refused for %v, want ErrUnverified", names[i], verdicts[i])
				}
			}
			if took == 0 || (left == 0 && !opts.Unverified) {
				t.Errorf("%d taken, %d left: the cases do not tell the verdicts apart", took, left)
			}
		})
	}
	// A chunk larger than a round's share is refused as the Decoder does.
	opts := pipelineOptions()
	opts.MaxBatchBytes, opts.Streams = 8<<10, 2
	jobs, _, _ := genJobs(t, 37, 91)
	if err := Refusal(&jobs[0], opts); !errors.Is(err, codec.ErrUnsupported) {
		t.Errorf("a %d-byte chunk with rounds of 4 KiB: %v", len(jobs[0].Dst), err)
	}
}
