package gpu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
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

// A blosc zstd stream whose frame has a checksum goes to the CPU, which
// verifies it, even with Options.Unverified: the GPU decodes blosc's
// streams where no checksum can be checked, and the option trusts frames
// that have none (as c-blosc writes them), not ones whose checksum would
// go unread (another writer's, or a header damaged into saying so).
func TestBloscZstdChecksumToCPU(t *testing.T) {
	data := bytes.Repeat([]byte("blosc zstd checksum "), 500)
	plain := bloscCompress(data, 1, len(data), codec.NoShuffle, "zstd")
	unverified := Options{Unverified: true}
	if err := Refusal(&codec.Job{Codec: codec.Blosc, Src: plain, Dst: make([]byte, len(data))}, unverified); err != nil {
		t.Fatalf("blosc zstd without checksums, Unverified: %v", err)
	}
	// The same frame with one zstd frame of a checksum: one block, one
	// stream, so the stream is all that follows the block's start.
	frame := zstdCompress(data, 3)
	src := binary.LittleEndian.AppendUint32(slices.Clone(plain[:20]), uint32(len(frame)))
	src = append(src, frame...)
	binary.LittleEndian.PutUint32(src[12:], uint32(len(src)))
	j := codec.Job{Codec: codec.Blosc, Src: src, Dst: make([]byte, len(data))}
	if err := codec.Decode(codec.Blosc, j.Dst, src); err != nil || !bytes.Equal(j.Dst, data) {
		t.Fatalf("the CPU decoder on the checksummed stream: %v", err)
	}
	err := Refusal(&j, unverified)
	if !errors.Is(err, codec.ErrUnsupported) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("blosc zstd with a checksum, Unverified: %v, want it sent to the CPU", err)
	}
}
