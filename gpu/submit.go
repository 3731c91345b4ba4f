package gpu

import (
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
)

// This file starts a round on the device: the buffers reserved, the
// compressed pieces packed, the copies and kernels queued on the round's
// stream (finish, in decoder.go, waits for them).

// inflight is a submitted round whose device work may still run.
type inflight struct {
	set       *bufSet
	l         *layout
	idx       []int
	directOut []bool // per job: its bytes went straight to its Dst
	launchErr map[int]error
	t0        time.Time
	tPack     time.Duration
}

// prepareRound lays the jobs of one round out and grows set's buffers to
// hold them; it reads the jobs' lengths and addresses only.
func (d *Decoder) prepareRound(jobs []codec.Job, preps []prepared, dev [][]devRun, set *bufSet) (*inflight, error) {
	t0 := time.Now()
	idx := make([]int, len(jobs))
	for i := range idx {
		idx[i] = i
	}
	l := layoutBatch(jobs, preps, idx, d.outAligns, d.inAligns, !d.noFence, func(k int) bool { return d.pinned(jobs[idx[k]].Src) })
	// Jobs whose Dst is pinned get their bytes straight from the device
	// (finishDirect).
	directOut := make([]bool, len(idx))
	for k, ji := range idx {
		// Jobs bound for device memory come back to no host memory.
		directOut[k] = d.pinned(jobs[ji].Dst) || (dev != nil && len(dev[ji]) > 0)
	}
	l.stageFrom(directOut)
	if err := d.reserve(set, l); err != nil {
		return nil, err
	}
	return &inflight{set: set, l: l, idx: idx, directOut: directOut, t0: t0}, nil
}

// startRound enqueues the device work of a prepared and packed round: one
// host-to-device copy, one nvCOMP call per algorithm, the kernels, one
// device-to-host copy into staging, between two events.
func (d *Decoder) startRound(fl *inflight, elemSize int) error {
	set, l := fl.set, fl.l
	if err := d.upload(set, l); err != nil {
		return err
	}
	launchErr, err := d.decodeOnDevice(set, l, elemSize)
	if err != nil {
		return err
	}
	if err := d.download(set, l, fl.directOut); err != nil {
		return err
	}
	fl.launchErr = launchErr
	fl.tPack = time.Since(fl.t0)
	return nil
}

// reserve grows the set's buffers to what the round's layout needs,
// nvCOMP's scratch included, within the memory budgets.
func (d *Decoder) reserve(set *bufSet, l *layout) error {
	var tempNeed int64
	for a := range numAlgos {
		if len(l.segs[a]) == 0 {
			continue
		}
		alg := &d.nv.algos[a]
		var tb uint64
		if st := alg.getTmp(uint64(len(l.segs[a])), uint64(l.maxPiece[a]), alg.opts, &tb, uint64(l.totPiece[a]), set.stream); st != nvSuccess {
			return fmt.Errorf("gpu: nvcompBatched%sDecompressGetTempSize: %v", algoSymbols[a], st)
		}
		tempNeed = max(tempNeed, int64(tb))
	}
	for _, g := range []error{
		d.growHost(&set.hIn, l.inSize),
		d.growDev(&set.dIn, l.devIn),
		d.growDev(&set.dOut, l.outSize),
		d.growHost(&set.hOut, l.d2h-l.hostLo),
		d.growDev(&set.dTemp, max(tempNeed, 1)),
	} {
		if g != nil {
			return g
		}
	}
	return nil
}

// pack copies the compressed pieces that are not in pinned memory into
// the staging buffer, in parallel (the host's main cost for a round), and
// writes the descriptor arrays nvCOMP and the kernels read.
func (d *Decoder) pack(set *bufSet, l *layout, jobs []codec.Job) {
	hin := set.hIn.bytes()
	inBase, outBase := uint64(set.dIn.ptr), uint64(set.dOut.ptr)
	type cp struct {
		dst []byte
		src []byte
		job int
	}
	var packs []cp
	for a := range numAlgos {
		for _, s := range l.segs[a] {
			if !s.direct {
				packs = append(packs, cp{hin[s.inOff : s.inOff+int64(len(s.src))], s.src, s.job})
			}
		}
	}
	for _, s := range l.raws {
		if !s.direct {
			packs = append(packs, cp{hin[s.inOff : s.inOff+int64(len(s.src))], s.src, s.job})
		}
	}
	d.parallel(len(packs), func(i int) {
		t0 := time.Now()
		copy(packs[i].dst, packs[i].src)
		d.costs.host(jobs[l.jobs[packs[i].job]].Codec, time.Since(t0))
	})

	le := binary.LittleEndian
	for a := range numAlgos {
		segs := l.segs[a]
		n := int64(len(segs))
		o := l.arrOff[a]
		for i, s := range segs {
			le.PutUint64(hin[o+8*int64(i):], inBase+uint64(s.inOff))
			le.PutUint64(hin[o+8*(n+int64(i)):], uint64(len(s.src)))
			le.PutUint64(hin[o+8*(2*n+int64(i)):], uint64(s.n))
			le.PutUint64(hin[o+8*(3*n+int64(i)):], outBase+uint64(s.outOff))
		}
	}
	for i, c := range l.copies {
		src := outBase + uint64(c.src)
		if c.fromInput {
			src = inBase + uint64(c.src)
		}
		o := l.copyOff + int64(i*copyDescSize)
		le.PutUint64(hin[o:], src)
		le.PutUint64(hin[o+8:], outBase+uint64(c.dst))
		le.PutUint64(hin[o+16:], uint64(c.n))
	}
	for i, c := range l.precopies {
		o := l.preOff + int64(i*copyDescSize)
		le.PutUint64(hin[o:], inBase+uint64(c.src))
		le.PutUint64(hin[o+8:], inBase+uint64(c.dst))
		le.PutUint64(hin[o+16:], uint64(c.n))
	}
	l.hashDescs(hin, outBase)
	for i, s := range l.shuffles {
		o := l.shufOff + int64(i*shuffleDescSize)
		le.PutUint64(hin[o:], outBase+s.Src)
		le.PutUint64(hin[o+8:], outBase+s.Dst)
		le.PutUint64(hin[o+16:], s.NBytes)
		le.PutUint32(hin[o+24:], s.BlockSize)
		le.PutUint32(hin[o+28:], s.TypeSize)
		le.PutUint32(hin[o+32:], s.Mode)
		le.PutUint32(hin[o+36:], s.BitRound)
	}
}

// upload queues the round's input on its stream: the staging buffer, the
// pieces straight from pinned callers' memory, the moves of misaligned
// pieces, and the fence pattern around deflate outputs.
func (d *Decoder) upload(set *bufSet, l *layout) error {
	cu := d.cu
	inBase := uint64(set.dIn.ptr)
	if err := cu.check("cuEventRecord", cu.cuEventRecord(set.start, set.stream)); err != nil {
		return d.deviceFailed(err)
	}
	if err := cu.check("cuMemcpyHtoDAsync", cu.cuMemcpyHtoDAsync(set.dIn.ptr, set.hIn.p, uint64(l.inSize), set.stream)); err != nil {
		return d.deviceFailed(err)
	}
	for _, di := range l.direct {
		if err := cu.check("cuMemcpyHtoDAsync", cu.cuMemcpyHtoDAsync(set.dIn.ptr+uintptr(di.off), unsafe.Pointer(&di.src[0]), uint64(len(di.src)), set.stream)); err != nil {
			return d.deviceFailed(err)
		}
	}
	if len(l.precopies) > 0 {
		if err := d.launch(set, "scatter_copy", d.fnCopy, uint32(min(len(l.precopies), 65535)), 1, 256,
			u64(inBase+uint64(l.preOff)), u32(uint32(len(l.precopies)))); err != nil {
			return d.deviceFailed(err)
		}
	}
	if l.fenceEnd > l.fenceOff {
		if err := cu.check("cuMemsetD32Async", cu.cuMemsetD32Async(set.dOut.ptr+uintptr(l.fenceOff), fencePattern,
			uint64(l.fenceEnd-l.fenceOff)/4, set.stream)); err != nil {
			return d.deviceFailed(err)
		}
	}
	return d.mark(set, 0)
}

// mark records the i-th stage event of the round.
func (d *Decoder) mark(set *bufSet, i int) error {
	if err := d.cu.check("cuEventRecord", d.cu.cuEventRecord(set.marks[i], set.stream)); err != nil {
		return d.deviceFailed(err)
	}
	return nil
}

// decodeOnDevice queues one nvCOMP call per algorithm present (a launch
// failure fails that algorithm's jobs only, in launchErr), then the copy,
// unshuffle and byte-swap kernels.
func (d *Decoder) decodeOnDevice(set *bufSet, l *layout, elemSize int) (launchErr map[int]error, err error) {
	inBase, outBase := uint64(set.dIn.ptr), uint64(set.dOut.ptr)
	launchErr = make(map[int]error)
	var segBase int64
	for a := range numAlgos {
		segs := l.segs[a]
		if len(segs) == 0 {
			continue
		}
		alg := &d.nv.algos[a]
		n := int64(len(segs))
		arr := inBase + uint64(l.arrOff[a])
		if a == algoLZ4 && (d.walksLZ4() || l.walk) {
			// Before nvCOMP reads them: a block the walk rejects is swapped
			// for an empty one in nvCOMP's arrays.
			if err := d.launch(set, "lz4_check", d.fnLZ4Check, uint32(min((n+63)/64, 65535)), 1, 64,
				u64(arr), u32(uint32(n)), u64(outBase+uint64(l.walkOff))); err != nil {
				return nil, d.deviceFailed(err)
			}
		}
		st := alg.decomp(uintptr(arr), uintptr(arr+uint64(8*n)), uintptr(arr+uint64(16*n)),
			uintptr(outBase+uint64(l.actualOff+8*segBase)), uint64(n),
			set.dTemp.ptr, uint64(set.dTemp.size),
			uintptr(arr+uint64(24*n)), alg.opts,
			uintptr(outBase+uint64(l.statusOff+4*segBase)), set.stream)
		if st != nvSuccess {
			err := fmt.Errorf("gpu: nvcompBatched%sDecompressAsync: %v", algoSymbols[a], st)
			for _, s := range segs {
				launchErr[s.job] = err
			}
		}
		segBase += n
	}
	if err := d.mark(set, 1); err != nil {
		return nil, err
	}
	if len(l.hashes) > 0 {
		// Before the copies and the byte swap: the checksum covers the
		// frame's bytes as nvCOMP wrote them. Four threads a frame.
		if err := d.launch(set, "xxh64_check", d.fnXXH64, uint32((len(l.hashes)+31)/32), 1, 128,
			u64(inBase+uint64(l.hashDesc)), u32(uint32(len(l.hashes))), u64(outBase+uint64(l.hashOff))); err != nil {
			return nil, d.deviceFailed(err)
		}
	}
	if len(l.copies) > 0 {
		if err := d.launch(set, "scatter_copy", d.fnCopy, uint32(min(len(l.copies), 65535)), 1, 256,
			u64(inBase+uint64(l.copyOff)), u32(uint32(len(l.copies)))); err != nil {
			return nil, d.deviceFailed(err)
		}
	}
	if len(l.shuffles) > 0 {
		var most uint64
		for _, s := range l.shuffles {
			most = max(most, s.NBytes)
		}
		gx := uint32(min((most/uint64(8)+255)/256+1, 2048))
		if err := d.launch(set, "unshuffle", d.fnUnshuffle, gx, uint32(len(l.shuffles)), 256, u64(inBase+uint64(l.shufOff))); err != nil {
			return nil, d.deviceFailed(err)
		}
	}
	if elemSize > 1 && l.finalEnd > 0 {
		nelem := uint64(l.finalEnd) / uint64(elemSize)
		gx := uint32(min((nelem+255)/256, 8192))
		if err := d.launch(set, "byteswap", d.fnSwap, gx, 1, 256, u64(outBase), u64(nelem), u32(uint32(elemSize))); err != nil {
			return nil, d.deviceFailed(err)
		}
	}
	return launchErr, d.mark(set, 2)
}

// download queues the way back to the host: everything but the pinned
// Dst of jobs decoded straight there, in runs into the staging buffer
// (chunks, pre-unshuffle bytes the host checks, sizes, statuses and
// probes); and the round's end event. The pinned Dst follow once the
// round is seen to be done (finishDirect): a device that never finishes
// then never writes a caller's memory.
func (d *Decoder) download(set *bufSet, l *layout, directOut []bool) error {
	cu := d.cu
	// d2h copies the output buffer's bytes [from, to) into the staging,
	// which holds them from hostLo on.
	d2h := func(from, to int64) error {
		from = max(from, l.hostLo)
		if to <= from {
			return nil
		}
		dst := unsafe.Add(set.hOut.p, from-l.hostLo)
		if err := cu.check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(dst, set.dOut.ptr+uintptr(from), uint64(to-from), set.stream)); err != nil {
			return d.deviceFailed(err)
		}
		return nil
	}
	run := int64(0) // start of the staged run not yet copied
	for k := range l.jobs {
		if !directOut[k] {
			continue
		}
		if err := d2h(run, l.finalOff[k]); err != nil {
			return err
		}
		run = l.finalOff[k] + l.finalLen[k]
	}
	if err := d2h(run, l.d2h); err != nil {
		return err
	}
	if err := cu.check("cuEventRecord", cu.cuEventRecord(set.end, set.stream)); err != nil {
		return d.deviceFailed(err)
	}
	return nil
}
