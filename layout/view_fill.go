package layout

// A view's sample files and their fills: one Read for the channels of a
// run of samples, written at the blob's aligned data offset.

import (
	"context"
	"fmt"
	"io"

	"github.com/zarrfs/zarrfs/zarr"
)

// viewSet is the sample files of a view, made on demand like an array's.
type viewSet struct {
	v      *View
	opts   Options
	header []byte
	width  int
	size   int64
}

func (s *viewSet) len() int64 { return s.v.N }

func (s *viewSet) index(name string) (int64, bool) { return parseSampleName(name, s.width, s.v.N) }

func (s *viewSet) entry(k int64) Entry {
	name := sampleFileName(k, s.width)
	return Entry{Name: name, Kind: KindBlob, Blob: &viewBlob{
		v: s.v, opts: s.opts, k: k, path: s.v.Name + "/" + name, header: s.header, size: s.size,
	}}
}

// viewBlob is sample K of a view.
type viewBlob struct {
	v      *View
	opts   Options
	k      int64
	path   string
	header []byte
	size   int64
}

var _ Blob = (*viewBlob)(nil)

func (b *viewBlob) Path() string   { return b.path }
func (b *viewBlob) Size() int64    { return b.size }
func (b *viewBlob) Header() []byte { return b.header }

// Inputs is the view's definition, Align and the sample's index.
func (b *viewBlob) Inputs() string {
	return fmt.Sprintf("view\x00%s\x00align=%d\x00k=%d", b.v.def, b.opts.Align, b.k)
}

// Sources lists one region per channel, static channels included.
func (b *viewBlob) Sources() []zarr.Request {
	t := b.v.Start + b.k*b.v.Step
	out := make([]zarr.Request, len(b.v.Channels))
	for i := range b.v.Channels {
		ch := &b.v.Channels[i]
		start, count := ch.region(t)
		out[i] = zarr.Request{Array: ch.Array, Start: start, Count: count}
	}
	return out
}

// Fill reads every channel of the sample in one Read, so each source chunk
// is decoded once however many channels come from it, casts, and writes the
// header and the (C, *spatial) data. It holds the whole sample in memory.
// A sample whose one Read would not fit the memory budget (one of millions
// of tiny chunks, or of channels each larger than the budget) is filled
// channel by channel instead (fillByChannel).
func (b *viewBlob) Fill(ctx context.Context, w io.WriterAt) error {
	cost := b.v.fillCost(b.size-b.opts.Align, []int64{b.k})
	if !b.opts.MemoryBudget.Fits(cost) {
		return b.fillByChannel(ctx, w)
	}
	release, err := b.opts.acquire(ctx, cost, "sample of view "+b.v.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", b.path, err)
	}
	defer release()
	out := b.opts.slab(b.size - b.opts.Align)
	defer b.opts.freeSlab(out)
	if err := b.v.fillSamples(ctx, b.opts.Reader, []int64{b.k}, [][]byte{out}); err != nil {
		return fmt.Errorf("%s: %w", b.path, err)
	}
	return writeBlob(w, b.path, b.header, out, b.opts.Align)
}

// fillByChannel writes the header and each channel's region in pieces cut
// at chunk boundaries, as an array's sample is filled (readRegion), cast
// piece by piece: it holds a piece at a time, not the sample. A chunk that
// several channels read (levels of one chunk) is decoded once for each.
func (b *viewBlob) fillByChannel(ctx context.Context, w io.WriterAt) error {
	if _, err := w.WriteAt(b.header, 0); err != nil {
		return fmt.Errorf("%s: write header: %w", b.path, err)
	}
	per := prod(b.v.SampleShape[1:]) * int64(b.v.DType.Size)
	t := b.v.Start + b.k*b.v.Step
	for c := range b.v.Channels {
		ch := &b.v.Channels[c]
		start, count := ch.region(t)
		if err := b.opts.readRegionAs(ctx, w, b.opts.Align+int64(c)*per, ch.Array, start, count, b.v.DType); err != nil {
			return fmt.Errorf("%s: channel %s: %w", b.path, ch.Var, err)
		}
	}
	return nil
}

func writeBlob(w io.WriterAt, p string, header, data []byte, align int64) error {
	if _, err := w.WriteAt(header, 0); err != nil {
		return fmt.Errorf("%s: write header: %w", p, err)
	}
	if _, err := w.WriteAt(data, align); err != nil {
		return fmt.Errorf("%s: write: %w", p, err)
	}
	return nil
}

// fillCost bounds the memory that filling samples ks (data bytes each) in
// one fillSamples holds: the samples, the cast scratch, and what the Read
// of every channel's region holds (chunks shared by the samples counted
// once per sample at most).
func (v *View) fillCost(data int64, ks []int64) int64 {
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
	for _, g := range v.slotRuns() {
		ch := &v.Channels[g.first]
		if !zarr.SameValues(ch.Array.DType, v.DType) {
			cost = satAdd(cost, satMul(satMul(spatial, int64(ch.Array.DType.Size)), n))
		}
		start, count := ch.region(v.Start + lo*v.Step)
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
func (v *View) fillSamples(ctx context.Context, r Reader, ks []int64, outs [][]byte) error {
	return v.fillSamplesAs(ctx, r, ks, outs, false)
}

// fillSamplesAs is fillSamples; writeOnly says that outs may not hold
// what the Read decoded into them (a decoder that writes a chunk landing
// whole in outs elsewhere: FillInto's), so nothing is read back from
// them: a static channel is copied from the memo or read for every sample,
// and no memo is made from outs.
func (v *View) fillSamplesAs(ctx context.Context, r Reader, ks []int64, outs [][]byte, writeOnly bool) error {
	per := prod(v.SampleShape[1:]) * int64(v.DType.Size)
	v.mu.Lock()
	memo := v.static.current(ctx, v)
	v.mu.Unlock()
	// The listings and versions the static channels are read under, taken
	// before the Read: a memo made from them is stale once any is replaced.
	var listings map[int]*zarr.Listing
	var sums map[int]uint64
	if v.memoStatic && memo == nil && !writeOnly {
		listings, sums = v.staticKey(ctx)
	}
	// Scratch for channels that need a cast.
	var scratchLen int64
	for _, ch := range v.Channels {
		if !zarr.SameValues(ch.Array.DType, v.DType) {
			scratchLen += prod(v.SampleShape[1:]) * int64(ch.Array.DType.Size) * int64(len(ks))
		}
	}
	var scratch []byte
	if scratchLen > 0 {
		scratch = getSlab(scratchLen)
		defer putSlab(scratch)
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
				if si > 0 && !writeOnly {
					copies = append(copies, copyJob{dst, outs[0][int64(c)*per : int64(c+1)*per]})
					continue
				}
			}
			start, count := ch.region(t)
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
		if err := r.Read(ctx, reqs); err != nil {
			return err
		}
	}
	for _, j := range casts {
		zarr.Cast(j.dst, v.DType, j.src, j.from)
	}
	for _, j := range copies {
		copy(j.dst, j.src)
	}
	if v.memoStatic && memo == nil && !writeOnly {
		m := map[int][]byte{}
		for c, ch := range v.Channels {
			if ch.Axis < 0 {
				m[c] = append([]byte(nil), outs[0][int64(c)*per:int64(c+1)*per]...)
			}
		}
		v.mu.Lock()
		if v.static.current(ctx, v) == nil {
			v.static = &staticMemo{listings: listings, sums: sums, data: m}
		}
		v.mu.Unlock()
	}
	return nil
}

// DefaultBatchBytes bounds the sample data FillBatch holds at once when
// given no bound.
const DefaultBatchBytes = 1 << 30

// FillBatch fills blobs[i] into ws[i], as Fill would. Runs of consecutive
// samples of one view are read together, one Read per run of at most
// maxBytes of sample data (zero means DefaultBatchBytes), so every source
// chunk the run shares (a chunk of 10 time steps) is decoded once even when
// the decoded-chunk cache cannot hold it between fills. Other blobs are
// filled one by one. It stops at the first error.
func FillBatch(ctx context.Context, blobs []Blob, ws []io.WriterAt, maxBytes int64) error {
	if len(blobs) != len(ws) {
		return fmt.Errorf("layout: FillBatch with %d blobs and %d writers", len(blobs), len(ws))
	}
	if maxBytes <= 0 {
		maxBytes = DefaultBatchBytes
	}
	for i := 0; i < len(blobs); {
		vb, ok := blobs[i].(*viewBlob)
		if !ok {
			if err := blobs[i].Fill(ctx, ws[i]); err != nil {
				return err
			}
			i++
			continue
		}
		data := vb.size - vb.opts.Align
		ks := []int64{vb.k}
		j := i + 1
		for j < len(blobs) && int64(j-i+1)*data <= maxBytes {
			nb, ok := blobs[j].(*viewBlob)
			if !ok || nb.v != vb.v || nb.opts.Reader != vb.opts.Reader || nb.opts.Align != vb.opts.Align {
				break
			}
			if !vb.opts.MemoryBudget.Fits(2 * vb.v.fillCost(data, append(ks, nb.k))) {
				break // a run takes half the memory budget at most
			}
			ks = append(ks, nb.k)
			j++
		}
		if err := fillViewRun(ctx, blobs[i:j], ws[i:j], data); err != nil {
			return err
		}
		i = j
	}
	return nil
}

func fillViewRun(ctx context.Context, blobs []Blob, ws []io.WriterAt, data int64) error {
	first := blobs[0].(*viewBlob)
	opts := first.opts
	ks := make([]int64, len(blobs))
	for i, b := range blobs {
		ks[i] = b.(*viewBlob).k
	}
	release, err := opts.acquire(ctx, first.v.fillCost(data, ks), "samples of view "+first.v.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", first.path, err)
	}
	defer release()
	buf := opts.slab(data * int64(len(blobs)))
	defer opts.freeSlab(buf)
	outs := make([][]byte, len(blobs))
	for i := range blobs {
		outs[i] = buf[int64(i)*data : int64(i+1)*data]
	}
	if err := first.v.fillSamples(ctx, first.opts.Reader, ks, outs); err != nil {
		return fmt.Errorf("%s..%s: %w", first.path, blobs[len(blobs)-1].Path(), err)
	}
	for i, b := range blobs {
		vb := b.(*viewBlob)
		if err := writeBlob(ws[i], vb.path, vb.header, outs[i], vb.opts.Align); err != nil {
			return err
		}
	}
	return nil
}

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
func (v *View) slotRuns() []slotRun {
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
