package codec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// vector is one entry of testdata/vectors/index.json, written by
// testdata/make_vectors.py with numcodecs.
type vector struct {
	Name   string         `json:"name"`
	Codec  Name           `json:"codec"`
	Src    string         `json:"src"`
	Raw    string         `json:"raw"`
	Params map[string]any `json:"params"`
	Flags  int            `json:"flags"`

	src, raw []byte
}

func loadVectors(tb testing.TB) []vector {
	tb.Helper()
	dir := filepath.Join("testdata", "vectors")
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		tb.Fatalf("test vectors missing (run testdata/make_vectors.py): %v", err)
	}
	var idx struct {
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		tb.Fatal(err)
	}
	if len(idx.Vectors) < 100 {
		tb.Fatalf("only %d vectors", len(idx.Vectors))
	}
	for i := range idx.Vectors {
		v := &idx.Vectors[i]
		if v.src, err = os.ReadFile(filepath.Join(dir, v.Src)); err != nil {
			tb.Fatal(err)
		}
		if v.raw, err = os.ReadFile(filepath.Join(dir, "raw", v.Raw)); err != nil {
			tb.Fatal(err)
		}
	}
	return idx.Vectors
}

func TestVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			// Guard bytes after dst catch writes past len(dst).
			buf := bytes.Repeat([]byte{0xa5}, len(v.raw)+64)
			dst := buf[:len(v.raw)]
			if err := Decode(v.Codec, dst, v.src); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !bytes.Equal(dst, v.raw) {
				t.Fatalf("decoded bytes differ from numcodecs' input (first difference at %d)", firstDiff(dst, v.raw))
			}
			for i, c := range buf[len(v.raw):] {
				if c != 0xa5 {
					t.Fatalf("wrote past dst at +%d", i)
				}
			}
			// One byte more or less than the true size is corrupt.
			for _, n := range []int{len(v.raw) + 1, len(v.raw) - 1} {
				if n < 0 {
					continue
				}
				err := Decode(v.Codec, make([]byte, n), v.src)
				if !errors.Is(err, ErrCorrupt) {
					t.Errorf("Decode into %d bytes (true size %d): err %v, want ErrCorrupt", n, len(v.raw), err)
				}
			}
		})
	}
}

// TestBloscVectorsParse decodes every blosc vector the way the GPU path
// does: ParseBlosc, every stream on its own into a shuffled buffer, then the
// frame's block-wise unshuffle. It must agree with Decode and numcodecs.
func TestBloscVectorsParse(t *testing.T) {
	d := newDecoder()
	for _, v := range loadVectors(t) {
		if v.Codec != Blosc {
			continue
		}
		t.Run(v.Name, func(t *testing.T) {
			f, err := ParseBlosc(v.src)
			if err != nil {
				t.Fatal(err)
			}
			if f.NBytes != len(v.raw) {
				t.Fatalf("NBytes %d, want %d", f.NBytes, len(v.raw))
			}
			if ts, ok := v.Params["typesize"].(float64); ok && int(ts) != f.Typesize {
				t.Errorf("Typesize %d, want %v", f.Typesize, ts)
			}
			if cn, ok := v.Params["cname"].(string); ok && !f.Memcpyed {
				want := cn
				if cn == "lz4hc" {
					want = "lz4"
				}
				if f.Compressor != want {
					t.Errorf("Compressor %q, want %q", f.Compressor, want)
				}
			}
			shuffled := make([]byte, f.NBytes)
			covered := 0
			for i, s := range f.Streams {
				out := shuffled[s.DstOff : s.DstOff+s.DstLen]
				if s.Raw {
					copy(out, s.Src)
				} else {
					comp := map[string]int{"blosclz": bloscBlosclz, "lz4": bloscLZ4, "zlib": bloscZlib, "zstd": bloscZstd}[f.Compressor]
					if err := d.decodeBloscStream(comp, out, s.Src); err != nil {
						t.Fatalf("stream %d: %v", i, err)
					}
				}
				covered += s.DstLen
			}
			if covered != f.NBytes {
				t.Fatalf("streams cover %d bytes of %d", covered, f.NBytes)
			}
			got := make([]byte, f.NBytes)
			if err := f.Unshuffle(got, shuffled); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, v.raw) {
				t.Fatalf("differs from numcodecs' input at %d", firstDiff(got, v.raw))
			}
		})
	}
}

// TestBloscVectorsCoverage checks that the vectors exercise what they are
// meant to: every shuffle, split and unsplit blocks, raw streams, memcpyed
// frames, several blocks and a partial last block.
func TestBloscVectorsCoverage(t *testing.T) {
	var split, unsplit, raw, memcpyed, multi, partial int
	shuffles := map[BloscShuffle]int{}
	for _, v := range loadVectors(t) {
		if v.Codec != Blosc {
			continue
		}
		f, err := ParseBlosc(v.src)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		shuffles[f.Shuffle]++
		if f.Memcpyed {
			memcpyed++
			continue
		}
		if f.NumBlocks() > 1 {
			multi++
		}
		if f.NBytes%max(f.BlockSize, 1) != 0 {
			partial++
		}
		if len(f.Streams) > f.NumBlocks() {
			split++
		} else if f.Typesize > 1 {
			unsplit++
		}
		for _, s := range f.Streams {
			if s.Raw {
				raw++
				break
			}
		}
	}
	t.Logf("split %d unsplit %d raw %d memcpyed %d multiblock %d partial %d shuffles %v",
		split, unsplit, raw, memcpyed, multi, partial, shuffles)
	for name, n := range map[string]int{"split": split, "unsplit": unsplit, "raw stream": raw,
		"memcpyed": memcpyed, "multi-block": multi, "partial last block": partial,
		"noshuffle": shuffles[NoShuffle], "shuffle": shuffles[ByteShuffle], "bitshuffle": shuffles[BitShuffle]} {
		if n == 0 {
			t.Errorf("no blosc vector with a %s", name)
		}
	}
}

func TestCPUVectors(t *testing.T) {
	vs := loadVectors(t)
	c := must(NewCPU(Options{Workers: 3}))
	defer c.Close()
	jobs := make([]Job, len(vs))
	for i, v := range vs {
		jobs[i] = Job{Codec: v.Codec, Src: v.src, Dst: make([]byte, len(v.raw))}
	}
	// A job that fails must not disturb the others.
	jobs = append(jobs, Job{Codec: "snappy", Src: []byte{1}, Dst: make([]byte, 1)},
		Job{Codec: Zstd, Src: []byte("not zstd"), Dst: make([]byte, 10)})
	if err := c.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	for i, v := range vs {
		if jobs[i].Err != nil || !bytes.Equal(jobs[i].Dst, v.raw) {
			t.Errorf("%s: err %v, equal %v", v.Name, jobs[i].Err, bytes.Equal(jobs[i].Dst, v.raw))
		}
	}
	if err := jobs[len(vs)].Err; !errors.Is(err, ErrUnsupported) {
		t.Errorf("snappy job: %v, want ErrUnsupported", err)
	}
	if err := jobs[len(vs)+1].Err; !errors.Is(err, ErrCorrupt) {
		t.Errorf("garbage zstd job: %v, want ErrCorrupt", err)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
