package fill

import (
	"context"
	"fmt"
	"io"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// FillInto fills the data of blobs[i] of lay (its bytes after the header,
// Size - Align of them) into outs[i], under no pin, into memory the caller
// holds: a ring slot that a reader's process shares, say, where going
// through a file would cost a write and a read. Runs of consecutive
// samples of one view, or of one array (each of one piece: regionRun), of
// at most maxBytes of sample data (zero means DefaultBatchBytes), are read
// together in one Read, straight into outs (chunks that land whole decode
// in place there), so every source chunk a run shares is decoded once
// even when the decoded-chunk cache cannot hold it between samples, and a
// run's chunks are fetched side by side; other blobs are filled one by one
// as Fill fills them, except that a region in its own type (an array's
// sample, a view's channel filled alone) whose pieces each land in outs as
// one run (see regionPlan: a sample of levels chunked a level a chunk,
// however many pieces) is read piece by piece straight into outs, not
// through a piece buffer of the fill's. A run acquires its memory from
// the budget as a fill does, so delivery and the mount's fills share one
// bound.
// Nothing is read back from outs (a static channel is read for each sample
// or copied from what another fill kept), so the Read's decoder may put a
// chunk that lands whole in outs somewhere else instead (a GPU decoding
// into a ring slot: deliver.GPUFill); dec, when set, is that decoder (the
// reader decodes with it where it can, zarr.Redecoder), and a Drainer is
// told of each run once it is written. It stops at the first error; outs
// then hold garbage.
func (f *Filler) FillInto(ctx context.Context, lay *layout.Layout, blobs []layout.Blob, outs [][]byte, maxBytes int64, dec codec.BatchDecoder) error {
	if len(blobs) != len(outs) {
		return fmt.Errorf("fill: FillInto with %d blobs and %d buffers", len(blobs), len(outs))
	}
	if maxBytes < 0 {
		return fmt.Errorf("fill: FillInto of at most %d bytes: want 0 (DefaultBatchBytes) or more", maxBytes)
	}
	if maxBytes == 0 {
		maxBytes = DefaultBatchBytes
	}
	for i, b := range blobs {
		if want := b.Size() - int64(len(b.Header())); int64(len(outs[i])) != want {
			return fmt.Errorf("%s: FillInto with a buffer of %d bytes, want %d", b.Path(), len(outs[i]), want)
		}
	}
	r := f.run(lay, nil)
	if rd, ok := r.r.(zarr.Redecoder); ok && dec != nil {
		r.r = rd.Decoding(dec)
	}
	drain, _ := dec.(Drainer)
	r.stamp, _ = dec.(Stamper)
	for i := 0; i < len(blobs); {
		if j, holds := r.regionRun(blobs, outs, i, maxBytes, drain != nil); j > i+1 {
			if err := r.fillRegions(ctx, blobs[i:j], outs[i:j], holds, drain, i); err != nil {
				return err
			}
			i = j
			continue
		}
		vb, ok := blobs[i].(*layout.ViewBlob)
		data := int64(0)
		if ok {
			data = vb.Size() - int64(len(vb.Header()))
		}
		if !ok || !f.o.MemoryBudget.Fits(fillCost(vb.View(), data, []int64{vb.Index()})) {
			// Not a view, or a sample too large to read in one go (it is
			// then filled channel by channel, as Fill does).
			if err := r.fillOne(ctx, blobs[i], outs[i], drain, i); err != nil {
				return err
			}
			i++
			continue
		}
		ks := []int64{vb.Index()}
		j := i + 1
		for j < len(blobs) && int64(j-i+1)*data <= maxBytes {
			nb, ok := blobs[j].(*layout.ViewBlob)
			if !ok || nb.View() != vb.View() || len(nb.Header()) != len(vb.Header()) {
				break
			}
			if !f.o.MemoryBudget.Fits(2 * fillCost(vb.View(), data, append(ks, nb.Index()))) {
				break
			}
			ks = append(ks, nb.Index())
			j++
		}
		release, err := f.acquire(ctx, fillCost(vb.View(), data, ks), "samples of view "+vb.View().Name)
		if err != nil {
			return fmt.Errorf("%s: %w", vb.Path(), err)
		}
		// The charge covers outs[i:j] (fillCost counts the samples): a
		// Drainer gives their memory back before it goes.
		err = r.fillSamplesAs(ctx, vb.View(), ks, outs[i:j], true)
		if err == nil && drain != nil {
			err = drain.Drain(ctx, i, j)
		}
		release()
		if err != nil {
			if j-i == 1 {
				return fmt.Errorf("%s: %w", vb.Path(), err)
			}
			return fmt.Errorf("%s..%s: %w", vb.Path(), blobs[j-1].Path(), err)
		}
		i = j
	}
	return nil
}

// regionRun returns the end j of the run of samples of one array from
// blobs[i] that FillInto reads in one Read straight into outs (each read
// whole into its buffer as one piece would be: regionPlan), within
// maxBytes of data, and what the run holds besides outs (with outs, for a
// Drainer's: charged), within half the memory budget; j <= i+1 where
// there is no run of two.
func (r run) regionRun(blobs []layout.Blob, outs [][]byte, i int, maxBytes int64, drained bool) (j int, holds int64) {
	var a *zarr.Array
	var data int64
	for j = i; j < len(blobs); j++ {
		b, ok := blobs[j].(*layout.RegionBlob)
		if !ok {
			break
		}
		q := b.Region()
		if a == nil {
			a = q.Array
		}
		n := int64(len(outs[j]))
		if q.Array != a || n == 0 || data+n > maxBytes {
			break
		}
		p, direct, _ := r.regionPlan(dataWriter{outs[j], int64(len(b.Header()))}, int64(len(b.Header())), a, q.Start, q.Count, a.DType)
		if direct == nil || p.count(q.Start, q.Count) != 1 {
			break
		}
		h := regionHolds(p, direct, 0)
		if drained {
			h = satAdd(h, n)
		}
		if !r.o.MemoryBudget.Fits(2 * satAdd(holds, h)) {
			break
		}
		holds, data = satAdd(holds, h), data+n
	}
	return j, holds
}

// fillRegions reads the samples of one array blobs (a regionRun, outs
// their buffers, the i-th of FillInto's on) in one Read straight into
// outs: a chunk that several of them share is fetched and decoded once,
// and the samples' chunks are fetched side by side and decoded together.
func (r run) fillRegions(ctx context.Context, blobs []layout.Blob, outs [][]byte, holds int64, drain Drainer, i int) error {
	name := blobs[0].Path() + ".." + blobs[len(blobs)-1].Path()
	release, err := r.acquire(ctx, holds, "samples of array "+blobs[0].(*layout.RegionBlob).Region().Array.Path)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer release()
	reqs := make([]zarr.Request, len(blobs))
	for k, b := range blobs {
		q := b.(*layout.RegionBlob).Region()
		q.Dst = outs[k][:prod(q.Count)*int64(q.Array.DType.Size)] // the region's bytes (regionRun: they fit)
		reqs[k] = q
	}
	if err := r.r.Read(ctx, r.pin, reqs); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if drain != nil {
		if err := drain.Drain(ctx, i, i+len(blobs)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// Drainer is a FillInto decoder whose outs are memory that only the
// fill's writes make resident, held until the Drainer has moved what was
// written elsewhere: a ring slot's shadow, whose pages the host's writes
// fault in until they are copied into the slot (deliver.GPUFill). FillInto
// then charges the memory budget for every sample's bytes, as for a
// view's (whose charge counts them anyway), and calls Drain(i, j) once
// blobs[i:j] are written, while it still holds their charge; Drain must
// give their memory back before it returns, so that no byte the fill made
// resident outlives its charge. Runs are drained in order, each once,
// and only those written without error. An error of Drain ends the fill.
type Drainer interface {
	codec.BatchDecoder
	Drain(ctx context.Context, i, j int) error
}

// A Stamper is a Drainer that takes the static channels of FillInto's
// samples itself: Stamp(dst, src) says that dst, a range of outs, is to
// hold src (a static channel's bytes, the same for every sample of the
// run, never written again), and reports whether the Stamper puts them
// where dst stands for, by the time dst's run is drained (a slot's decoder
// sends them to the device once a fill and copies them there into each
// sample), so that the fill neither copies them nor makes dst's memory
// resident; if not, the fill copies them.
type Stamper interface {
	Drainer
	Stamp(dst, src []byte) bool
}

// fillOne fills blob b (the i-th of FillInto's) into out as Fill does. For
// a Drainer, it acquires out's bytes with what the fill holds in one call
// (blobCost; the fill then acquires nothing), and drains the blob before
// giving them back.
func (r run) fillOne(ctx context.Context, b layout.Blob, out []byte, drain Drainer, i int) error {
	w := dataWriter{out, int64(len(b.Header()))}
	if drain == nil {
		return r.fill(ctx, b, w)
	}
	release, err := r.acquire(ctx, satAdd(int64(len(out)), r.blobCost(b, w)), "its bytes and its fill's buffers")
	if err != nil {
		return fmt.Errorf("%s: %w", b.Path(), err)
	}
	defer release()
	held := r
	held.held = true
	if err := held.fill(ctx, b, w); err != nil {
		return err
	}
	return drain.Drain(ctx, i, i+1)
}

// dataWriter takes a blob's Fill into the caller's buffer of its data: the
// header (written at offsets below skip) is dropped, the data written at
// its offset less skip.
type dataWriter struct {
	buf  []byte
	skip int64
}

var (
	_ io.WriterAt  = dataWriter{}
	_ bufferWriter = dataWriter{}
)

// buffer is the part of the caller's buffer that the file's bytes
// off..off+n are, or nil where they are not all data.
func (w dataWriter) buffer(off, n int64) []byte {
	if off < w.skip || n < 0 || off-w.skip+n > int64(len(w.buf)) {
		return nil
	}
	at := off - w.skip
	return w.buf[at : at+n : at+n]
}

func (w dataWriter) WriteAt(p []byte, off int64) (int, error) {
	if off < w.skip {
		if off+int64(len(p)) > w.skip {
			return 0, fmt.Errorf("fill: a write of %d bytes at %d straddles the data offset %d", len(p), off, w.skip)
		}
		return len(p), nil
	}
	off -= w.skip
	if off+int64(len(p)) > int64(len(w.buf)) {
		return 0, fmt.Errorf("fill: a write of %d bytes at data offset %d passes the end (%d)", len(p), off, len(w.buf))
	}
	copy(w.buf[off:], p)
	return len(p), nil
}
