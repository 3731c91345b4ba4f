package deliver

import (
	"context"
	"errors"
	"slices"
	"sync"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/layout"
)

// GPUFill is the device path on a GPU: a batch's samples are filled into a
// host shadow of the slot (pinned memory, fill.Filler.FillInto, the mount's own
// fill code), except that every chunk that lands whole in the shadow, of a
// codec the GPU may take alone, decodes on the GPU straight into the slot
// (gpu.Ring.Decode) and never reaches the host. What the host wrote
// instead (chunks of other codecs, casts, fill values, static channels)
// is then copied from the shadow into the slot, and only that. Fallback
// decodes what the GPU does not (the mount's pipeline).
type GPUFill struct {
	Filler   *fill.Filler
	Fallback codec.BatchDecoder
}

func (f GPUFill) FillSlot(ctx context.Context, r Ring, k int, job *slotJob) []error {
	errs := make([]error, len(job.blobs))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	cr, ok := r.(*cudaRing)
	if !ok {
		return fail(errors.New("the ring is not in GPU memory"))
	}
	n := int64(len(job.blobs)) * job.size
	shadow := cr.d.HostAlloc(int(n))
	defer cr.d.HostFree(shadow)
	outs := make([][]byte, len(job.blobs))
	for i := range job.blobs {
		outs[i] = shadow[job.offs[i] : job.offs[i]+job.size]
	}
	sd := &slotDecoder{ring: cr, slot: k, shadow: shadow, fallback: f.Fallback, compressed: &job.compressed}
	if bigEndian(job.blobs) {
		// The host swaps such chunks after decoding them in place: they
		// must decode where it can.
		sd.hostOnly = true
	}
	if err := f.Filler.FillInto(ctx, job.lay, job.blobs, outs, 0, sd); err != nil {
		return fail(err)
	}
	// What the device did not write, the host did: copy it from the shadow.
	var uploaded int64
	for _, gap := range gaps(sd.covered(), n) {
		if err := cr.r.Write(k, gap[0], shadow[gap[0]:gap[1]]); err != nil {
			return fail(err)
		}
		uploaded += gap[1] - gap[0]
	}
	job.uploaded.Add(uploaded)
	return errs
}

// bigEndian reports whether a source array of the blobs is big-endian
// with elements of more than one byte.
func bigEndian(blobs []layout.Blob) bool {
	for _, b := range blobs {
		for _, s := range b.Sources() {
			if s.Array != nil && s.Array.DType.BigEndian && s.Array.DType.Size > 1 {
				return true
			}
		}
	}
	return false
}

// slotDecoder decodes the chunks of one fill: those that land in the
// shadow on the GPU, into the slot, the rest with fallback.
type slotDecoder struct {
	ring       *cudaRing
	slot       int
	shadow     []byte
	fallback   codec.BatchDecoder
	compressed interface{ Add(int64) int64 }
	hostOnly   bool

	mu   sync.Mutex
	done [][2]int64 // shadow ranges the device wrote into the slot
}

// deviceCodecs are the codecs the GPU decodes into a slot with every
// check made before it reads them (gpu's doc: LZ4 walked, blosc framing
// parsed); zstd goes too, and the GPU refuses the frames it would have to
// verify over decoded bytes.
var deviceCodecs = map[codec.Name]bool{codec.Blosc: true, codec.LZ4: true, codec.Zstd: true}

func (s *slotDecoder) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(s.shadow)))
	var dev []int
	var offs []int64
	if !s.hostOnly {
		for i, j := range jobs {
			if !deviceCodecs[j.Codec] || len(j.Parts) > 0 || len(j.Src) == 0 || len(j.Dst) == 0 {
				continue
			}
			at := uintptr(unsafe.Pointer(unsafe.SliceData(j.Dst)))
			if at < base || at+uintptr(len(j.Dst)) > base+uintptr(len(s.shadow)) {
				continue
			}
			dev = append(dev, i)
			offs = append(offs, int64(at-base))
		}
	}
	var rest []int
	if len(dev) > 0 {
		sub := make([]codec.Job, len(dev))
		for k, i := range dev {
			sub[k] = jobs[i]
		}
		if err := s.ring.r.Decode(ctx, s.slot, sub, offs); err != nil && ctx.Err() != nil {
			return err
		}
		for k, i := range dev {
			switch err := sub[k].Err; {
			case err == nil:
				s.compressed.Add(int64(len(jobs[i].Src)))
				s.mu.Lock()
				s.done = append(s.done, [2]int64{offs[k], offs[k] + int64(len(jobs[i].Dst))})
				s.mu.Unlock()
			case errors.Is(err, codec.ErrUnsupported):
				rest = append(rest, i) // the host decodes it into the shadow
			default:
				jobs[i].Err = err
			}
		}
	}
	inDev := make(map[int]bool, len(dev))
	for _, i := range dev {
		inDev[i] = true
	}
	for i := range jobs {
		if !inDev[i] {
			rest = append(rest, i)
		}
	}
	if len(rest) == 0 {
		return nil
	}
	sub := make([]codec.Job, len(rest))
	for k, i := range rest {
		sub[k] = jobs[i]
		sub[k].Err = nil
	}
	err := s.fallback.DecodeBatch(ctx, sub)
	for k, i := range rest {
		jobs[i].Err = sub[k].Err
	}
	return err
}

// covered returns the shadow ranges the device wrote, sorted.
func (s *slotDecoder) covered() [][2]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.done)
	slices.SortFunc(out, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	return out
}

// gaps returns the ranges of [0, n) that no range of covered (sorted,
// disjoint) holds.
func gaps(covered [][2]int64, n int64) [][2]int64 {
	var out [][2]int64
	at := int64(0)
	for _, c := range covered {
		if c[0] > at {
			out = append(out, [2]int64{at, c[0]})
		}
		at = max(at, c[1])
	}
	if at < n {
		out = append(out, [2]int64{at, n})
	}
	return out
}
