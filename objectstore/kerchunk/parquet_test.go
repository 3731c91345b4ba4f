package kerchunk_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/kerchunk"
	"github.com/zarrfs/zarrfs/objectstore/targets"
)

// openIn opens the reference set at name of dir ("" for a Parquet folder
// at dir), its targets resolved against base and confined to it.
func openIn(t testing.TB, dir, name, base string) *kerchunk.Store {
	t.Helper()
	tg, err := targets.New(targets.Options{Base: base, Scope: targets.Scope{Places: []targets.Place{{Prefix: base, Name: "the fixture's folder"}}}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kerchunk.Open(context.Background(), d, name, kerchunk.Options{Targets: tg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The Parquet folders kerchunk wrote from testdata/parquet/refs.json
// (testdata/make_parquet.py: paths as a dictionary and as plain strings,
// several record files per array) serve every key as the JSON form does:
// the same bytes, the same misses, the same listings.
func TestParquetMatchesJSON(t *testing.T) {
	base, err := filepath.Abs(filepath.Join("testdata", "parquet"))
	if err != nil {
		t.Fatal(err)
	}
	js := openIn(t, base, "refs.json", base)
	var doc struct{ Refs map[string]any }
	b, err := os.ReadFile(filepath.Join(base, "refs.json"))
	if err != nil || json.Unmarshal(b, &doc) != nil {
		t.Fatalf("refs.json: %v", err)
	}
	keys := []string{"t/3.1", "t/10.0", "t/0.2", "g/u/0", "g/s/1", "nope/0"} // not referenced
	for k := range doc.Refs {
		keys = append(keys, k)
	}
	ctx := context.Background()
	for _, form := range []string{"cat.parq", "plain.parq"} {
		pq := openIn(t, filepath.Join(base, form), "", base)
		chunks := 0
		for _, k := range keys {
			want, werr := js.Get(ctx, k)
			got, gerr := pq.Get(ctx, k)
			if objectstore.IsNotFound(werr) != objectstore.IsNotFound(gerr) || (werr == nil) != (gerr == nil) {
				t.Errorf("%s: %s: %v, want %v", form, k, gerr, werr)
				continue
			}
			if werr != nil {
				continue
			}
			if filepath.Base(k)[0] == '.' {
				// Metadata documents: the same JSON, not the same spacing.
				var w, g any
				if json.Unmarshal(want, &w) != nil || json.Unmarshal(got, &g) != nil || !reflect.DeepEqual(w, g) {
					t.Errorf("%s: %s = %s, want %s", form, k, got, want)
				}
				continue
			}
			chunks++
			if string(got) != string(want) {
				t.Errorf("%s: %s = %x, want %x", form, k, got, want)
			}
		}
		if chunks != 21 {
			t.Errorf("%s: %d chunks read, want 21", form, chunks)
		}
		for _, dir := range []string{"", "t", "g", "g/u", "g/s"} {
			want, werr := js.List(ctx, dir)
			got, gerr := pq.List(ctx, dir)
			if dir == "" {
				got = without(got, ".zmetadata")
			}
			if werr != nil || gerr != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: List(%q) = %v, %v; want %v, %v", form, dir, got, gerr, want, werr)
			}
		}
		var all []string
		if err := pq.ListVersions(ctx, "", func(k, _ string) { all = append(all, k) }); err != nil {
			t.Fatal(err)
		}
		sort.Strings(all)
		wantAll := without(append([]string(nil), keys[6:]...), "")
		sort.Strings(wantAll)
		if got := without(all, ".zmetadata"); !reflect.DeepEqual(got, wantAll) {
			t.Errorf("%s: ListVersions = %v, want %v", form, got, wantAll)
		}
	}
}

func without(names []string, drop string) []string {
	var out []string
	for _, n := range names {
		if n != drop {
			out = append(out, n)
		}
	}
	return out
}

// refs10k writes, with kerchunk, the Parquet form of the 10,000-file
// reference set of integration/bench/virtual/open_bench.py (t and q, one
// chunk a file, record_size 100,000: one record file of 100,000 rows per
// array, 10,000 of them set).
const refs10k = `import json, sys, kerchunk.df
N = 10_000
refs = {".zgroup": json.dumps({"zarr_format": 2})}
for v in ("t", "q"):
    refs[v + "/.zarray"] = json.dumps({"shape": [N, 181, 360], "chunks": [1, 181, 360], "dtype": "<f4",
        "fill_value": None, "order": "C", "compressor": None,
        "filters": [{"id": "shuffle", "elementsize": 4}, {"id": "zlib", "level": 1}], "zarr_format": 2})
    for k in range(N):
        refs[f"{v}/{k}.0.0"] = [f"nc10k/f{k:05d}.nc", 4096 + (0 if v == "t" else 200_000), 190_000 + k % 977]
kerchunk.df.refs_to_dataframe({"version": 1, "refs": refs}, sys.argv[1], record_size=100_000)
`

// Opening the 10,000-file Parquet reference set and listing both arrays,
// which reads and parses their record files (100,000 rows each). The set
// is written by kerchunk, or read from $ZARRFS_BENCH_PARQUET when set (a
// folder this benchmark wrote, for a machine without kerchunk).
func BenchmarkParquet10k(b *testing.B) {
	dir := os.Getenv("ZARRFS_BENCH_PARQUET")
	if dir == "" {
		dir = filepath.Join(b.TempDir(), "refs10k.parq")
		if out, err := exec.Command("python3", "-c", refs10k, dir).CombinedOutput(); err != nil {
			b.Skipf("writing the reference set with kerchunk: %v\n%s", err, out)
		}
	}
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		tg, err := targets.New(targets.Options{Base: filepath.Dir(dir)})
		if err != nil {
			b.Fatal(err)
		}
		d, err := objectstore.OpenPosix(dir)
		if err != nil {
			b.Fatal(err)
		}
		s, err := kerchunk.Open(ctx, d, "", kerchunk.Options{Targets: tg})
		if err != nil {
			b.Fatal(err)
		}
		for _, v := range []string{"t", "q"} {
			names, err := s.List(ctx, v)
			if err != nil || len(names) != 10_000+1 {
				b.Fatalf("List(%s): %d names, %v", v, len(names), err)
			}
		}
		s.Close()
	}
}
