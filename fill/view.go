package fill

// A view's samples: one Read for the channels of a run of samples, cast
// to the view's type, written at the blob's aligned data offset.

import (
	"context"
	"fmt"
	"io"

	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// fillView reads every channel of the sample in one Read, so each source chunk
// is decoded once however many channels come from it, casts, and writes the
// header and the (C, *spatial) data. It holds the whole sample in memory.
// A sample whose one Read would not fit the memory budget (one of millions
// of tiny chunks, or of channels each larger than the budget) is filled
// channel by channel instead (fillByChannel).
func (r run) fillView(ctx context.Context, b *layout.ViewBlob, w io.WriterAt) error {
	v, align := b.View(), int64(len(b.Header()))
	cost := fillCost(v, b.Size()-align, []int64{b.Index()})
	if !r.o.MemoryBudget.Fits(cost) {
		return r.fillByChannel(ctx, b, w)
	}
	release, err := r.acquire(ctx, cost, "sample of view "+v.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", b.Path(), err)
	}
	defer release()
	out := r.slab(b.Size() - align)
	defer r.freeSlab(out)
	if err := r.fillSamples(ctx, v, []int64{b.Index()}, [][]byte{out}); err != nil {
		return fmt.Errorf("%s: %w", b.Path(), err)
	}
	return writeBlob(w, b.Path(), b.Header(), out)
}

// fillByChannel writes the header and each channel's region in pieces cut
// at chunk boundaries, as an array's sample is filled (readRegion), cast
// piece by piece: it holds a piece at a time, not the sample. A chunk that
// several channels read (levels of one chunk) is decoded once for each.
func (r run) fillByChannel(ctx context.Context, b *layout.ViewBlob, w io.WriterAt) error {
	if _, err := w.WriteAt(b.Header(), 0); err != nil {
		return fmt.Errorf("%s: write header: %w", b.Path(), err)
	}
	v, align := b.View(), int64(len(b.Header()))
	per := prod(v.SampleShape[1:]) * int64(v.DType.Size)
	t := v.Start + b.Index()*v.Step
	for c := range v.Channels {
		ch := &v.Channels[c]
		start, count := ch.Region(t)
		if err := r.readRegionAs(ctx, w, align+int64(c)*per, ch.Array, start, count, v.DType); err != nil {
			return fmt.Errorf("%s: channel %s: %w", b.Path(), ch.Var, err)
		}
	}
	return nil
}

// writeBlob writes a blob's header, and its data after it (at the
// header's length, the layout's alignment).
func writeBlob(w io.WriterAt, p string, header, data []byte) error {
	if _, err := w.WriteAt(header, 0); err != nil {
		return fmt.Errorf("%s: write header: %w", p, err)
	}
	if _, err := w.WriteAt(data, int64(len(header))); err != nil {
		return fmt.Errorf("%s: write: %w", p, err)
	}
	return nil
}

// fillCost bounds the memory that filling samples ks (data bytes each) in
// one fillSamples holds: the samples, the cast scratch, and what the Read
// of every channel's region holds (chunks shared by the samples counted
// once per sample at most).
func fillCost(v *layout.View, data int64, ks []int64) int64 {
	n := int64(len(ks))
	cost := satMul(data, n)
	spatial := prod(v.SampleShape[1:])
	lo, hi := ks[0], ks[0]
	for _, k := range ks {
		lo, hi = min(lo, k), max(hi, k)
	}
	// Each run of channels (slotRuns) reads one region of its array, over
	// the samples lo..hi. Regions that read the same chunks (levels 0 and
	// 2 of one chunk) cost them once, as the one Read decodes them once;
	// a region no other reads, whose chunks are one sample thick, lands in
	// its slots of each sample as one request would, decoding in place
	// what lies wholly inside it (zarr.ReadCostInto).
	type region struct {
		a            *zarr.Array
		start, count []int64
		runs         int
		into         bool
	}
	regions := map[string]*region{}
	for _, g := range slotRuns(v) {
		ch := &v.Channels[g.first]
		if !zarr.SameValues(ch.Array.DType, v.DType) {
			cost = satAdd(cost, satMul(satMul(spatial, int64(ch.Array.DType.Size)), n))
		}
		start, count := ch.Region(v.Start + lo*v.Step)
		if ch.Axis >= 0 {
			count[ch.Axis] = (hi-lo)*v.Step + 1
		}
		if g.axis >= 0 {
			count[g.axis] = int64(g.n)
		}
		key := ch.Array.Path
		for d := range start {
			if c := ch.Array.Chunks[d]; c > 0 {
				key += fmt.Sprintf("/%d-%d", start[d]/c, (start[d]+count[d]-1)/c)
			}
		}
		if r := regions[key]; r != nil {
			r.runs++
			continue
		}
		into := ch.Axis < 0 || ch.Array.Chunks[ch.Axis] == 1
		regions[key] = &region{a: ch.Array, start: start, count: count, runs: 1, into: into}
	}
	for _, r := range regions {
		if r.runs == 1 && r.into {
			cost = satAdd(cost, r.a.ReadCostInto(r.start, r.count))
		} else {
			cost = satAdd(cost, r.a.ReadCost(r.start, r.count))
		}
	}
	return cost
}

// fillSamples fills outs[i] with sample ks[i] (each len prod(SampleShape) *
// DType.Size) through one Read. A static channel is read at most once.
func (r run) fillSamples(ctx context.Context, v *layout.View, ks []int64, outs [][]byte) error {
	return r.fillSamplesAs(ctx, v, ks, outs, false)
}

// fillSamplesAs is fillSamples; writeOnly says that outs may not hold
// what the Read decoded into them (a decoder that writes a chunk landing
// whole in outs elsewhere: FillInto's), so nothing is read back from
// them: a static channel is copied from the memo, or read once into
// memory of the fill's own (own), which no decoder puts elsewhere, copied
// into every sample from there (or stamped there: Stamper) and kept as
// the memo as a Fill's would be.
func (r run) fillSamplesAs(ctx context.Context, v *layout.View, ks []int64, outs [][]byte, writeOnly bool) error {
	per := prod(v.SampleShape[1:]) * int64(v.DType.Size)
	memo, keep := v.Static(r.pin)
	own := map[int][]byte{}
	// Scratch for channels that need a cast.
	var scratchLen int64
	for _, ch := range v.Channels {
		if !zarr.SameValues(ch.Array.DType, v.DType) {
			scratchLen += prod(v.SampleShape[1:]) * int64(ch.Array.DType.Size) * int64(len(ks))
		}
	}
	var scratch []byte
	if scratchLen > 0 {
		scratch = r.scratch(scratchLen)
		defer r.freeScratch(scratch)
	}
	type castJob struct {
		dst, src []byte
		from     zarr.DType
	}
	type copyJob struct{ dst, src []byte }
	var reqs []zarr.Request
	var casts []castJob
	var copies []copyJob
	var off int64
	for si, k := range ks {
		t := v.Start + k*v.Step
		for c := range v.Channels {
			ch := &v.Channels[c]
			dst := outs[si][int64(c)*per : int64(c+1)*per]
			if ch.Axis < 0 {
				if m, ok := memo[c]; ok {
					copies = append(copies, copyJob{dst, m})
					continue
				}
				if writeOnly {
					if si == 0 {
						own[c] = make([]byte, per)
					}
					copies = append(copies, copyJob{dst, own[c]})
					if si > 0 {
						continue
					}
					dst = own[c]
				} else if si > 0 {
					copies = append(copies, copyJob{dst, outs[0][int64(c)*per : int64(c+1)*per]})
					continue
				}
			}
			start, count := ch.Region(t)
			q := zarr.Request{Array: ch.Array, Start: start, Count: count, Dst: dst}
			if !zarr.SameValues(ch.Array.DType, v.DType) {
				n := prod(count) * int64(ch.Array.DType.Size)
				q.Dst = scratch[off : off+n]
				off += n
				casts = append(casts, castJob{dst, q.Dst, ch.Array.DType})
			}
			reqs = append(reqs, q)
		}
	}
	if len(reqs) > 0 {
		if err := r.r.Read(ctx, r.pin, reqs); err != nil {
			return err
		}
	}
	for _, j := range casts {
		zarr.Cast(j.dst, v.DType, j.src, j.from)
	}
	for _, j := range copies {
		if writeOnly && r.stamp != nil && r.stamp.Stamp(j.dst, j.src) {
			continue
		}
		copy(j.dst, j.src)
	}
	switch {
	case keep != nil && writeOnly:
		keep(own) // copied into the samples above, never written again
	case keep != nil:
		m := map[int][]byte{}
		for c, ch := range v.Channels {
			if ch.Axis < 0 {
				m[c] = append([]byte(nil), outs[0][int64(c)*per:int64(c+1)*per]...)
			}
		}
		keep(m)
	}
	return nil
}

// DefaultBatchBytes bounds the sample data FillInto reads in one run when
// given no bound.
const DefaultBatchBytes = 1 << 30

// slotRun is a run of channels that are adjacent slots of a sample and
// select consecutive indices, in order, along one dimension of one array
// in its own dtype: one region of the array lands in them as it is laid
// out (the levels of a pressure-level variable). Every other channel is a
// run of its own.
type slotRun struct {
	first, n int // channel indices [first, first+n)
	axis     int // the dimension the indices run along; -1: n is 1
}

// slotRuns splits the view's channels into slot runs, in order.
func slotRuns(v *layout.View) []slotRun {
	var runs []slotRun
	for i := 0; i < len(v.Channels); {
		ch := &v.Channels[i]
		if len(ch.Select) != 1 || !zarr.SameValues(ch.Array.DType, v.DType) {
			runs = append(runs, slotRun{first: i, n: 1, axis: -1})
			i++
			continue
		}
		j := i + 1
		for j < len(v.Channels) {
			nx := &v.Channels[j]
			if nx.Array != ch.Array || nx.Axis != ch.Axis || len(nx.Select) != 1 || nx.Select[0].Axis != ch.Select[0].Axis ||
				nx.Select[0].Index != ch.Select[0].Index+int64(j-i) {
				break
			}
			j++
		}
		runs = append(runs, slotRun{first: i, n: j - i, axis: ch.Select[0].Axis})
		i = j
	}
	return runs
}
