package zarr

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/zarrfs/zarrfs/internal/testenv"
)

func TestFloat32ToHalf(t *testing.T) {
	for _, tt := range []struct {
		f    float32
		want uint16
	}{
		{0, 0},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{0.1, 0x2e66},
		{65504, 0x7bff},
		{65519.99, 0x7bff},
		{65520, 0x7c00}, // halfway to 65536: ties to even, which is infinity
		{1e6, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
		{float32(math.Ldexp(1, -14)), 0x0400},               // smallest normal
		{float32(math.Ldexp(1, -24)), 0x0001},               // smallest subnormal
		{float32(math.Ldexp(1, -25)), 0x0000},               // half of it: tie to even, zero
		{float32(math.Ldexp(1.5, -25)), 0x0001},             // above the tie
		{float32(math.Ldexp(3, -25)), 0x0002},               // 1.5 units: tie to even, up
		{float32(math.Ldexp(1023.5, -24)), 0x0400},          // carries from subnormal into normal
		{float32(1 + math.Ldexp(1, -11)), 0x3c00},           // tie, even stays
		{float32(1 + 3*math.Ldexp(1, -11)), 0x3c02},         // tie, odd rounds up
		{float32(1 + math.Ldexp(1, -11) + 1e-6), 0x3c01},    // above the tie
		{math.Float32frombits(0x7fc00000), 0x7e00},          // canonical NaN
		{math.Float32frombits(0x7f800001), 0x7c01},          // NaN whose payload is all below half precision stays NaN
		{math.Float32frombits(0xffc02000), 0xfe01},          // payload top bits kept
		{float32(math.Ldexp(1, -26)), 0},                    // underflow
		{float32(-math.Ldexp(1, -26)), 0x8000},              // signed underflow
		{float32(math.Ldexp(1, 15) * 1.9990234375), 0x7bff}, // 65504 spelled another way
	} {
		if got := float32BitsToHalf(math.Float32bits(tt.f)); got != tt.want {
			t.Errorf("half(%g) = %#04x, want %#04x", tt.f, got, tt.want)
		}
	}
}

func TestFloat64ToHalfNoDoubleRounding(t *testing.T) {
	// Through float32 this value becomes exactly 1+2^-11, a tie that rounds
	// down to 1.0; from double precision it is above the tie.
	x := 1 + math.Ldexp(1, -11) + math.Ldexp(1, -40)
	if got := Float16Bits(x); got != 0x3c01 {
		t.Errorf("half(%v) = %#04x, want 0x3c01", x, got)
	}
	if got := float32BitsToHalf(math.Float32bits(float32(x))); got != 0x3c00 {
		t.Errorf("through float32: %#04x", got)
	}
	for _, tt := range []struct {
		f    float64
		want uint16
	}{
		{0.1, 0x2e66}, {65520, 0x7c00}, {math.Ldexp(1, -25), 0}, {math.Ldexp(1.0000001, -25), 1},
		{math.NaN(), 0x7e00}, {math.Inf(1), 0x7c00}, {-1e300, 0xfc00}, {1e-300, 0},
	} {
		if got := Float16Bits(tt.f); got != tt.want {
			t.Errorf("half(%g) = %#04x, want %#04x", tt.f, got, tt.want)
		}
	}
}

// TestHalfDifferential checks that the float32 and float64 forms of the
// half conversions agree (one routine, two parameterisations) over every
// half value and a sweep of float32 values; TestCastNumpy checks both
// against numpy.
func TestHalfDifferential(t *testing.T) {
	for h := range 1 << 16 {
		f := halfToFloat32(uint16(h))
		d := Float16Value(uint16(h))
		ref := Float16Value(uint16(h))
		if math.IsNaN(ref) {
			if !math.IsNaN(float64(f)) || !math.IsNaN(d) {
				t.Fatalf("%#04x: NaN decodes as %v %v", h, f, d)
			}
			continue
		}
		if float64(f) != ref || d != ref {
			t.Fatalf("%#04x: %v %v, want %v", h, f, d, ref)
		}
		if back := float32BitsToHalf(math.Float32bits(f)); back != uint16(h) {
			t.Fatalf("%#04x: round trip gives %#04x", h, back)
		}
		if back := Float16Bits(d); back != uint16(h) {
			t.Fatalf("%#04x: round trip from float64 gives %#04x", h, back)
		}
	}
	for b := uint64(0); b < 1<<32; b += 4099 {
		f := math.Float32frombits(uint32(b))
		if math.IsNaN(float64(f)) {
			continue
		}
		if got, want := float32BitsToHalf(uint32(b)), Float16Bits(float64(f)); got != want {
			t.Fatalf("half(%g = %#08x) = %#04x, zarr says %#04x", f, b, got, want)
		}
	}
}

var (
	f32 = DType{Kind: 'f', Size: 4}
	i64 = DType{Kind: 'i', Size: 8}
	u8  = DType{Kind: 'u', Size: 1}
	i16 = DType{Kind: 'i', Size: 2}
)

func le(dt DType, vals ...float64) []byte {
	b := make([]byte, len(vals)*dt.Size)
	for i, v := range vals {
		p := b[i*dt.Size:]
		switch {
		case dt.Kind == 'f' && dt.Size == 2:
			binary.LittleEndian.PutUint16(p, Float16Bits(v))
		case dt.Kind == 'f' && dt.Size == 4:
			binary.LittleEndian.PutUint32(p, math.Float32bits(float32(v)))
		case dt.Kind == 'f':
			binary.LittleEndian.PutUint64(p, math.Float64bits(v))
		case dt.Kind == 'u' && dt.Size == 8:
			binary.LittleEndian.PutUint64(p, uint64(v))
		default:
			u := uint64(int64(v))
			for k := range dt.Size {
				p[k] = byte(u >> (8 * k))
			}
		}
	}
	return b
}

func TestCast(t *testing.T) {
	var (
		b1  = DType{Kind: 'b', Size: 1}
		i8  = DType{Kind: 'i', Size: 1}
		u64 = DType{Kind: 'u', Size: 8}
		f16 = DType{Kind: 'f', Size: 2}
		f64 = DType{Kind: 'f', Size: 8}
		i32 = DType{Kind: 'i', Size: 4}
	)
	for _, tt := range []struct {
		name     string
		from, to DType
		src, dst []byte
	}{
		{"int16 to float32", i16, f32, le(i16, -1, 32767, -32768), le(f32, -1, 32767, -32768)},
		{"int16 to float16", i16, f16, le(i16, -1, 2049, 32767), le(f16, -1, 2048, 32768)},
		{"uint8 to float64", u8, f64, le(u8, 0, 255), le(f64, 0, 255)},
		{"bool to float32", b1, f32, []byte{0, 1, 2}, le(f32, 0, 1, 1)},
		{"bool to float16", b1, f16, []byte{0, 1}, le(f16, 0, 1)},
		{"float64 to float32", f64, f32, le(f64, 0.1, 1e39, -2.5), le(f32, 0.1, math.Inf(1), -2.5)},
		{"float32 to float64", f32, f64, le(f32, 0.1), le(f64, float64(float32(0.1)))},
		{"float16 to float32", f16, f32, le(f16, 0.1, 65504), le(f32, float64(halfToFloat32(0x2e66)), 65504)},
		{"float16 to float64", f16, f64, le(f16, -3), le(f64, -3)},
		{"int64 to float32 rounds once", i64, f32, le(i64, 1<<53+1, 16777217), le(f32, 1<<53, 16777216)},
		{"uint64 to float32", u64, f32, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, le(f32, math.Ldexp(1, 64))},
		{"int32 to int8 wraps", i32, i8, le(i32, 300, -129), le(i8, 44, 127)},
		{"float32 to bool", f32, b1, le(f32, 0, -0.0, 2, math.NaN()), []byte{0, 0, 1, 1}},
		{"same type copies", f32, f32, le(f32, 1.5), le(f32, 1.5)},
	} {
		dst := make([]byte, len(tt.dst))
		Cast(dst, tt.to, append([]byte(nil), tt.src...), tt.from)
		if !bytes.Equal(dst, tt.dst) {
			t.Errorf("%s: % x, want % x", tt.name, dst, tt.dst)
		}
	}
	if CanCast(f32, i32) == nil || CanCast(f16, u8) == nil || CanCast(i32, f16) != nil || CanCast(f64, b1) != nil {
		t.Error("CanCast accepts float to integer or refuses a numeric cast")
	}
}

// TestCastNumpy compares every cast with numpy's astype on random bit
// patterns (NaN results only need to be NaN: numpy may quiet them in
// hardware).
func TestCastNumpy(t *testing.T) {
	testenv.Python(t, "numpy")
	types := []DType{
		{Kind: 'b', Size: 1}, {Kind: 'i', Size: 1}, {Kind: 'i', Size: 2}, {Kind: 'i', Size: 4}, {Kind: 'i', Size: 8},
		{Kind: 'u', Size: 1}, {Kind: 'u', Size: 2}, {Kind: 'u', Size: 4}, {Kind: 'u', Size: 8},
		{Kind: 'f', Size: 2}, {Kind: 'f', Size: 4}, {Kind: 'f', Size: 8},
	}
	const n = 4096
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	script := "import sys, numpy as np\nd = sys.argv[1]\n"
	for _, from := range types {
		src := make([]byte, n*from.Size)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		// Some values near conversion edges too.
		if from.Kind == 'f' {
			for i, v := range []float64{0.1, 65519.99, 65520, 1 + math.Ldexp(1, -11) + math.Ldexp(1, -40), math.Ldexp(1, -25), 3e-8, 1e300, -0.0} {
				copy(src[i*from.Size:], le(from, v))
			}
		}
		if from.Kind == 'b' {
			for i := range src {
				src[i] &= 1 // numpy bools are 0 or 1
			}
		}
		os.WriteFile(filepath.Join(dir, from.Name()), src, 0o644)
		for _, to := range types {
			if CanCast(from, to) != nil {
				continue
			}
			script += fmt.Sprintf("np.fromfile(d+'/%s', dtype='%s').astype('%s').tofile(d+'/%s-%s')\n", from.Name(), from.NumpyLE(), to.NumpyLE(), from.Name(), to.Name())
		}
	}
	if out, err := exec.Command("python3", "-W", "ignore", "-c", script, dir).CombinedOutput(); err != nil {
		t.Fatalf("numpy: %v\n%s", err, out)
	}
	for _, from := range types {
		src, _ := os.ReadFile(filepath.Join(dir, from.Name()))
		for _, to := range types {
			if CanCast(from, to) != nil {
				continue
			}
			want, err := os.ReadFile(filepath.Join(dir, from.Name()+"-"+to.Name()))
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, n*to.Size)
			Cast(got, to, append([]byte(nil), src...), from)
			bad := 0
			for i := range n {
				g, w := got[i*to.Size:(i+1)*to.Size], want[i*to.Size:(i+1)*to.Size]
				if bytes.Equal(g, w) {
					continue
				}
				if to.Kind == 'f' && math.IsNaN(ReadFloat(g, to)) && math.IsNaN(ReadFloat(w, to)) {
					continue
				}
				if bad++; bad <= 3 {
					t.Errorf("%s -> %s: element %d (% x): % x, numpy % x", from.Name(), to.Name(), i, src[i*from.Size:(i+1)*from.Size], g, w)
				}
			}
		}
	}
}

func BenchmarkCast(b *testing.B) {
	const n = 721 * 1440
	for _, tt := range []struct{ from, to DType }{
		{f32, DType{Kind: 'f', Size: 2}}, {DType{Kind: 'f', Size: 8}, f32}, {i16, f32},
	} {
		b.Run(tt.from.Name()+"-"+tt.to.Name(), func(b *testing.B) {
			src := make([]byte, n*tt.from.Size)
			dst := make([]byte, n*tt.to.Size)
			b.SetBytes(int64(len(dst)))
			b.ReportAllocs()
			for b.Loop() {
				Cast(dst, tt.to, src, tt.from)
			}
		})
	}
}
