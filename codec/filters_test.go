package codec

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// filterCase is one entry of testdata/filters/index.json, written by
// testdata/make_filter_vectors.py with numcodecs.
type filterCase struct {
	Name        string   `json:"name"`
	Chain       []string `json:"chain"` // encode order
	ElementSize int      `json:"elementsize"`
}

// filterJobs turns an encode-order chain into the decode steps zarr makes
// of it: fletcher32 last folds into the codec before it.
func filterJobs(c filterCase) []Name {
	var names []Name
	for i, f := range c.Chain {
		switch f {
		case "shuffle":
			names = append(names, ShuffleOf(c.ElementSize))
		case "zlib":
			names = append(names, Zlib)
		case "fletcher32":
			if i == 0 {
				names = append(names, Fletcher32Of(""))
			} else {
				names[len(names)-1] = Fletcher32Of(names[len(names)-1])
			}
		}
	}
	return names
}

func loadFilterCases(t testing.TB) ([]filterCase, string) {
	dir := filepath.Join("testdata", "filters")
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatalf("filter vectors missing (run testdata/make_filter_vectors.py): %v", err)
	}
	var cases []filterCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 50 {
		t.Fatalf("only %d filter vectors", len(cases))
	}
	return cases, dir
}

func TestFilterVectors(t *testing.T) {
	cases, dir := loadFilterCases(t)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			enc, err := os.ReadFile(filepath.Join(dir, c.Name+".enc"))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join(dir, c.Name+".raw"))
			if err != nil {
				t.Fatal(err)
			}
			cur := enc
			steps := filterJobs(c)
			for i := len(steps) - 1; i >= 0; i-- {
				dst := make([]byte, len(raw))
				if err := Decode(steps[i], dst, cur); err != nil {
					t.Fatalf("%s: %v", steps[i], err)
				}
				cur = dst
			}
			if !bytes.Equal(cur, raw) {
				t.Fatal("decoded bytes differ from numcodecs' input")
			}
			// A flipped byte fails a chain that carries a checksum.
			if steps[len(steps)-1] != ShuffleOf(c.ElementSize) && steps[len(steps)-1] != Zlib {
				bad := bytes.Clone(enc)
				bad[len(bad)/2] ^= 0x40
				dst := make([]byte, len(raw))
				if err := Decode(steps[len(steps)-1], dst, bad); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("corrupted chunk: %v, want ErrCorrupt", err)
				}
			}
		})
	}
}

func TestFletcher32Reference(t *testing.T) {
	// Values from numcodecs.Fletcher32 (stored little-endian).
	for _, c := range []struct {
		in   string
		want uint32
	}{{"abcd", 0x2629c4c6}, {"abcde", 0x4ff029c7}} {
		if got := Fletcher32([]byte(c.in)); got != c.want {
			t.Errorf("Fletcher32(%q) = %08x, want %08x", c.in, got, c.want)
		}
	}
	// HDF5 accepts the byte-swapped checksum of releases before 1.6.3.
	src := append([]byte("abcd"), 0x26, 0x29, 0xc4, 0xc6)
	src[4], src[5], src[6], src[7] = 0xc4, 0xc6, 0x26, 0x29
	if err := Decode(Fletcher32Of(""), make([]byte, 4), src); err != nil {
		t.Errorf("reversed checksum refused: %v", err)
	}
}

func TestFilterNamesRefused(t *testing.T) {
	for _, n := range []Name{"shuffle:0", "shuffle:x", "shuffle:-4", "fletcher32+fletcher32", "fletcher32+nope", "shufflex"} {
		if err := Decode(n, make([]byte, 8), make([]byte, 12)); err == nil {
			t.Errorf("%s: decoded", n)
		}
	}
	if err := Decode(Fletcher32Of(""), make([]byte, 4), []byte{1, 2}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("short fletcher32 chunk: %v", err)
	}
	if err := Decode(ShuffleOf(4), make([]byte, 8), make([]byte, 12)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("shuffle of the wrong size: %v", err)
	}
}

func FuzzFiltered(f *testing.F) {
	cases, dir := loadFilterCases(f)
	for _, c := range cases[:20] {
		enc, _ := os.ReadFile(filepath.Join(dir, c.Name+".enc"))
		steps := filterJobs(c)
		f.Add(string(steps[len(steps)-1]), enc, 64)
	}
	f.Fuzz(func(t *testing.T, name string, src []byte, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		dst := make([]byte, n)
		_ = Decode(Name(name), dst, src) // must not panic or write past dst
	})
}
