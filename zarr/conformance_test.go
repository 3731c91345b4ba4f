package zarr_test

// Conformance against stores written by independent implementations:
// tensorstore (internal/fixtures writes the stores and reference values) and zarr-python 3
// with numcodecs (generated at test time by integration/zarrpy/make_stores.py).
// Every value zarrfs reads must equal, bit for bit, what the writer's own
// reader returns.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/fixtures"
	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// findUp walks up from the working directory (the package directory under
// go test) looking for rel; it returns "" when no ancestor holds it.
func findUp(t *testing.T, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, rel)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// missing skips, or fails on CI where every dependency must be present.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	testenv.Missing(t, format, args...)
}

func openStore(t *testing.T, dir string) *zarr.Hierarchy {
	t.Helper()
	return openStoreWith(t, dir, zarr.Options{})
}

func openStoreWith(t *testing.T, dir string, opts zarr.Options) *zarr.Hierarchy {
	t.Helper()
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts.Logger = log
	h, err := zarr.Open(context.Background(), st, opts)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	if !slices.IsSortedFunc(h.Arrays, func(a, b *zarr.Array) int { return strings.Compare(a.Path, b.Path) }) {
		t.Errorf("%s: Arrays not sorted by path", dir)
	}
	return h
}

func findArray(h *zarr.Hierarchy, path string) *zarr.Array {
	for _, a := range h.Arrays {
		if a.Path == path {
			return a
		}
	}
	return nil
}

func dstFor(a *zarr.Array, count []int64) []byte {
	return make([]byte, product(count)*int64(a.DType.Size))
}

// readRegion reads one region of a, failing the test on error.
func readRegion(t *testing.T, h *zarr.Hierarchy, a *zarr.Array, start, count []int64) ([]byte, bool) {
	t.Helper()
	r := zarr.Request{Array: a, Start: start, Count: count, Dst: dstFor(a, count)}
	if err := h.Read(context.Background(), nil, []zarr.Request{r}); err != nil {
		t.Errorf("read %s start %v count %v: %v", a.Path, start, count, err)
		return nil, false
	}
	return r.Dst, true
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func equalInts(a, b []int64) bool {
	return len(a) == len(b) && (len(a) == 0 || slices.Equal(a, b))
}

// --- tensorstore ----------------------------------------------------------

type tsRef struct {
	Shape   []int64  `json:"shape"`
	DType   string   `json:"dtype"`
	Dims    []string `json:"dims"`
	Samples []string `json:"samples"`
	Whole   string   `json:"whole"`
}

func TestConformanceTensorstore(t *testing.T) {
	root := fixtures.Tensorstore(t)
	raw, err := os.ReadFile(filepath.Join(root, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref map[string]map[string]tsRef
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatalf("reference.json: %v", err)
	}
	if len(ref) == 0 {
		t.Fatal("reference.json lists no stores")
	}
	for _, store := range slices.Sorted(maps.Keys(ref)) {
		t.Run(store, func(t *testing.T) {
			h := openStore(t, filepath.Join(root, store))
			for _, path := range slices.Sorted(maps.Keys(ref[store])) {
				want := ref[store][path]
				t.Run(path, func(t *testing.T) {
					checkTensorstoreArray(t, h, root, store, path, want)
				})
			}
		})
	}
}

func checkTensorstoreArray(t *testing.T, h *zarr.Hierarchy, root, store, path string, want tsRef) {
	a := findArray(h, path)
	if a == nil {
		t.Fatalf("array %s not found", path)
	}
	if a.Unsupported != "" {
		t.Fatalf("array %s reported unsupported: %s", path, a.Unsupported)
	}
	if !equalInts(a.Shape, want.Shape) {
		t.Errorf("shape %v, want %v", a.Shape, want.Shape)
	}
	if got := a.DType.NumpyLE(); got != want.DType {
		t.Errorf("dtype %s, want %s", got, want.DType)
	}
	if !slices.Equal(a.Dims, want.Dims) {
		t.Errorf("dims %q, want %q", a.Dims, want.Dims)
	}
	npy, err := readNpy(filepath.Join(root, store+"__"+strings.ReplaceAll(path, "/", "_")+".ref.npy"))
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	if npy.Descr != want.DType || !equalInts(npy.Shape, want.Shape) {
		t.Fatalf("reference npy is %s %v, reference.json says %s %v", npy.Descr, npy.Shape, want.DType, want.Shape)
	}
	whole, ok := readRegion(t, h, a, make([]int64, len(a.Shape)), a.Shape)
	if !ok {
		return
	}
	sameBytes(t, "whole array vs .ref.npy", whole, npy.Data, npy.Descr)
	if want.Whole != "" {
		if got := sha(whole); got != want.Whole {
			t.Errorf("whole array sha256 %s, reference.json %s", got, want.Whole)
		}
	}
	if len(want.Samples) == 0 {
		return
	}
	td := slices.Index(want.Dims, "time")
	if td < 0 {
		t.Fatalf("samples listed but no time dimension in %q", want.Dims)
	}
	if int64(len(want.Samples)) != want.Shape[td] {
		t.Fatalf("%d sample hashes for %d time steps", len(want.Samples), want.Shape[td])
	}
	for i, wantSum := range want.Samples {
		start := make([]int64, len(want.Shape))
		count := slices.Clone(want.Shape)
		start[td], count[td] = int64(i), 1
		got, ok := readRegion(t, h, a, start, count)
		if !ok {
			continue
		}
		if s := sha(got); s != wantSum {
			t.Errorf("sample %d sha256 %s, reference.json %s", i, s, wantSum)
		}
		sameBytes(t, fmt.Sprintf("sample %d vs .ref.npy", i), got,
			extract(npy.Data, npy.Shape, a.DType.Size, start, count), npy.Descr)
	}
}

// --- zarr-python ----------------------------------------------------------

type pyArray struct {
	Store       string   `json:"store"`
	Path        string   `json:"path"`
	Ref         string   `json:"ref"`
	ZarrFormat  int      `json:"zarr_format"`
	Shape       []int64  `json:"shape"`
	Chunks      []int64  `json:"chunks"`
	InnerChunks []int64  `json:"inner_chunks"`
	DType       string   `json:"dtype"`
	SourceDType string   `json:"source_dtype"`
	DataType    string   `json:"data_type"`
	Dims        []string `json:"dims"`
	FillValue   any      `json:"fill_value"`
	Unsupported bool     `json:"unsupported"`
	Note        string   `json:"note"`
}

type pyManifest struct {
	Writer map[string]string `json:"writer"`
	Arrays []pyArray         `json:"arrays"`
}

// makeZarrPyStores runs make_stores.py into a fresh temporary directory.
func makeZarrPyStores(t *testing.T) (string, *pyManifest) {
	t.Helper()
	script := findUp(t, filepath.Join("integration", "zarrpy"))
	if script == "" {
		t.Fatal("integration/zarrpy not found above the package directory")
	}
	script = filepath.Join(script, "make_stores.py")
	py, err := exec.LookPath("python3")
	if err != nil {
		missing(t, "python3 not on PATH: the zarr-python conformance stores need python3 with zarr>=3 and numcodecs (make pydeps)")
	}
	probe := exec.Command(py, "-c", "import zarr, numcodecs, numpy; assert int(zarr.__version__.split('.')[0]) >= 3, zarr.__version__")
	if out, err := probe.CombinedOutput(); err != nil {
		missing(t, "zarr-python 3 and numcodecs are not importable by %s (make pydeps installs them): %v\n%s", py, err, out)
	}
	dir := t.TempDir()
	cmd := exec.Command(py, script, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(script), dir, err, out)
	} else {
		t.Logf("%s", bytes.TrimSpace(out))
	}
	raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m pyManifest
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber() // fill values such as 2^64-1 must keep every digit
	if err := d.Decode(&m); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(m.Arrays) == 0 {
		t.Fatal("manifest lists no arrays")
	}
	t.Logf("writer: %v", m.Writer)
	return dir, &m
}

func TestConformanceZarrPython(t *testing.T) {
	testConformanceZarrPython(t, zarr.Options{})
}

// Partial reads of every chunk whose codecs allow them (blosc of every
// inner codec and shuffle, memcpyed frames, split and unsplit blocks, a
// short last block; raw bytes; inner chunks of shards) give what
// zarr-python reads, for every region testRegions picks.
func TestConformanceZarrPythonPartial(t *testing.T) {
	testConformanceZarrPython(t, zarr.Options{Partial: zarr.PartialAlways, Stats: &partialStats})
	if n := partialStats.ChunksPartial.Load(); n < 200 {
		t.Fatalf("only %d chunks read in part", n)
	} else {
		t.Logf("%d chunks read in part, %d decoded", n, partialStats.ChunksDecoded.Load())
	}
}

var partialStats zarr.Stats

func testConformanceZarrPython(t *testing.T, opts zarr.Options) {
	dir, m := makeZarrPyStores(t)
	byStore := map[string][]pyArray{}
	for _, a := range m.Arrays {
		byStore[a.Store] = append(byStore[a.Store], a)
	}
	for _, store := range slices.Sorted(maps.Keys(byStore)) {
		recs := byStore[store]
		t.Run(store, func(t *testing.T) {
			h := openStoreWith(t, filepath.Join(dir, store), opts)
			var got, want []string
			for _, a := range h.Arrays {
				got = append(got, a.Path)
			}
			for _, r := range recs {
				want = append(want, r.Path)
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("arrays found %q, want %q", got, want)
			}
			for _, r := range recs {
				t.Run(r.Path, func(t *testing.T) { checkPyArray(t, h, dir, r) })
			}
			checkBatch(t, h, dir, recs)
		})
	}
}

func checkPyArray(t *testing.T, h *zarr.Hierarchy, dir string, r pyArray) {
	a := findArray(h, r.Path)
	if a == nil {
		t.Fatalf("array %s not found", r.Path)
	}
	if a.ZarrFormat != r.ZarrFormat {
		t.Errorf("zarr format %d, want %d", a.ZarrFormat, r.ZarrFormat)
	}
	if !equalInts(a.Shape, r.Shape) {
		t.Errorf("shape %v, want %v", a.Shape, r.Shape)
	}
	if r.Unsupported {
		// The array is listed with a reason; reading it fails cleanly.
		if a.Unsupported == "" {
			t.Fatalf("array %s (%s) should be reported unsupported", r.Path, r.Note)
		}
		t.Logf("unsupported as expected: %s", a.Unsupported)
		req := zarr.Request{Array: a, Start: make([]int64, len(r.Shape)), Count: r.Shape,
			Dst: make([]byte, product(r.Shape)*8)}
		if err := h.Read(context.Background(), nil, []zarr.Request{req}); err == nil {
			t.Errorf("read of unsupported array %s succeeded", r.Path)
		}
		return
	}
	if a.Unsupported != "" {
		t.Fatalf("array %s reported unsupported: %s", r.Path, a.Unsupported)
	}
	checkPyMetadata(t, a, r)
	npy, err := readNpy(filepath.Join(dir, r.Ref))
	if err != nil {
		t.Fatalf("reference %s: %v", r.Ref, err)
	}
	if npy.Descr != r.DType || !equalInts(npy.Shape, r.Shape) {
		t.Fatalf("reference npy is %s %v, manifest says %s %v", npy.Descr, npy.Shape, r.DType, r.Shape)
	}
	whole, ok := readRegion(t, h, a, make([]int64, len(r.Shape)), r.Shape)
	if ok {
		sameBytes(t, "whole array", whole, npy.Data, npy.Descr)
	}
	regions := testRegions(r)
	if len(regions) == 0 {
		return
	}
	// Each region alone, then all of them in one Read call.
	reqs := make([]zarr.Request, len(regions))
	for i, g := range regions {
		want := extract(npy.Data, npy.Shape, a.DType.Size, g.start, g.count)
		if got, ok := readRegion(t, h, a, g.start, g.count); ok {
			sameBytes(t, fmt.Sprintf("region start %v count %v", g.start, g.count), got, want, npy.Descr)
		}
		reqs[i] = zarr.Request{Array: a, Start: g.start, Count: g.count, Dst: dstFor(a, g.count)}
	}
	if err := h.Read(context.Background(), nil, reqs); err != nil {
		t.Fatalf("batched read of %d regions: %v", len(reqs), err)
	}
	for i, g := range regions {
		want := extract(npy.Data, npy.Shape, a.DType.Size, g.start, g.count)
		sameBytes(t, fmt.Sprintf("batched region start %v count %v", g.start, g.count), reqs[i].Dst, want, npy.Descr)
	}
}

// checkBatch reads every readable array of a store in one Read call.
func checkBatch(t *testing.T, h *zarr.Hierarchy, dir string, recs []pyArray) {
	var reqs []zarr.Request
	var refs []*npyArray
	for _, r := range recs {
		a := findArray(h, r.Path)
		if r.Unsupported || a == nil || a.Unsupported != "" {
			continue
		}
		npy, err := readNpy(filepath.Join(dir, r.Ref))
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, zarr.Request{Array: a, Start: make([]int64, len(r.Shape)), Count: r.Shape, Dst: dstFor(a, r.Shape)})
		refs = append(refs, npy)
	}
	if len(reqs) == 0 {
		return
	}
	if err := h.Read(context.Background(), nil, reqs); err != nil {
		t.Fatalf("one Read of all %d arrays: %v", len(reqs), err)
	}
	for i, q := range reqs {
		sameBytes(t, "batched whole "+q.Array.Path, q.Dst, refs[i].Data, refs[i].Descr)
	}
}

func checkPyMetadata(t *testing.T, a *zarr.Array, r pyArray) {
	t.Helper()
	if !equalInts(a.Chunks, r.Chunks) {
		t.Errorf("chunks %v, want %v", a.Chunks, r.Chunks)
	}
	if got := a.DType.NumpyLE(); got != r.DType {
		t.Errorf("dtype %s, want %s", got, r.DType)
	}
	if r.ZarrFormat == 2 {
		if got := a.DType.NumpySource(); got != r.SourceDType {
			t.Errorf("source dtype %s, want %s", got, r.SourceDType)
		}
	} else if got := a.DType.Name(); got != r.DataType {
		t.Errorf("data type %s, want %s", got, r.DataType)
	}
	if !slices.Equal(a.Dims, r.Dims) && !(len(a.Dims) == 0 && len(r.Dims) == 0) {
		t.Errorf("dims %q, want %q", a.Dims, r.Dims)
	}
	if len(a.Codecs) == 0 && r.ZarrFormat == 3 {
		t.Errorf("no codec names reported")
	}
	if err := sameFill(a.FillValue, r.FillValue); err != nil {
		t.Errorf("fill value: %v", err)
	}
}

// sameFill compares the fill value zarrfs reports with the one in the
// metadata. Numbers must agree in value (a float's sign of zero included);
// the special strings may come back as strings or as float64 values; a hex
// bit pattern may come back verbatim or as its float64 value.
func sameFill(got, want any) error {
	mismatch := fmt.Errorf("got %v (%T), metadata has %v", got, got, want)
	switch w := want.(type) {
	case nil:
		if got == nil || numericValue(got) == 0 || got == false {
			return nil
		}
		return mismatch
	case bool:
		if g, ok := got.(bool); ok && g == w {
			return nil
		}
		return mismatch
	case json.Number:
		s := w.String()
		if !strings.ContainsAny(s, ".eE") {
			if fmt.Sprint(got) == s {
				return nil
			}
			if f, ok := got.(float64); ok {
				if wf, _ := strconv.ParseFloat(s, 64); wf == f {
					return nil
				}
			}
			return mismatch
		}
		wf, _ := strconv.ParseFloat(s, 64)
		if f, ok := got.(float64); ok && math.Float64bits(f) == math.Float64bits(wf) {
			return nil
		}
		return mismatch
	case string:
		if g, ok := got.(string); ok && g == w {
			return nil
		}
		f, ok := got.(float64)
		if !ok {
			return mismatch
		}
		switch w {
		case "NaN":
			ok = math.IsNaN(f)
		case "Infinity":
			ok = math.IsInf(f, 1)
		case "-Infinity":
			ok = math.IsInf(f, -1)
		default:
			wf, err := hexFloat(w)
			ok = err == nil && (math.Float64bits(wf) == math.Float64bits(f) || math.IsNaN(wf) && math.IsNaN(f))
		}
		if ok {
			return nil
		}
		return mismatch
	}
	return fmt.Errorf("unexpected fill value %v (%T) in manifest", want, want)
}

func numericValue(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	}
	return math.NaN()
}

// hexFloat decodes a v3 hex fill value by its width (4, 8 or 16 digits).
func hexFloat(s string) (float64, error) {
	u, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
	if err != nil {
		return 0, err
	}
	switch len(s) - 2 {
	case 4:
		return float16ToFloat64(uint16(u)), nil
	case 8:
		return float64(math.Float32frombits(uint32(u))), nil
	case 16:
		return math.Float64frombits(u), nil
	}
	return 0, errors.New("hex fill value of odd width")
}

func float16ToFloat64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, frac := int(h>>10&0x1f), float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 31:
		if frac != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	}
	return sign * math.Ldexp(1+frac/1024, exp-15)
}

type region struct{ start, count []int64 }

// testRegions picks sub-regions of an array: random ones from a seed fixed
// by the array's name (so a failure reproduces), and ones placed to straddle
// chunk and inner-chunk (shard) boundaries in every dimension.
func testRegions(r pyArray) []region {
	nd := len(r.Shape)
	if nd == 0 || product(r.Shape) == 0 {
		return nil
	}
	h := fnv.New64a()
	h.Write([]byte(r.Store + "/" + r.Path))
	rng := rand.New(rand.NewPCG(1, h.Sum64()))
	var out []region
	for range 6 {
		g := region{make([]int64, nd), make([]int64, nd)}
		for d, n := range r.Shape {
			g.start[d] = rng.Int64N(n)
			g.count[d] = 1 + rng.Int64N(n-g.start[d])
		}
		out = append(out, g)
	}
	for _, c := range [][]int64{r.Chunks, r.InnerChunks} {
		if len(c) != nd {
			continue
		}
		g := region{make([]int64, nd), make([]int64, nd)}
		for d, n := range r.Shape {
			g.start[d], g.count[d] = 0, n
			if c[d] < n {
				// From the last element of the first chunk across at least one boundary.
				g.start[d] = c[d] - 1
				g.count[d] = min(n-g.start[d], c[d]+2)
			}
		}
		out = append(out, g)
	}
	// A single element at the far corner: the last, possibly partial, chunk.
	g := region{make([]int64, nd), make([]int64, nd)}
	for d, n := range r.Shape {
		g.start[d], g.count[d] = n-1, 1
	}
	return append(out, g)
}
