package codec

import (
	"encoding/binary"
	"math"
	"strconv"
	"testing"
)

// BenchmarkStreamPart decodes the first 13 of 37 levels of a zstd chunk
// without a checksum (a stream stopped at the selection's end) against the
// whole chunk.
func BenchmarkStreamPart(b *testing.B) {
	for _, lv := range []int{181 * 360, 721 * 1440} {
		n := 37 * lv * 4
		data := make([]byte, n)
		for i := range n / 4 {
			v := float32(250+30*math.Sin(float64(i%1440)/50)) + float32(i%lv/1440)*0.01
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
		}
		src := zstdEncode(b, data, false)
		sel := make([]byte, 13*lv*4)
		b.Run("part-"+strconv.Itoa(n>>20)+"MiB", func(b *testing.B) {
			b.SetBytes(int64(len(sel)))
			for b.Loop() {
				j := Job{Codec: ZstdPart, Src: src, Segments: []Segment{{Off: 0, Dst: sel}}, Size: int64(n)}
				if err := DecodeJob(&j); err != nil {
					b.Fatal(err)
				}
			}
		})
		dst := make([]byte, n)
		b.Run("whole-"+strconv.Itoa(n>>20)+"MiB", func(b *testing.B) {
			b.SetBytes(int64(len(sel)))
			for b.Loop() {
				if err := Decode(Zstd, dst, src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
