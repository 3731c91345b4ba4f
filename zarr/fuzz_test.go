package zarr_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

func openPosix(dir string) (objectstore.Store, error) { return objectstore.OpenPosix(dir) }

// fixtureDocs returns the metadata documents of the tensorstore fixtures
// (seeds for the metadata fuzzers), when the shared fixtures are present.
func fixtureDocs(f *testing.F, name string) [][]byte {
	var out [][]byte
	root := findShared()
	if root == "" {
		return nil
	}
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && filepath.Base(p) == name {
			if b, err := os.ReadFile(p); err == nil {
				out = append(out, b)
			}
		}
		return nil
	})
	return out
}

func findShared() string {
	dir, _ := filepath.Abs(".")
	for range 6 {
		p := filepath.Join(dir, "shared", "fixtures", "tensorstore")
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
		dir = filepath.Dir(dir)
	}
	return ""
}

// readAll opens the store and reads every supported array whole; it must
// never panic, whatever the store holds.
func readAll(files map[string][]byte) {
	h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		return
	}
	for _, a := range h.Arrays {
		if a.Unsupported != "" {
			continue
		}
		n := int64(a.DType.Size)
		for _, s := range a.Shape {
			n *= s
		}
		if n > 1<<22 {
			continue
		}
		dst := make([]byte, n)
		_ = h.Read(context.Background(), []zarr.Request{{Array: a, Start: make([]int64, len(a.Shape)), Count: a.Shape, Dst: dst}})
	}
}

func FuzzV3Metadata(f *testing.F) {
	for _, d := range fixtureDocs(f, "zarr.json") {
		f.Add(d)
	}
	files, _ := shardedStore(f, false)
	f.Add(files["zarr.json"])
	f.Fuzz(func(t *testing.T, doc []byte) {
		readAll(map[string][]byte{"zarr.json": doc, "c/0/0": {1, 2, 3}, "c/0": {0}})
	})
}

func FuzzV2Metadata(f *testing.F) {
	for _, d := range fixtureDocs(f, ".zarray") {
		f.Add(d)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		readAll(map[string][]byte{".zarray": doc, "0": {1, 2, 3, 4}, "0.0": {0}, "0.0.0": {0, 0}})
	})
}

func FuzzShardIndex(f *testing.F) {
	base, _ := shardedStore(f, false)
	f.Add(base["c/0/0"])
	start, _ := shardedStore(f, true)
	f.Add(start["c/0/0"])
	f.Fuzz(func(t *testing.T, shard []byte) {
		readAll(map[string][]byte{"zarr.json": base["zarr.json"], "c/0/0": shard})
	})
}

// FuzzChunkDecode feeds arbitrary chunk bytes through every pipeline of the
// fixtures (blosc, zstd, gzip + crc32c, transpose, big endian, sharding).
func FuzzChunkDecode(f *testing.F) {
	docs := fixtureDocs(f, "zarr.json")
	v2 := fixtureDocs(f, ".zarray")
	if len(docs)+len(v2) == 0 {
		f.Skip("shared fixtures not found")
	}
	f.Add(uint8(0), []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0})
	f.Add(uint8(1), []byte{2, 1, 0x21, 4, 16, 0, 0, 0, 16, 0, 0, 0, 32, 0, 0, 0})
	f.Fuzz(func(t *testing.T, which uint8, chunk []byte) {
		i := int(which) % (len(docs) + len(v2))
		if i < len(docs) {
			files := map[string][]byte{"zarr.json": docs[i]}
			for _, k := range []string{"c/0", "c/0/0", "c/0/0/0", "c/0/0/0/0", "c.0.0"} {
				files[k] = chunk
			}
			readAll(files)
			return
		}
		files := map[string][]byte{".zarray": v2[i-len(docs)]}
		for _, k := range []string{"0", "0.0", "0.0.0", "0/0/0"} {
			files[k] = chunk
		}
		readAll(files)
	})
}
