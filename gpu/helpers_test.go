package gpu

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/zarrfs/zarrfs/codec"
)

var (
	flagPTX        = flag.String("gpu.ptx", "", "load the kernels from this PTX file instead of the embedded one")
	flagThroughput = flag.Bool("gpu.throughput", false, "run the GPU vs CPU decode throughput comparison (slow)")
	flagChunks     = flag.Int("gpu.chunks", 128, "chunks per codec in the throughput comparison")
	flagCorrupt    = flag.String("gpu.corrupt", "", "damage only the chunks whose name/kind matches this regexp (one process per codec and damage)")
	flagSeeds      = flag.Int("gpu.seeds", 8, "damaged copies of each chunk per kind of damage in the damaged-chunk tests")
)

// TestMain loads the libraries where the test's environment says they
// are (ZARRFS_NVCOMP_LIB and the Python environment, as zarrfs's command
// does): the package reads no environment, and the libraries load once per
// process, so every later Probe and New of the tests finds them.
func TestMain(m *testing.M) {
	flag.Parse()
	ptxOverride = *flagPTX
	getLibs(LibrariesFrom(os.Getenv))
	os.Exit(m.Run())
}

// vector is one entry of the codec package's test vectors: compressed bytes
// written by numcodecs and the bytes they decode to.
type vector struct {
	Name, Codec, Src, Raw string
}

const vectorDir = "../codec/testdata/vectors"

func loadVectors(t testing.TB) ([]vector, map[string][]byte, map[string][]byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorDir, "index.json"))
	if err != nil {
		t.Skipf("codec test vectors not available: %v", err)
	}
	var idx struct{ Vectors []vector }
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	src, raw := map[string][]byte{}, map[string][]byte{}
	for _, v := range idx.Vectors {
		if src[v.Name], err = os.ReadFile(filepath.Join(vectorDir, v.Src)); err != nil {
			t.Fatal(err)
		}
		if raw[v.Name], err = os.ReadFile(filepath.Join(vectorDir, "raw", v.Raw)); err != nil {
			t.Fatal(err)
		}
	}
	return idx.Vectors, src, raw
}

// field returns n float32s shaped like a reanalysis field (ERA5 2 m
// temperature, say): a smooth large-scale pattern plus small noise, as
// little-endian bytes.
func field(ny, nx int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, 4*nx*ny)
	phase := r.Float64() * 6
	for y := range ny {
		lat := math.Pi * (float64(y)/float64(ny) - 0.5)
		for x := range nx {
			lon := 2 * math.Pi * float64(x) / float64(nx)
			v := 255 + 35*math.Cos(lat) + 8*math.Sin(3*lon+phase)*math.Cos(2*lat) + 0.05*r.NormFloat64()
			binary.LittleEndian.PutUint32(b[4*(y*nx+x):], math.Float32bits(float32(v)))
		}
	}
	return b
}

var (
	zstdEncOnce sync.Once
	zstdEnc     *zstd.Encoder
)

func zstdCompress(b []byte, level int) []byte {
	zstdEncOnce.Do(func() {
		zstdEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(3)), zstd.WithEncoderCRC(true))
	})
	if level == 3 {
		return zstdEnc.EncodeAll(b, nil)
	}
	e, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(level)))
	return e.EncodeAll(b, nil)
}

// zstdNoCRC is a zstd frame without a content checksum, as numcodecs and
// zarr-python write by default.
func zstdNoCRC(b []byte) []byte {
	zstdNoCRCOnce.Do(func() {
		zstdNoCRCEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderCRC(false))
	})
	return zstdNoCRCEnc.EncodeAll(b, nil)
}

var (
	zstdNoCRCOnce sync.Once
	zstdNoCRCEnc  *zstd.Encoder
)

func lz4Block(b []byte) []byte {
	dst := make([]byte, lz4.CompressBlockBound(len(b)))
	n, err := lz4.CompressBlock(b, dst, nil)
	if err != nil {
		panic(err)
	}
	return dst[:n]
}

// compress encodes b with a codec the way numcodecs does.
func compress(name codec.Name, b []byte) []byte {
	var buf bytes.Buffer
	switch name {
	case codec.Zstd:
		return zstdCompress(b, 3)
	case codec.LZ4:
		out := binary.LittleEndian.AppendUint32(nil, uint32(len(b)))
		return append(out, lz4Block(b)...)
	case codec.Gzip:
		w, _ := gzip.NewWriterLevel(&buf, 5)
		w.Name = "chunk" // exercise the optional header fields
		w.Write(b)
		w.Close()
	case codec.Zlib:
		w, _ := zlib.NewWriterLevel(&buf, 5)
		w.Write(b)
		w.Close()
	default:
		panic(name)
	}
	return buf.Bytes()
}

// bloscCompress writes a Blosc 1 frame (format version 2) the way c-blosc
// does: blocks shuffled on their own, split in typesize streams when
// c-blosc would split, streams stored raw when they do not shrink.
func bloscCompress(data []byte, typesize, blocksize int, shuffle codec.BloscShuffle, comp string) []byte {
	codes := map[string]byte{"lz4": 1, "snappy": 2, "zlib": 3, "zstd": 4}
	flags := codes[comp] << 5
	switch shuffle {
	case codec.ByteShuffle:
		flags |= 0x01
	case codec.BitShuffle:
		flags |= 0x04
	}
	nbytes := len(data)
	blocksize = max(min(blocksize, nbytes)/typesize*typesize, typesize) // as c-blosc adjusts it
	nblocks := (nbytes + blocksize - 1) / blocksize
	out := make([]byte, 16+4*nblocks)
	out[0], out[1], out[2], out[3] = 2, 1, flags, byte(typesize)
	binary.LittleEndian.PutUint32(out[4:], uint32(nbytes))
	binary.LittleEndian.PutUint32(out[8:], uint32(blocksize))
	for i := range nblocks {
		binary.LittleEndian.PutUint32(out[16+4*i:], uint32(len(out)))
		off := i * blocksize
		n := min(blocksize, nbytes-off)
		blk := shuffleBlock(shuffle, data[off:off+n], typesize)
		ns := 1
		if typesize <= 16 && n/typesize >= 128 && n == blocksize {
			ns = typesize
		}
		ne := n / ns
		for j := range ns {
			s := blk[j*ne : (j+1)*ne]
			var c []byte
			switch comp {
			case "lz4":
				c = lz4Block(s)
			case "zstd":
				c = zstdNoCRC(s) // as c-blosc writes its streams
			case "snappy":
				c = s2.EncodeSnappy(nil, s)
			case "zlib":
				var buf bytes.Buffer
				w, _ := zlib.NewWriterLevel(&buf, 5)
				w.Write(s)
				w.Close()
				c = buf.Bytes()
			}
			if len(c) == 0 || len(c) >= len(s) {
				c = s // stored raw
			}
			out = binary.LittleEndian.AppendUint32(out, uint32(len(c)))
			out = append(out, c...)
		}
	}
	binary.LittleEndian.PutUint32(out[12:], uint32(len(out)))
	return out
}

// shuffleBlock is blosc's forward shuffle of one block.
func shuffleBlock(s codec.BloscShuffle, b []byte, typesize int) []byte {
	out := bytes.Clone(b)
	n := len(b) / typesize
	switch s {
	case codec.ByteShuffle:
		for i := range n {
			for j := range typesize {
				out[j*n+i] = b[i*typesize+j]
			}
		}
	case codec.BitShuffle:
		if n%8 != 0 {
			return out
		}
		clear(out[:n*typesize])
		for i := range n {
			for j := range typesize {
				for k := range 8 {
					bit := (b[i*typesize+j] >> k) & 1
					r := (j*8+k)*n + i
					out[r/8] |= bit << (r % 8)
				}
			}
		}
	}
	return out
}

// cpuAlgo decodes one nvCOMP piece on the CPU: the stand-in for nvCOMP in
// the emulation of the device pipeline.
func cpuAlgo(a int, dst, src []byte) error {
	var got []byte
	var err error
	switch a {
	case algoZstd:
		// nvCOMP checks no content checksum: the host (or xxh64_check) does.
		d, _ := zstd.NewReader(nil, zstd.IgnoreChecksum(true))
		defer d.Close()
		got, err = d.DecodeAll(src, nil)
	case algoLZ4:
		buf := make([]byte, len(dst))
		var n int
		n, err = lz4.UncompressBlock(src, buf)
		got = buf[:n]
	case algoDeflate:
		got, err = io.ReadAll(flate.NewReader(bytes.NewReader(src)))
	case algoSnappy:
		got, err = s2.Decode(nil, src)
	}
	if err != nil {
		return err
	}
	if len(got) != len(dst) {
		return fmt.Errorf("decoded %d bytes, want %d", len(got), len(dst))
	}
	copy(dst, got)
	return nil
}
