package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/klauspost/compress/zstd"
)

// libZstdOrSkip returns a decoder with a libzstd context, or skips where the
// machine has no libzstd (the Go decoder then decodes everything, as the
// rest of the package's tests check); with ZARRFS_EXPECT_LIBZSTD set (CI),
// a missing libzstd fails instead.
func libZstdOrSkip(t testing.TB) *decoder {
	t.Helper()
	d := newDecoder()
	if d.zc = newZstdCtx(); d.zc == nil {
		_, err := nativeZstd()
		if os.Getenv("ZARRFS_EXPECT_LIBZSTD") != "" {
			t.Fatalf("libzstd expected (ZARRFS_EXPECT_LIBZSTD), not used: %v", err)
		}
		t.Skipf("libzstd not used on this machine: %v", err)
	}
	return d
}

// zstdVerdict decodes src into n bytes with the Go decoder or as
// decodeZstd would with libzstd (input that is not zstd and skippable
// frames end to end goes to the Go decoder), and checks that neither wrote past dst nor returned an error other than
// ErrCorrupt.
func zstdVerdict(t *testing.T, d *decoder, native bool, src []byte, n int) ([]byte, error) {
	t.Helper()
	buf := bytes.Repeat([]byte{0x5a}, n+16)
	var err error
	if native {
		err = d.decodeZstdNative(buf[:n], src)
	} else {
		err = d.decodeZstdGo(buf[:n], src)
	}
	if err != nil && !errors.Is(err, ErrCorrupt) {
		t.Fatalf("native %v: error does not wrap ErrCorrupt: %v", native, err)
	}
	for i, c := range buf[n:] {
		if c != 0x5a {
			t.Fatalf("native %v: wrote past dst at +%d", native, i)
		}
	}
	return buf[:n], err
}

// agree decodes src into n bytes with both decoders and fails the test if
// both accept it with different bytes, or if either accepts it with other
// bytes than want (the frame's data, where the test knows src is one of its
// frames with a checksum, damaged or not: a decoder that accepts such a
// frame must give back its data). It returns libzstd's verdict. What each
// decoder refuses of damage no checksum covers differs (the Go decoder
// checks reserved bits libzstd ignores, libzstd needs no window and
// refuses none for its size): without a checksum neither can tell such
// damage from data.
func agree(t *testing.T, d *decoder, what string, src []byte, n int, want []byte) error {
	t.Helper()
	g, gerr := zstdVerdict(t, d, false, src, n)
	c, cerr := zstdVerdict(t, d, true, src, n)
	if gerr == nil && cerr == nil && !bytes.Equal(g, c) {
		t.Fatalf("%s: the decoders accept it with different bytes", what)
	}
	if want != nil {
		if gerr == nil && !bytes.Equal(g, want) {
			t.Fatalf("%s: the Go decoder accepts a checksummed frame with wrong bytes", what)
		}
		if cerr == nil && !bytes.Equal(c, want) {
			t.Fatalf("%s: libzstd accepts a checksummed frame with wrong bytes", what)
		}
	}
	return cerr
}

// zstdCorpus is frames as writers make them: with and without checksums,
// one or several frames, skippable frames around them, empty frames, data
// that compresses well and data that does not.
func zstdCorpus(t testing.TB) (frames [][]byte, datas [][]byte, checked []bool) {
	rng := rand.New(rand.NewPCG(1, 2))
	noise := make([]byte, 200<<10)
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	field := benchField()[:300<<10]
	skippable := binary.LittleEndian.AppendUint32(nil, 0x184D2A53)
	skippable = binary.LittleEndian.AppendUint32(skippable, 5)
	skippable = append(skippable, "hello"...)
	for _, data := range [][]byte{nil, []byte("x"), bytes.Repeat([]byte("zarr "), 30000), noise, field} {
		for _, crc := range []bool{false, true} {
			for _, lvl := range []zstd.EncoderLevel{zstd.SpeedFastest, zstd.SpeedDefault, zstd.SpeedBetterCompression} {
				enc, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(crc), zstd.WithEncoderLevel(lvl), zstd.WithEncoderConcurrency(1))
				if err != nil {
					t.Fatal(err)
				}
				one := enc.EncodeAll(data, nil)
				half := len(data) / 2
				two := enc.EncodeAll(data[half:], enc.EncodeAll(data[:half], nil))
				frames = append(frames, one, two,
					append(bytes.Clone(skippable), one...),
					append(bytes.Clone(one), skippable...))
				for range 4 {
					datas, checked = append(datas, data), append(checked, crc)
				}
			}
		}
		// A streamed frame: no content size in its header.
		var b bytes.Buffer
		w, err := zstd.NewWriter(&b, zstd.WithEncoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
		w.Close()
		frames, datas, checked = append(frames, b.Bytes()), append(datas, data), append(checked, false)
	}
	return frames, datas, checked
}

// TestLibZstdAgrees checks libzstd against the Go decoder over the corpus
// and damaged forms of it: a wrong dst size, truncation, trailing bytes and
// changed bytes anywhere. Every frame decodes to its data with both; a
// damaged frame with a checksum is refused or decodes to its data; where
// both accept a damaged frame without one, they give the same bytes.
func TestLibZstdAgrees(t *testing.T) {
	d := libZstdOrSkip(t)
	frames, datas, checked := zstdCorpus(t)
	rng := rand.New(rand.NewPCG(3, 4))
	refused := 0
	for i, src := range frames {
		n, data := len(datas[i]), datas[i]
		if data == nil {
			data = []byte{}
		}
		if err := agree(t, d, "whole", src, n, data); err != nil {
			t.Fatalf("frame %d: libzstd %v", i, err)
		}
		if _, err := zstdVerdict(t, d, false, src, n); err != nil {
			t.Fatalf("frame %d: Go decoder %v", i, err)
		}
		var want []byte
		if checked[i] {
			want = data
		}
		for _, m := range []int{n - 1, n + 1} {
			if m >= 0 && agree(t, d, "wrong dst size", src, m, nil) == nil {
				t.Fatalf("frame %d: libzstd accepts %d bytes for %d", i, m, n)
			}
		}
		for _, cut := range []int{1, 3, 4, 6, len(src) / 2, len(src) - 1} {
			if cut > 0 && cut < len(src) && agree(t, d, "truncated", src[:cut], n, want) != nil {
				refused++
			}
		}
		for _, tail := range [][]byte{{0}, {0x28, 0xb5}, {0x28, 0xb5, 0x2f, 0xfd}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
			if agree(t, d, "trailing bytes", append(bytes.Clone(src), tail...), n, want) == nil {
				t.Fatalf("frame %d: libzstd accepts %d trailing bytes", i, len(tail))
			}
		}
		for range 40 {
			bad := bytes.Clone(src)
			if len(bad) == 0 {
				break
			}
			k := rng.IntN(len(bad))
			bad[k] ^= byte(1 + rng.IntN(255))
			if agree(t, d, "changed byte", bad, n, want) != nil {
				refused++
			}
		}
	}
	if refused == 0 {
		t.Fatal("libzstd refused no damaged frame")
	}
}

// TestLibZstdRefuses checks libzstd's errors: one line naming the codec and
// the cause, wrapping ErrCorrupt.
func TestLibZstdRefuses(t *testing.T) {
	d := libZstdOrSkip(t)
	data := bytes.Repeat([]byte("zarr chunk "), 10000)
	zs := zstdFrame(t, data) // with a checksum
	badCRC := bytes.Clone(zs)
	badCRC[len(badCRC)-1] ^= 0xff
	for _, tc := range []struct {
		name string
		src  []byte
		n    int
		want string
	}{
		{"checksum", badCRC, len(data), "checksum"},
		{"dst too small", zs, len(data) - 1, "Destination buffer is too small"},
		{"dst too large", zs, len(data) + 1, "decodes to 110000 bytes, want 110001"},
		{"empty", nil, 4, "decodes to 0 bytes, want 4"},
		{"garbage", []byte("not a zstd frame at all"), 4, "Unknown frame descriptor"},
	} {
		err := d.zc.decode(make([]byte, tc.n), tc.src)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q wrapping ErrCorrupt", tc.name, err, tc.want)
		}
	}
}

// hugeWindowFrame is a zstd frame of data in one raw block whose header
// declares a 1 GiB window (as zstd --long=30 writes): over the Go
// decoder's limit, decoded by libzstd.
func hugeWindowFrame(data []byte) []byte {
	src := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 20 << 3} // no content size, window 2^(10+20)
	bh := uint32(1 | len(data)<<3)                       // last block, raw
	src = append(src, byte(bh), byte(bh>>8), byte(bh>>16))
	return append(src, data...)
}

// TestLibZstdUsed checks which chunks go through libzstd, through Decode as
// the CPU workers call it: a chunk of nativeZstdMin bytes or more of zstd
// frames (a frame whose window only libzstd decodes tells which decoder
// decoded), not a smaller one, not a legacy frame.
func TestLibZstdUsed(t *testing.T) {
	libZstdOrSkip(t)
	if got := ZstdDecoder(); !strings.HasPrefix(got, "libzstd 1.") {
		t.Fatalf("ZstdDecoder %q", got)
	}
	big := benchField()[:nativeZstdMin]
	dst := make([]byte, len(big))
	if err := Decode(Zstd, dst, hugeWindowFrame(big)); err != nil || !bytes.Equal(dst, big) {
		t.Fatalf("a chunk at the threshold did not go through libzstd: %v", err)
	}
	small := big[:nativeZstdMin-1]
	if err := Decode(Zstd, dst[:len(small)], hugeWindowFrame(small)); !errors.Is(err, zstd.ErrWindowSizeExceeded) {
		t.Fatalf("a chunk below the threshold: %v, want the Go decoder's window error", err)
	}
	// A checksummed frame whose magic number is damaged into a legacy
	// one (v0.5-v0.7, which libzstd may decode, without checksums) is
	// refused, as the Go decoder refuses it.
	zs := zstdFrame(t, big)
	for _, m := range []byte{0x25, 0x26, 0x27} {
		legacy := bytes.Clone(zs)
		legacy[0] = m
		if err := Decode(Zstd, dst, legacy); !errors.Is(err, ErrCorrupt) {
			t.Errorf("legacy magic %#x: %v, want ErrCorrupt", m, err)
		}
	}
}

// TestLibZstdStackBuffer decodes into buffers on goroutine stacks of many
// depths: the stack may grow and move while libzstd writes, unless the
// buffer was moved to the heap first (the pointers' conversion in the
// call's arguments does that).
func TestLibZstdStackBuffer(t *testing.T) {
	d := libZstdOrSkip(t)
	want := benchField()[:8192]
	src := zstdEncode(t, want, true)
	var deep func(int) error
	deep = func(depth int) error {
		if depth > 0 {
			return deep(depth - 1)
		}
		var buf [8192]byte
		if err := d.zc.decode(buf[:], src); err != nil {
			return err
		}
		if !bytes.Equal(buf[:], want) {
			return errors.New("the decoded bytes are not in the buffer")
		}
		return nil
	}
	// Every depth up to 2000 frames: one of them puts the buffer where the
	// call's own frames cross into a new stack segment.
	for depth := range 2000 {
		done := make(chan error)
		go func() { done <- deep(depth) }() // a fresh, small stack
		if err := <-done; err != nil {
			t.Fatalf("depth %d: %v", depth, err)
		}
	}
}

// TestLoadLibZstd checks the settings of UseLibZstd: off, and a path
// that is not a library, both leave the Go decoder with a reason.
func TestLoadLibZstd(t *testing.T) {
	if l, err := loadLibZstd("off"); l != nil || err == nil || !strings.Contains(err.Error(), "off") {
		t.Fatalf("off: %v %v", l, err)
	}
	if l, err := loadLibZstd(t.TempDir() + "/libzstd.so.1"); l != nil || err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Fatalf("missing path: %v %v", l, err)
	}
}

// FuzzZstdDecoders feeds both decoders the same input: neither writes past
// dst or fails with another error than ErrCorrupt, and where both accept
// it they give the same bytes.
func FuzzZstdDecoders(f *testing.F) {
	frames, datas, _ := zstdCorpus(f)
	for i, src := range frames {
		if len(src) <= 1<<14 {
			f.Add(uint32(len(datas[i])), src)
		}
	}
	d := libZstdOrSkip(f) // one decoder for every input, as a worker keeps one
	f.Fuzz(func(t *testing.T, size uint32, src []byte) {
		agree(t, d, "fuzzed", src, int(size%(1<<20)), nil)
	})
}

// era5Chunk is a (4, 721, 1440) float32 chunk as integration/gpu/make_store.py
// writes one of its pressure-level variables: per level a smooth field,
// coarse noise upsampled 16x16, quantised as ERA5's 16-bit packing does.
// It compresses like the benchmark stores (benchField's fine noise does
// not), which is what decoders are timed on.
func era5Chunk() []byte {
	const ny, nx, levels = 721, 1440, 4
	out := make([]byte, 0, 4*levels*ny*nx)
	f := make([]float64, ny*nx)
	for k := range levels {
		seed := uint64(7 + k)
		base, amp := 250*(1-0.1*float64(k)), 30.0
		coarse := func(y, x int) float64 { // a standard normal per 16x16 cell
			i := seed<<40 ^ uint64(y/16)<<20 ^ uint64(x/16)
			u1 := (float64(splitmix64(2*i)>>11) + 1) / (1 << 53)
			u2 := float64(splitmix64(2*i+1)>>11) / (1 << 53)
			return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for y := range ny {
			lat := (90 - 180*float64(y)/(ny-1)) * math.Pi / 180
			for x := range nx {
				lon := 2 * math.Pi * float64(x) / nx
				v := base + amp*(math.Cos(lat)*math.Sin(lon*float64(2+seed%3))+0.3*math.Sin(3*lat+float64(seed))+0.05*coarse(y, x))
				f[y*nx+x] = v
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		scale := math.Exp2(math.Ceil(math.Log2((hi - lo) / 65535)))
		for _, v := range f {
			q := float32(lo + math.RoundToEven((v-lo)/scale)*scale)
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(q))
		}
	}
	return out
}

// libzstdCompress compresses data into one frame with libzstd at level,
// without a checksum: as numcodecs' Zstd and tensorstore write chunks.
func libzstdCompress(tb testing.TB, data []byte, level int) []byte {
	tb.Helper()
	l, err := nativeZstd()
	if l == nil {
		tb.Skipf("libzstd not used on this machine: %v", err)
	}
	h, err := purego.Dlopen(l.path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		tb.Fatal(err)
	}
	var bound func(n uintptr) uintptr
	var compress func(dst unsafe.Pointer, dcap uintptr, src unsafe.Pointer, n uintptr, level int32) uintptr
	purego.RegisterLibFunc(&bound, h, "ZSTD_compressBound")
	purego.RegisterLibFunc(&compress, h, "ZSTD_compress")
	out := make([]byte, bound(uintptr(len(data))))
	n := compress(unsafe.Pointer(unsafe.SliceData(out)), uintptr(len(out)), unsafe.Pointer(unsafe.SliceData(data)), uintptr(len(data)), int32(level))
	if r, _, _ := purego.SyscallN(l.isError, n); uint32(r) != 0 {
		tb.Fatalf("ZSTD_compress: %s", l.errorName(n))
	}
	return out[:n]
}

// BenchmarkZstdDecoders times the Go decoder and libzstd, one goroutine,
// on a 16.6 MB chunk like the benchmark stores' (written as they are, by
// libzstd at level 3 without a checksum) and on small frames, the sizes
// around nativeZstdMin (KiBs from the middle of the same data).
func BenchmarkZstdDecoders(b *testing.B) {
	d := libZstdOrSkip(b)
	chunk := era5Chunk()
	for _, n := range []int{64, 512, 1 << 10, 4 << 10, 64 << 10, len(chunk)} {
		data := chunk[(len(chunk)-n)/2:][:n] // mid-latitudes of the middle level
		src := libzstdCompress(b, data, 3)
		dst := make([]byte, n)
		for _, dec := range []struct {
			name string
			fn   func(dst, src []byte) error
		}{{"go", d.decodeZstdGo}, {"libzstd", d.decodeZstdNative}} {
			b.Run(fmt.Sprintf("%d/%s", n, dec.name), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					if err := dec.fn(dst, src); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)/float64(len(src)), "ratio")
			})
		}
	}
}
