package gpu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/codec"
)

// These tests run the CPU half of the GPU path for real (framing, layout)
// and emulate the device half on the CPU: nvCOMP by the Go decoders of the
// same formats, and the kernels by line-for-line Go ports. They check the
// offsets, alignment handling and shuffle arithmetic on any machine; the GPU
// tests then check that the device does what the emulation does.

// emuUnshuffle is the unshuffle kernel of kernels.cu for one descriptor, its
// work units visited in order instead of by threads.
func emuUnshuffle(buf []byte, d shuffleDesc) {
	if d.NBytes == 0 || d.BlockSize == 0 || d.TypeSize == 0 {
		return
	}
	geom := func(b uint64) (start, bsize, n, units uint64) {
		start = b * uint64(d.BlockSize)
		rest := d.NBytes - start
		bsize = min(rest, uint64(d.BlockSize))
		n = bsize / uint64(d.TypeSize)
		var tunits uint64
		if d.Mode == modeByteShuffle {
			tunits = n
		} else {
			if d.BitRound != 0 {
				n -= n % 8
			} else if n%8 != 0 {
				n = 0
			}
			tunits = (n / 8) * uint64(d.TypeSize)
		}
		return start, bsize, n, tunits + (bsize - n*uint64(d.TypeSize))
	}
	nblocks := (d.NBytes + uint64(d.BlockSize) - 1) / uint64(d.BlockSize)
	_, fbsize, fn, funits := geom(0)
	lstart, lbsize, ln, lunits := geom(nblocks - 1)
	total := (nblocks-1)*funits + lunits
	src, dst := buf[d.Src:], buf[d.Dst:]
	T := uint64(d.TypeSize)
	for u := uint64(0); u < total; u++ {
		var r, start, bsize, n, units uint64
		if u < (nblocks-1)*funits {
			b := u / funits
			r = u - b*funits
			start, bsize, n, units = b*uint64(d.BlockSize), fbsize, fn, funits
		} else {
			r = u - (nblocks-1)*funits
			start, bsize, n, units = lstart, lbsize, ln, lunits
		}
		tunits := units - (bsize - n*T)
		s, o := src[start:], dst[start:]
		if r >= tunits {
			off := n*T + (r - tunits)
			o[off] = s[off]
			continue
		}
		if d.Mode == modeByteShuffle {
			for j := uint64(0); j < T; j++ {
				o[r*T+j] = s[j*n+r]
			}
			continue
		}
		rowbytes := n / 8
		j := r / rowbytes
		g := r - j*rowbytes
		var rows uint64
		for k := uint64(0); k < 8; k++ {
			rows |= uint64(s[(j*8+k)*rowbytes+g]) << (8 * k)
		}
		for e := uint64(0); e < 8; e++ {
			var v uint32
			for k := uint64(0); k < 8; k++ {
				v |= uint32((rows>>(8*k+e))&1) << k
			}
			o[(g*8+e)*T+j] = byte(v)
		}
	}
}

// emulate runs a batch through layoutBatch and the emulated device: it
// returns each job's decoded bytes or error, as round would.
//
// With direct, every other job's Src is taken for pinned memory, as a
// Decoder does for memory from HostAlloc: moved first to an odd address,
// so that its pieces need the device-side copies into aligned slots.
func emulate(jobs []codec.Job, aligns [numAlgos]int64, swap int, direct bool) ([][]byte, []error) {
	return emulateOverrun(jobs, aligns, swap, direct, nil)
}

// emulateOverrun is emulate with a misbehaving deflate decoder: overrun,
// when set, may write to the bytes after each deflate segment's slot.
func emulateOverrun(jobs []codec.Job, aligns [numAlgos]int64, swap int, direct bool, overrun func(after []byte, s segRef)) ([][]byte, []error) {
	outs, _, errs := emulateRound(jobs, aligns, swap, direct, overrun)
	return outs, errs
}

// emulateRound is emulateOverrun that also returns, per job, the bytes a
// round brings back from before unshuffling (layout.preAt), as collect
// does, after the checks the host makes of them (verifyDecoded).
func emulateRound(jobs []codec.Job, aligns [numAlgos]int64, swap int, direct bool, overrun func(after []byte, s segRef)) ([][]byte, [][]byte, []error) {
	var pinnedSrc func(k int) bool
	if direct {
		jobs = slices.Clone(jobs)
		for i := range jobs {
			if i%2 == 0 {
				buf := make([]byte, len(jobs[i].Src)+8)
				jobs[i].Src = buf[1+i%7 : 1+i%7+copy(buf[1+i%7:], jobs[i].Src)]
			}
		}
		pinnedSrc = func(k int) bool { return true }
	}
	preps := make([]prepared, len(jobs))
	errs := make([]error, len(jobs))
	outs := make([][]byte, len(jobs))
	pres := make([][]byte, len(jobs))
	var idx []int
	for i := range jobs {
		preps[i] = prepare(&jobs[i])
		if preps[i].err != nil {
			errs[i] = preps[i].err
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return outs, pres, errs
	}
	if pinnedSrc != nil {
		pinnedSrc = func(k int) bool { return idx[k]%2 == 0 }
	}
	// Input alignments as nvCOMP's (at most 8); the coarse output
	// alignments would not be met by packed inputs, which are 16-aligned.
	var inAligns [numAlgos]int64
	for a := range inAligns {
		inAligns[a] = min(aligns[a], inAlign)
	}
	l := layoutBatch(jobs, preps, idx, aligns, inAligns, true, pinnedSrc)
	if !direct && len(l.direct)+len(l.precopies) > 0 || l.devIn < l.inSize {
		panic("direct inputs laid out for a batch without pinned memory")
	}
	in := make([]byte, l.devIn)
	// The device's input: the packed bytes, each direct job's Src, then
	// the copies of misaligned direct pieces.
	for a := range numAlgos {
		for _, s := range l.segs[a] {
			if !s.direct {
				copy(in[s.inOff:], s.src)
			}
		}
	}
	for _, s := range l.raws {
		if !s.direct {
			copy(in[s.inOff:], s.src)
		}
	}
	for _, di := range l.direct {
		if di.off < l.inSize || (int64(addrOf(di.src))-di.off)%256 != 0 {
			panic(fmt.Sprintf("direct input at %d: inside the packed bytes, or not congruent to its host address", di.off))
		}
		copy(in[di.off:], di.src)
	}
	for _, c := range l.precopies {
		copy(in[c.dst:c.dst+c.n], in[c.src:c.src+c.n])
	}
	out := make([]byte, l.outSize)
	for i := range out {
		out[i] = 0xA5 // garbage, as fresh device memory may hold
	}
	for i := l.fenceOff; i < l.fenceEnd; i += 4 {
		binary.LittleEndian.PutUint32(out[i:], fencePattern)
	}
	for a := range numAlgos {
		for _, s := range l.segs[a] {
			if s.outOff%aligns[a] != 0 {
				panic(fmt.Sprintf("misaligned nvCOMP output at %d for algo %d", s.outOff, a))
			}
			if s.inOff%inAligns[a] != 0 && (!s.direct || (int64(addrOf(s.src))-s.inOff)%256 != 0) {
				panic(fmt.Sprintf("misaligned nvCOMP input at %d for algo %d", s.inOff, a))
			}
			src := in[s.inOff : s.inOff+int64(len(s.src))]
			if !bytes.Equal(src, s.src) {
				panic(fmt.Sprintf("nvCOMP input at %d for algo %d is not the piece's bytes", s.inOff, a))
			}
			// As finish does: a stream that passed the host checks and that
			// the device fails goes to the CPU, which decides.
			if err := cpuAlgo(a, out[s.outOff:s.outOff+s.n], src); err != nil && errs[idx[s.job]] == nil {
				errs[idx[s.job]] = fmt.Errorf("%v: %w", err, codec.ErrUnsupported)
			}
			if a == algoDeflate && overrun != nil {
				overrun(out[s.outOff+s.n:], s)
			}
		}
	}
	for _, c := range l.copies {
		from := out
		if c.fromInput {
			from = in
		}
		copy(out[c.dst:c.dst+c.n], from[c.src:c.src+c.n])
	}
	for _, s := range l.shuffles {
		emuUnshuffle(out, s)
	}
	if len(l.probes) > 0 {
		fe, escaped := l.fenceCheck(out)
		if escaped {
			for _, ji := range idx {
				errs[ji] = fmt.Errorf("escaped: %w", codec.ErrUnsupported)
			}
		}
		for k, err := range fe {
			if !escaped {
				errs[idx[k]] = err
			}
		}
	}
	if swap > 1 {
		for i := 0; i+swap <= int(l.finalEnd); i += swap {
			e := out[i : i+swap]
			for a, z := 0, swap-1; a < z; a, z = a+1, z-1 {
				e[a], e[z] = e[z], e[a]
			}
		}
	}
	for k, ji := range idx {
		if errs[ji] != nil {
			continue
		}
		n := int64(len(jobs[ji].Dst))
		b := out[l.finalOff[k] : l.finalOff[k]+n]
		if at := l.preAt[k]; at >= 0 {
			if at < l.finalEnd || at+n > l.actualOff {
				panic(fmt.Sprintf("pre-unshuffle bytes at %d, outside the region copied back", at))
			}
			pres[ji] = out[at : at+n]
		}
		if err := preps[ji].verifyDecoded(b, pres[ji], swap); err != nil {
			errs[ji] = err
			continue
		}
		outs[ji] = b
	}
	return outs, pres, errs
}

type emuCase struct {
	name   string
	aligns [numAlgos]int64
	direct bool
}

// emuCases are the alignment cases, each with packed and with direct
// (pinned) inputs.
func emuCases() []emuCase {
	var out []emuCase
	for _, ac := range alignCases {
		out = append(out, emuCase{ac.name, ac.aligns, false}, emuCase{ac.name + "-pinned", ac.aligns, true})
	}
	return out
}

var alignCases = []struct {
	name   string
	aligns [numAlgos]int64
}{
	{"nvcomp", [numAlgos]int64{8, 4, 4, 4}},
	{"coarse", [numAlgos]int64{4096, 4096, 4096, 4096}}, // forces the scratch-and-copy path
}

func TestEmulatedVectors(t *testing.T) {
	vecs, src, raw := loadVectors(t)
	var jobs []codec.Job
	for _, v := range vecs {
		jobs = append(jobs, codec.Job{Codec: codec.Name(v.Codec), Src: src[v.Name], Dst: make([]byte, len(raw[v.Name]))})
	}
	for _, ac := range emuCases() {
		t.Run(ac.name, func(t *testing.T) {
			outs, errs := emulate(jobs, ac.aligns, 0, ac.direct)
			var decoded, unsupported int
			for i, v := range vecs {
				err := errs[i]
				switch {
				case err == nil:
					if !bytes.Equal(outs[i], raw[v.Name]) {
						t.Errorf("%s: decoded bytes differ from numcodecs' input", v.Name)
					}
					decoded++
				case errors.Is(err, codec.ErrUnsupported):
					// blosclz, empty chunks, and gzip with two members are
					// left to the CPU; anything else must decode here.
					if !strings.Contains(v.Name, "blosclz") && !strings.Contains(v.Name, "two_members") && len(raw[v.Name]) != 0 {
						t.Errorf("%s: unexpectedly unsupported: %v", v.Name, err)
					}
					unsupported++
				default:
					t.Errorf("%s: %v", v.Name, err)
				}
			}
			t.Logf("%d vectors decoded, %d left to the CPU", decoded, unsupported)
			if decoded < len(vecs)/2 {
				t.Errorf("only %d of %d vectors decoded", decoded, len(vecs))
			}
		})
	}
}

// genJobs makes chunks of every codec and blosc variant the GPU path takes,
// with their expected decoded bytes.
func genJobs(t testing.TB, ny, nx int) (jobs []codec.Job, want [][]byte, names []string) {
	t.Helper()
	seed := uint64(1)
	add := func(name string, c codec.Name, data, enc []byte) {
		jobs = append(jobs, codec.Job{Codec: c, Src: enc, Dst: make([]byte, len(data))})
		want = append(want, data)
		names = append(names, name)
	}
	for _, c := range []codec.Name{codec.Zstd, codec.LZ4, codec.Gzip, codec.Zlib} {
		seed++
		d := field(ny, nx, seed)
		add(string(c), c, d, compress(c, d))
	}
	// zstd as numcodecs writes it by default: no content checksum.
	seed++
	d := field(ny, nx, seed)
	add("zstd-nocrc", codec.Zstd, d, zstdNoCRC(d))
	for _, comp := range []string{"lz4", "zstd", "zlib", "snappy"} {
		for _, sh := range []codec.BloscShuffle{codec.NoShuffle, codec.ByteShuffle, codec.BitShuffle} {
			for _, geo := range []struct{ ts, bs int }{{4, 1 << 16}, {8, 40000}, {2, 4100}, {3, 999}} {
				seed++
				d := field(ny, nx, seed)
				d = d[:len(d)-int(seed%5)] // ragged last block and element
				enc := bloscCompress(d, geo.ts, geo.bs, sh, comp)
				add(fmt.Sprintf("blosc-%s-%v-t%d-b%d", comp, sh, geo.ts, geo.bs), codec.Blosc, d, enc)
			}
		}
	}
	// Incompressible data: blosc stores every stream raw.
	r := make([]byte, 50000)
	for i := range r {
		r[i] = byte(i*7919 + i>>3*31)
	}
	add("blosc-raw", codec.Blosc, r, bloscCompress(r, 4, 8192, codec.ByteShuffle, "lz4"))
	return jobs, want, names
}

func TestEmulatedGenerated(t *testing.T) {
	jobs, want, names := genJobs(t, 37, 91)
	// The generator itself must agree with the CPU decoder.
	for i := range jobs {
		got := make([]byte, len(want[i]))
		if err := codec.Decode(jobs[i].Codec, got, jobs[i].Src); err != nil {
			if errors.Is(err, codec.ErrUnsupported) {
				continue // snappy: the CPU codec does not decode it
			}
			t.Fatalf("%s: CPU decode of the generated chunk: %v", names[i], err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Fatalf("%s: CPU decode differs from the input", names[i])
		}
	}
	for _, ac := range emuCases() {
		t.Run(ac.name, func(t *testing.T) {
			outs, errs := emulate(jobs, ac.aligns, 0, ac.direct)
			for i := range jobs {
				if errs[i] != nil {
					t.Errorf("%s: %v", names[i], errs[i])
				} else if !bytes.Equal(outs[i], want[i]) {
					t.Errorf("%s: decoded bytes differ", names[i])
				}
			}
		})
	}
}

func TestEmulatedSwap(t *testing.T) {
	d := field(10, 10, 3)
	jobs := []codec.Job{{Codec: codec.Zstd, Src: compress(codec.Zstd, d), Dst: make([]byte, len(d))}}
	outs, errs := emulate(jobs, alignCases[0].aligns, 4, true)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	for i := 0; i < len(d); i += 4 {
		if binary.BigEndian.Uint32(outs[0][i:]) != binary.LittleEndian.Uint32(d[i:]) {
			t.Fatalf("element %d not swapped", i/4)
		}
	}
}

func TestPrepareErrors(t *testing.T) {
	good := field(4, 4, 1)
	zfcs, _ := zstd.NewWriter(nil, zstd.WithSingleSegment(true))
	lz := compress(codec.LZ4, good)
	gz := compress(codec.Gzip, good)
	zl := compress(codec.Zlib, good)
	blosclz := bloscCompress(good, 4, 64, codec.ByteShuffle, "lz4")
	blosclz[2] &^= 0xe0 // inner codec 0: blosclz
	dict := bytes.Clone(zl)
	dict[1] = dict[1]&0xc0 | 0x20 // FDICT, FCHECK recomputed below
	dict[1] += byte((31 - (uint16(dict[0])<<8|uint16(dict[1]))%31) % 31)
	tests := []struct {
		name string
		job  codec.Job
		want error
	}{
		{"unknown codec", codec.Job{Codec: "bz2", Src: lz, Dst: make([]byte, 64)}, codec.ErrUnsupported},
		{"empty chunk", codec.Job{Codec: codec.Zstd, Src: compress(codec.Zstd, nil), Dst: nil}, codec.ErrUnsupported},
		{"zstd frame size mismatch", codec.Job{Codec: codec.Zstd, Src: zfcs.EncodeAll(good, nil), Dst: make([]byte, 65)}, codec.ErrCorrupt},
		{"zstd bad magic", codec.Job{Codec: codec.Zstd, Src: append([]byte{1, 2, 3, 4}, compress(codec.Zstd, good)[4:]...), Dst: make([]byte, 64)}, codec.ErrCorrupt},
		{"lz4 size header mismatch", codec.Job{Codec: codec.LZ4, Src: lz, Dst: make([]byte, 63)}, codec.ErrCorrupt},
		{"lz4 too short", codec.Job{Codec: codec.LZ4, Src: lz[:3], Dst: make([]byte, 64)}, codec.ErrCorrupt},
		{"gzip size trailer mismatch", codec.Job{Codec: codec.Gzip, Src: gz, Dst: make([]byte, 65)}, codec.ErrUnsupported},
		{"gzip bad magic", codec.Job{Codec: codec.Gzip, Src: append([]byte{0x1f, 0x8c}, gz[2:]...), Dst: make([]byte, 64)}, codec.ErrCorrupt},
		{"zlib bad header", codec.Job{Codec: codec.Zlib, Src: append([]byte{0x78, 0x00}, zl[2:]...), Dst: make([]byte, 64)}, codec.ErrCorrupt},
		{"zlib dictionary", codec.Job{Codec: codec.Zlib, Src: dict, Dst: make([]byte, 64)}, codec.ErrUnsupported},
		{"blosc blosclz", codec.Job{Codec: codec.Blosc, Src: blosclz, Dst: make([]byte, 64)}, codec.ErrUnsupported},
		{"blosc size mismatch", codec.Job{Codec: codec.Blosc, Src: bloscCompress(good, 4, 64, codec.ByteShuffle, "lz4"), Dst: make([]byte, 60)}, codec.ErrCorrupt},
		{"blosc truncated", codec.Job{Codec: codec.Blosc, Src: blosclz[:10], Dst: make([]byte, 64)}, codec.ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := prepare(&tt.job)
			if !errors.Is(p.err, tt.want) {
				t.Fatalf("prepare: %v, want %v", p.err, tt.want)
			}
		})
	}
}

func TestZstdFrames(t *testing.T) {
	a, b := field(3, 7, 1), field(5, 5, 2)
	skip := []byte{0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 9, 9, 9}
	enc, _ := zstd.NewWriter(nil, zstd.WithSingleSegment(true)) // writes the content size, as libzstd does
	src := append(append(enc.EncodeAll(a, nil), skip...), enc.EncodeAll(b, nil)...)
	job := codec.Job{Codec: codec.Zstd, Src: src, Dst: make([]byte, len(a)+len(b))}
	p := prepare(&job)
	if p.err != nil || len(p.pieces) != 2 || p.pieces[1].off != int64(len(a)) {
		t.Fatalf("two frames and a skippable one: %v %+v", p.err, p)
	}
	outs, errs := emulate([]codec.Job{job}, alignCases[0].aligns, 0, false)
	if errs[0] != nil || !bytes.Equal(outs[0], append(append([]byte{}, a...), b...)) {
		t.Fatalf("emulated decode: %v", errs[0])
	}
}

func TestGzipBodyHeaderFields(t *testing.T) {
	d := field(8, 8, 2)
	gz := compress(codec.Gzip, d) // has FNAME
	body, _, size, err := gzipBody(gz)
	if err != nil {
		t.Fatal(err)
	}
	if int(size) != len(d) {
		t.Fatalf("size %d, want %d", size, len(d))
	}
	out := make([]byte, len(d))
	if err := cpuAlgo(algoDeflate, out, body); err != nil || !bytes.Equal(out, d) {
		t.Fatalf("raw deflate body does not inflate to the input: %v", err)
	}
}

func TestLayoutBounds(t *testing.T) {
	jobs, _, _ := genJobs(t, 5, 300)
	preps := make([]prepared, len(jobs))
	var idx []int
	for i := range jobs {
		preps[i] = prepare(&jobs[i])
		if preps[i].err != nil {
			t.Fatal(preps[i].err)
		}
		idx = append(idx, i)
	}
	l := layoutBatch(jobs, preps, idx, alignCases[1].aligns, alignCases[0].aligns, true, func(k int) bool { return k%3 == 0 })
	if l.preOff < l.shufOff+int64(len(l.shuffles)*shuffleDescSize) {
		t.Errorf("shuffle descriptors run into the precopy descriptors")
	}
	if l.inSize < l.preOff+int64(len(l.precopies)*copyDescSize) {
		t.Errorf("precopy descriptors past the packed input")
	}
	if len(l.direct) == 0 || len(l.precopies) == 0 {
		t.Errorf("%d direct jobs, %d precopies: the pinned layout is not exercised", len(l.direct), len(l.precopies))
	}
	end := l.inSize
	for _, di := range l.direct {
		if di.off < end {
			t.Errorf("direct input at %d overlaps what comes before it (up to %d)", di.off, end)
		}
		end = di.off + int64(len(di.src))
	}
	for _, c := range l.precopies {
		if c.dst < end || c.dst%inAlign != 0 || c.dst+c.n > l.devIn {
			t.Errorf("precopy slot at %d misplaced (direct inputs end at %d, device input %d)", c.dst, end, l.devIn)
		}
	}
	if slots := len(l.raws) + l.nsegs + len(l.probes); len(l.copies) > slots {
		t.Errorf("%d copies overflow the %d descriptor slots", len(l.copies), slots)
	}
	if l.copyOff+int64(len(l.copies)*copyDescSize) > l.shufOff {
		t.Errorf("copy descriptors run into the shuffle descriptors")
	}
	for k, off := range l.finalOff {
		if off%outAlign != 0 || off+int64(len(jobs[idx[k]].Dst)) > l.finalEnd {
			t.Errorf("job %d: final slot %d misplaced", k, off)
		}
	}
	if l.d2h > l.outSize || l.probeOff+probeLen*int64(len(l.probes)) != l.d2h || l.statusOff+4*int64(l.nsegs) > l.probeOff {
		t.Errorf("statuses and probes not at the end of the copied-back region")
	}
	// Fenced deflate slots lie after every other output, each followed by
	// its guard, the tail guard last.
	if len(l.segs[algoDeflate]) == 0 || len(l.probes) != len(l.segs[algoDeflate])+1 {
		t.Fatalf("%d probes for %d deflate segments", len(l.probes), len(l.segs[algoDeflate]))
	}
	for a := range numAlgos {
		for _, s := range l.segs[a] {
			in := s.outOff >= l.fenceOff && s.outOff+s.n <= l.fenceEnd
			if in != (a == algoDeflate) {
				t.Errorf("algorithm %d: slot at %d, fence [%d, %d)", a, s.outOff, l.fenceOff, l.fenceEnd)
			}
		}
	}
	for i, pr := range l.probes {
		if pr.seg >= 0 {
			s := l.segs[algoDeflate][pr.seg]
			if pr.at < s.outOff+s.n || pr.at+fenceGuard > l.fenceEnd || (i+1 < len(l.probes) && l.probes[i+1].seg >= 0 && l.segs[algoDeflate][l.probes[i+1].seg].outOff < pr.at+fenceGuard) {
				t.Errorf("probe %d at %d does not guard its slot", i, pr.at)
			}
		} else if pr.at+probeLen != l.fenceEnd || i != len(l.probes)-1 {
			t.Errorf("tail probe at %d, fence ends at %d", pr.at, l.fenceEnd)
		}
	}
}

// TestFenceCatchesOverrun lets the emulated deflate decoder write past one
// stream's slot, as nvCOMP's did on a damaged stream, and checks the
// verdicts: that chunk corrupt, chunks with deflate slots after it sent to
// the CPU, every other chunk decoded right; an overrun through the whole
// tail guard sends the round to the CPU.
func TestFenceCatchesOverrun(t *testing.T) {
	var jobs []codec.Job
	var want [][]byte
	for i, c := range []codec.Name{codec.Gzip, codec.LZ4, codec.Zlib, codec.Zstd, codec.Zlib, codec.Blosc, codec.Gzip} {
		d := field(30, 40, uint64(i+1))
		src := []byte(nil)
		if c == codec.Blosc {
			src = bloscCompress(d, 4, 1024, codec.ByteShuffle, "zlib")
		} else {
			src = compress(c, d)
		}
		jobs = append(jobs, codec.Job{Codec: c, Src: src, Dst: make([]byte, len(d))})
		want = append(want, d)
	}
	const victim = 2 // the first zlib chunk overruns
	victimSrc := jobs[victim].Src
	// 4800 decoded bytes: the slot's padding to 256 bytes is 64 bytes.
	tests := []struct {
		name string
		n    int
		hit  bool
	}{{"within the padding", 64, false}, {"into the guard", 65, true}, {"through the next slots", 40000, true}, {"through the tail", 4 << 20, true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outs, errs := emulateOverrun(jobs, alignCases[0].aligns, 0, false, func(after []byte, s segRef) {
				if &s.src[0] == &victimSrc[2] { // the zlib body starts after its 2-byte header
					for i := range min(tt.n, len(after)) {
						after[i] = byte(i*7 + 1)
					}
				}
			})
			for i, j := range jobs {
				isDeflate := j.Codec != codec.LZ4 && j.Codec != codec.Zstd
				switch {
				case tt.n > fenceTail:
					if !errors.Is(errs[i], codec.ErrUnsupported) {
						t.Errorf("job %d (%s): %v, want the round sent to the CPU", i, j.Codec, errs[i])
					}
				case i == victim && tt.hit:
					if !errors.Is(errs[i], codec.ErrCorrupt) {
						t.Errorf("overrunning job: %v, want corrupt", errs[i])
					}
				case i > victim && isDeflate && tt.hit:
					if !errors.Is(errs[i], codec.ErrUnsupported) {
						t.Errorf("job %d (%s) after the overrun: %v, want it sent to the CPU", i, j.Codec, errs[i])
					}
				default:
					if errs[i] != nil || !bytes.Equal(outs[i], want[i]) {
						t.Errorf("job %d (%s): %v or wrong bytes", i, j.Codec, errs[i])
					}
				}
			}
		})
	}
}
