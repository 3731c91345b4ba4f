package gpu

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"

	"github.com/zarrfs/zarrfs/codec"
)

// These tests hold the host checks (prepare) to the CPU decoder
// (codec.Decode) on damaged chunks, without a GPU: for LZ4, blosc-lz4 and
// blosc with stored streams, whatever the host checks pass the CPU decoder
// accepts, and whatever they call corrupt it rejects. Only what they send
// to the CPU (ErrUnsupported) is left for it to decide. So nvCOMP, which
// sees only what passes, cannot accept a chunk of these codecs that the
// CPU rejects.

// exactChunk reports whether the host checks of a chunk are exact: its
// codec is LZ4, or blosc with LZ4 streams or none compressed.
func exactChunk(j codec.Job) bool {
	switch j.Codec {
	case codec.LZ4:
		return true
	case codec.Blosc:
		f, err := codec.ParseBlosc(j.Src)
		if err != nil {
			return false
		}
		if f.Compressor == "lz4" || f.Memcpyed {
			return true
		}
		for _, s := range f.Streams {
			if !s.Raw {
				return false
			}
		}
		return true
	}
	return false
}

// exactCorpus is the good chunks of the exact codecs: those genJobs makes
// in several shapes, memcpyed frames, and the numcodecs test vectors
// (written by the C LZ4 library, lz4 and lz4hc).
func exactCorpus(t testing.TB) (jobs []codec.Job, names []string) {
	add := func(name string, j codec.Job) {
		if exactChunk(j) && len(j.Dst) > 0 {
			jobs = append(jobs, j)
			names = append(names, name)
		}
	}
	for _, shape := range [][2]int{{60, 70}, {3, 5}, {128, 256}} {
		g, _, n := genJobs(t, shape[0], shape[1])
		for i, j := range g {
			add(fmt.Sprintf("%s-%dx%d", n[i], shape[0], shape[1]), j)
		}
	}
	for _, n := range []int{1, 100, 5000} {
		d := field(1, n, uint64(n))
		add(fmt.Sprintf("blosc-memcpyed-%d", len(d)), codec.Job{Codec: codec.Blosc, Src: memcpyedBlosc(d, 4), Dst: make([]byte, len(d))})
		add(fmt.Sprintf("lz4-%d", len(d)), codec.Job{Codec: codec.LZ4, Src: compress(codec.LZ4, d), Dst: make([]byte, len(d))})
	}
	vecs, src, raw := loadVectors(t)
	for _, v := range vecs {
		add("vector-"+v.Name, codec.Job{Codec: codec.Name(v.Codec), Src: src[v.Name], Dst: make([]byte, len(raw[v.Name]))})
	}
	return jobs, names
}

// memcpyedBlosc is a blosc frame that stores data as it is (flag 0x02).
func memcpyedBlosc(data []byte, typesize int) []byte {
	out := make([]byte, 16, 16+len(data))
	out[0], out[1], out[2], out[3] = 2, 1, 0x02|0x01|1<<5, byte(typesize)
	binary.LittleEndian.PutUint32(out[4:], uint32(len(data)))
	binary.LittleEndian.PutUint32(out[8:], uint32(len(data)))
	binary.LittleEndian.PutUint32(out[12:], uint32(16+len(data)))
	return append(out, data...)
}

// verdict compares the host's verdict on one chunk, under default Options,
// with the CPU decoder's. It returns "" when they agree as they must, else
// what is wrong, and the host's outcome: "pass" (the chunk goes to
// nvCOMP), "corrupt" or "cpu" (left to the CPU decoder).
func verdict(j codec.Job) (wrong, host string) {
	p := prepare(&j)
	p.err = Options{}.refusal(&j, &p)
	out := make([]byte, len(j.Dst))
	cerr := codec.Decode(j.Codec, out, j.Src)
	switch {
	case p.err == nil:
		if cerr != nil {
			return fmt.Sprintf("host checks pass what the CPU rejects: %v", cerr), "pass"
		}
		return "", "pass"
	case errors.Is(p.err, codec.ErrUnsupported):
		return "", "cpu"
	case errors.Is(p.err, codec.ErrCorrupt):
		// The CPU may call it unsupported instead (a frame turned snappy by
		// the damage): an error either way, and not retried.
		if cerr == nil {
			return fmt.Sprintf("host checks reject what the CPU decodes: %v", p.err), "corrupt"
		}
		return "", "corrupt"
	}
	return fmt.Sprintf("host error of no known class: %v", p.err), "?"
}

// TestHostChecksMatchCPU applies every kind of damage, with many seeds, to
// every good chunk of the exact codecs and requires the host checks and
// the CPU decoder to agree (verdict). It reports, per kind, how many
// damaged chunks the host passed, rejected and left to the CPU.
func TestHostChecksMatchCPU(t *testing.T) {
	jobs, names := exactCorpus(t)
	seeds := 24
	if testing.Short() {
		seeds = 4
	}
	type count struct{ pass, corrupt, cpu int }
	counts := map[string]*count{}
	var failures int
	for i, g := range jobs {
		if w, h := verdict(g); w != "" || h != "pass" {
			t.Fatalf("%s: good chunk: host %s, %s", names[i], h, w)
		}
		for _, kind := range damageKinds {
			for seed := range seeds {
				r := rand.New(rand.NewPCG(uint64(seed), uint64(i)))
				src := damage(kind, g.Codec, g.Src, r)
				if src == nil {
					continue
				}
				w, h := verdict(codec.Job{Codec: g.Codec, Src: src, Dst: make([]byte, len(g.Dst))})
				if w != "" {
					if failures++; failures <= 20 {
						t.Errorf("%s/%s seed %d: %s", names[i], kind, seed, w)
					}
				}
				c := counts[kind]
				if c == nil {
					c = &count{}
					counts[kind] = c
				}
				switch h {
				case "pass":
					c.pass++
				case "corrupt":
					c.corrupt++
				case "cpu":
					c.cpu++
				}
			}
		}
	}
	var lines []string
	var total count
	for _, kind := range damageKinds {
		if c := counts[kind]; c != nil {
			lines = append(lines, fmt.Sprintf("%-13s %5d passed (the CPU decodes them too) %5d corrupt on both %4d left to the CPU", kind, c.pass, c.corrupt, c.cpu))
			total.pass, total.corrupt, total.cpu = total.pass+c.pass, total.corrupt+c.corrupt, total.cpu+c.cpu
		}
	}
	t.Logf("%d good chunks, %d seeds per kind of damage:\n%s", len(jobs), seeds, strings.Join(lines, "\n"))
	if failures > 0 {
		t.Fatalf("%d damaged chunks where the host checks and the CPU decoder disagree", failures)
	}
	// The checks send to the CPU only what no encoder writes: they must
	// not turn into a way of avoiding the question.
	if n := total.pass + total.corrupt + total.cpu; total.cpu*50 > n {
		t.Errorf("%d of %d damaged chunks left to the CPU", total.cpu, n)
	}
}

// TestLZ4CheckEncoders: every block the LZ4 encoders write, of any content
// and size, passes lz4Check with its exact size, and keeps the end-of-block
// rules (a block the CPU decoder accepts but that breaks them goes to the
// CPU: for blocks that encoders write that would cost the GPU path).
func TestLZ4CheckEncoders(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{1, 4, 5, 11, 12, 13, 14, 15, 16, 17, 19, 20, 31, 64, 100, 255, 256, 1000, 65536, 70000, 300000} {
		for kind := range 4 {
			b := make([]byte, n)
			for i := range b {
				switch kind {
				case 0: // noise
					b[i] = byte(r.Uint32())
				case 1: // runs
					b[i] = byte(i / 7)
				case 2: // zeros
				case 3: // a small alphabet
					b[i] = "abcab"[r.IntN(5)]
				}
			}
			blk := lz4Block(b)
			if len(blk) == 0 {
				continue // incompressible: pierrec writes nothing
			}
			if err := lz4Check(blk, int64(n)); err != nil {
				t.Errorf("%d bytes, content %d: %v", n, kind, err)
			}
			if err := lz4Check(blk, int64(n)+1); !errors.Is(err, codec.ErrCorrupt) {
				t.Errorf("%d bytes, content %d, one byte more expected: %v", n, kind, err)
			}
		}
	}
}

// TestLZ4CheckRules: blocks built by hand, each against the CPU decoder.
func TestLZ4CheckRules(t *testing.T) {
	lit := func(s string) []byte { return append([]byte{byte(len(s) << 4)}, s...) }
	tests := []struct {
		name string
		blk  []byte
		n    int64
		want error // nil, ErrCorrupt or ErrUnsupported
	}{
		{"literals only", lit("hello"), 5, nil},
		{"literals, n too large", lit("hello"), 6, codec.ErrCorrupt},
		{"literals, n too small", lit("hello"), 4, codec.ErrCorrupt},
		{"match then 5 literals", append([]byte{0x40 | 0x0c, 'a', 'b', 'c', 'd', 1, 0}, lit("vwxyz")...), 4 + 16 + 5, nil},
		{"match within the last 12 bytes", append([]byte{0x40 | 0x00, 'a', 'b', 'c', 'd', 1, 0}, lit("vwxyz")...), 4 + 4 + 5, codec.ErrUnsupported},
		{"block ends after a match", []byte{0x40 | 0x0c, 'a', 'b', 'c', 'd', 1, 0}, 20, codec.ErrUnsupported},
		{"last literals fewer than 5", append(append([]byte{0xd0 | 0x0c}, "abcdefghijklm"...), 1, 0, 0x10, 'z'), 13 + 16 + 1, codec.ErrUnsupported},
		{"offset zero", append([]byte{0x40 | 0x0c, 'a', 'b', 'c', 'd', 0, 0}, lit("vwxyz")...), 25, codec.ErrCorrupt},
		{"offset before the start", append([]byte{0x40 | 0x0c, 'a', 'b', 'c', 'd', 5, 0}, lit("vwxyz")...), 25, codec.ErrCorrupt},
		{"offset truncated", []byte{0x40 | 0x0c, 'a', 'b', 'c', 'd', 1}, 20, codec.ErrCorrupt},
		{"match length left at the end", []byte{0x41, 'a', 'b', 'c', 'd'}, 4, codec.ErrCorrupt},
		{"literal length byte missing", []byte{0xf0}, 15, codec.ErrCorrupt},
		{"literal run past the input", []byte{0x50, 'a', 'b'}, 5, codec.ErrCorrupt},
		{"match past the output", append([]byte{0x40 | 0x0c, 'a', 'b', 'c', 'd', 1, 0}, lit("vwxyz")...), 20, codec.ErrCorrupt},
		{"match length byte missing", []byte{0x4f, 'a', 'b', 'c', 'd', 1, 0}, 30, codec.ErrCorrupt},
		{"empty block", nil, 1, codec.ErrCorrupt},
		{"byte after the last literals", append(lit("hello"), 0x00), 5, codec.ErrCorrupt}, // read as an offset
		{"empty last sequence", []byte{0x40 | 0x0c, 'a', 'b', 'c', 'd', 1, 0, 0x00}, 20, codec.ErrUnsupported},
		{"long literal run", append([]byte{0xf0, 255, 1}, make([]byte, 15+255+1)...), 15 + 255 + 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := lz4Check(tt.blk, tt.n)
			if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("lz4Check: %v, want %v", err, tt.want)
			}
			// The CPU decoder's verdict, through numcodecs' framing.
			src := binary.LittleEndian.AppendUint32(nil, uint32(tt.n))
			cerr := codec.Decode(codec.LZ4, make([]byte, tt.n), append(src, tt.blk...))
			if cpuOK := cerr == nil; cpuOK != (tt.want != codec.ErrCorrupt) {
				t.Fatalf("CPU decoder: %v, but lz4Check says %v", cerr, err)
			}
		})
	}
}

// TestLZ4CheckSynthesized builds LZ4 blocks sequence by sequence, with
// lengths around the nibble and length-byte limits, offsets around the
// bytes decoded so far (0, di, di+1), endings after literals, after a
// match or inside a sequence, and expected sizes around the decoded one:
// lz4Check and the CPU decoder must agree on every one (verdict).
func TestLZ4CheckSynthesized(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	lengths := []int{0, 1, 4, 13, 14, 15, 16, 18, 19, 20, 269, 270, 271, 600}
	var counts [3]int
	for it := range 50000 {
		var blk []byte
		var di int
		lenField := func(v int) { // the bytes after a nibble of 15
			for ; v >= 255; v -= 255 {
				blk = append(blk, 255)
			}
			blk = append(blk, byte(v))
		}
		nseq := 1 + r.IntN(6)
		for k := range nseq {
			lit := lengths[r.IntN(len(lengths))]
			ml := 4 + lengths[r.IntN(len(lengths))]
			last := k == nseq-1
			tok := byte(min(lit, 15)) << 4
			if !last || r.IntN(4) == 0 {
				tok |= byte(min(ml-4, 15))
			}
			blk = append(blk, tok)
			if lit >= 15 {
				lenField(lit - 15)
			}
			for range lit {
				blk = append(blk, byte(r.Uint32()))
			}
			di += lit
			if last && r.IntN(3) > 0 {
				break // ends after the literals
			}
			off := 1 + r.IntN(max(di, 1)) // mostly valid
			if r.IntN(8) == 0 {
				off = []int{0, 1, di, di + 1, 65535}[r.IntN(5)]
			}
			blk = append(blk, byte(off), byte(off>>8))
			if ml-4 >= 15 {
				lenField(ml - 4 - 15)
			}
			di += ml
		}
		if r.IntN(10) == 0 && len(blk) > 1 {
			blk = blk[:r.IntN(len(blk))] // cut anywhere
		}
		n := max(1, di+[]int{0, 0, 0, 0, 0, -1, 1, -5}[r.IntN(8)])
		src := append(binary.LittleEndian.AppendUint32(nil, uint32(n)), blk...)
		w, h := verdict(codec.Job{Codec: codec.LZ4, Src: src, Dst: make([]byte, n)})
		if w != "" {
			t.Fatalf("block %d (% x, %d bytes expected): %s", it, blk[:min(len(blk), 64)], n, w)
		}
		counts[map[string]int{"pass": 0, "corrupt": 1, "cpu": 2}[h]]++
	}
	t.Logf("50000 blocks: %d passed, %d corrupt on both, %d left to the CPU", counts[0], counts[1], counts[2])
	if counts[0] < 1000 || counts[2] < 100 {
		t.Errorf("too few blocks passed (%d) or left to the CPU (%d) to show much", counts[0], counts[2])
	}
}

// seedDamaged adds to f's corpus the small good chunks of codec c and one
// damaged copy of each per kind of damage.
func seedDamaged(f *testing.F, c codec.Name, r *rand.Rand) {
	jobs, _ := exactCorpus(f)
	for _, j := range jobs {
		if j.Codec == c && len(j.Dst) <= 1<<16 {
			f.Add(j.Src)
			for _, kind := range damageKinds {
				if d := damage(kind, j.Codec, j.Src, r); d != nil {
					f.Add(d)
				}
			}
		}
	}
}

// FuzzLZ4Check: numcodecs LZ4 chunks of any bytes and size, host checks
// against the CPU decoder (verdict).
func FuzzLZ4Check(f *testing.F) {
	seedDamaged(f, codec.LZ4, rand.New(rand.NewPCG(3, 3)))
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) < 4 {
			return
		}
		n := int(int32(binary.LittleEndian.Uint32(src)))
		if n <= 0 || n > 1<<20 {
			return
		}
		if w, _ := verdict(codec.Job{Codec: codec.LZ4, Src: src, Dst: make([]byte, n)}); w != "" {
			t.Fatal(w)
		}
	})
}

// FuzzLZ4Block: raw LZ4 blocks of any bytes and a small decoded size,
// lz4Check against the CPU decoder (verdict), so that the fuzzer explores
// the block's grammar rather than sizes.
func FuzzLZ4Block(f *testing.F) {
	r := rand.New(rand.NewPCG(6, 6))
	for _, n := range []int{1, 13, 40, 300, 4000} {
		b := field(1, (n+3)/4, uint64(n))[:n]
		for i := range b[:n/2] {
			b[i] = "abc"[r.IntN(3)]
		}
		if blk := lz4Block(b); len(blk) > 0 {
			f.Add(blk, uint16(n))
		}
	}
	f.Fuzz(func(t *testing.T, blk []byte, n uint16) {
		if n == 0 {
			return
		}
		src := append(binary.LittleEndian.AppendUint32(nil, uint32(n)), blk...)
		if w, _ := verdict(codec.Job{Codec: codec.LZ4, Src: src, Dst: make([]byte, n)}); w != "" {
			t.Fatal(w)
		}
	})
}

// FuzzBloscCheck: blosc frames of any bytes, host checks against the CPU
// decoder, for frames of LZ4 or stored streams. The decoded size is the
// header's, so that the frame's body is reached.
func FuzzBloscCheck(f *testing.F) {
	seedDamaged(f, codec.Blosc, rand.New(rand.NewPCG(4, 4)))
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) < 16 || src[2]>>5 != 1 && src[2]&0x02 == 0 {
			return // neither LZ4 nor memcpyed
		}
		n := int(int32(binary.LittleEndian.Uint32(src[4:])))
		if n <= 0 || n > 1<<20 {
			return
		}
		if w, _ := verdict(codec.Job{Codec: codec.Blosc, Src: src, Dst: make([]byte, n)}); w != "" {
			t.Fatal(w)
		}
	})
}

// TestDamageKinds: every kind applies to LZ4 and blosc-lz4 chunks (blosc
// header fields only to blosc), so that the GPU's damaged-chunk test
// really covers it.
func TestDamageKinds(t *testing.T) {
	jobs, _, names := genJobs(t, 60, 70)
	r := rand.New(rand.NewPCG(1, 1))
	for _, kind := range damageKinds {
		var lz, bl bool
		for i, j := range jobs {
			if damage(kind, j.Codec, j.Src, r) != nil {
				lz = lz || names[i] == "lz4"
				bl = bl || strings.HasPrefix(names[i], "blosc-lz4")
			}
		}
		if !bl || (!lz && kind != "size-fields") {
			t.Errorf("%s: applies to LZ4 %v, to blosc-lz4 %v", kind, lz, bl)
		}
	}
}

// TestRefuse: which prepared chunks each configuration sends to the CPU
// although the GPU path could decode them.
func TestRefuse(t *testing.T) {
	d := field(40, 50, 2)
	jobs := map[string]codec.Job{
		"lz4":          {Codec: codec.LZ4, Src: compress(codec.LZ4, d)},
		"blosc-lz4":    {Codec: codec.Blosc, Src: bloscCompress(d, 4, 4096, codec.ByteShuffle, "lz4")},
		"zstd-crc":     {Codec: codec.Zstd, Src: compress(codec.Zstd, d)},
		"zstd-nocrc":   {Codec: codec.Zstd, Src: zstdNoCRC(d)},
		"blosc-zstd":   {Codec: codec.Blosc, Src: bloscCompress(d, 4, 4096, codec.ByteShuffle, "zstd")},
		"blosc-snappy": {Codec: codec.Blosc, Src: bloscCompress(d, 4, 4096, codec.ByteShuffle, "snappy")},
		"blosc-zlib":   {Codec: codec.Blosc, Src: bloscCompress(d, 4, 4096, codec.ByteShuffle, "zlib")},
		"gzip":         {Codec: codec.Gzip, Src: compress(codec.Gzip, d)},
	}
	tests := []struct {
		opts    Options
		refused string // the jobs refused, in sorted order
	}{
		{Options{}, "blosc-snappy blosc-zlib blosc-zstd gzip zstd-nocrc"},
		{Options{Deflate: true}, "blosc-snappy blosc-zstd zstd-nocrc"},
		{Options{Unverified: true}, "blosc-zlib gzip"},
		{Options{Deflate: true, Unverified: true}, ""},
		{Options{Deflate: true, SkipChecksums: true}, "blosc-snappy blosc-zlib blosc-zstd gzip zstd-crc zstd-nocrc"},
		{Options{Deflate: true, Unverified: true, SkipChecksums: true}, ""},
	}
	for _, tt := range tests {
		var got []string
		for _, name := range []string{"blosc-lz4", "blosc-snappy", "blosc-zlib", "blosc-zstd", "gzip", "lz4", "zstd-crc", "zstd-nocrc"} {
			j := jobs[name]
			j.Dst = make([]byte, len(d))
			p := prepare(&j)
			if p.err != nil {
				t.Fatalf("%s: %v", name, p.err)
			}
			if err := tt.opts.refusal(&j, &p); err != nil {
				if !errors.Is(err, codec.ErrUnsupported) {
					t.Fatalf("%s: %v", name, err)
				}
				got = append(got, name)
			}
		}
		if strings.Join(got, " ") != tt.refused {
			t.Errorf("%+v: refused %q, want %q", tt.opts, strings.Join(got, " "), tt.refused)
		}
	}
}

// TestGzipHeaderLikeCPU holds gzipBody to the CPU's gzip reader on headers
// of every optional field, intact and with bits flipped: a header it
// passes the CPU reads (a deflate chunk reaches nvCOMP under
// Options.Deflate only after it), and one it refuses the CPU cannot
// decode.
func TestGzipHeaderLikeCPU(t *testing.T) {
	data := []byte(strings.Repeat("zarrfs gzip header ", 200))
	var fw bytes.Buffer
	w, err := flate.NewWriter(&fw, 6)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(data)
	w.Close()
	body := fw.Bytes()
	var passed, refused int
	for seed := range 4000 {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		flg := byte(r.IntN(32)) &^ 1 // FTEXT is never checked
		h := []byte{0x1f, 0x8b, 8, flg, 0, 0, 0, 0, 0, 3}
		if flg&4 != 0 {
			extra := make([]byte, r.IntN(40))
			h = binary.LittleEndian.AppendUint16(h, uint16(len(extra)))
			h = append(h, extra...)
		}
		for _, f := range []byte{8, 16} {
			if flg&f != 0 {
				n := r.IntN(40)
				if r.IntN(8) == 0 {
					n = 505 + r.IntN(16) // about the CPU's 512-byte limit
				}
				h = append(h, bytes.Repeat([]byte{'a'}, n)...)
				h = append(h, 0)
			}
		}
		if flg&2 != 0 {
			h = binary.LittleEndian.AppendUint16(h, uint16(crc32.ChecksumIEEE(h)))
		}
		if seed%2 == 1 {
			for range 1 + r.IntN(2) {
				i := 3 + r.IntN(len(h)-3)
				h[i] ^= 1 << r.IntN(8)
			}
		}
		src := append(append([]byte{}, h...), body...)
		src = binary.LittleEndian.AppendUint32(src, crc32.ChecksumIEEE(data))
		src = binary.LittleEndian.AppendUint32(src, uint32(len(data)))
		_, _, _, err := gzipBody(src)
		cerr := codec.Decode(codec.Gzip, make([]byte, len(data)), src)
		_, herr := gzip.NewReader(bytes.NewReader(src))
		switch {
		case err == nil && herr != nil:
			t.Errorf("seed %d: gzipBody passes a header the CPU refuses (% x): %v", seed, h, herr)
		case err != nil && cerr == nil:
			t.Errorf("seed %d: gzipBody refuses what the CPU decodes (% x): %v", seed, h, err)
		case err == nil:
			passed++
		default:
			refused++
		}
	}
	if passed < 1000 || refused < 500 {
		t.Errorf("%d headers passed, %d refused: the cases do not cover both", passed, refused)
	}
}
