package fill

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"context"
	"hash/fnv"
	"path/filepath"
	"testing"

	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// noise is a value that does not compress: a hash of the index.
func noise(idx []int64) float64 {
	h := fnv.New64a()
	for _, x := range idx {
		h.Write([]byte{byte(x), byte(x >> 8)})
	}
	return float64(h.Sum64()%(1<<24)) / (1 << 24)
}

// A view's fillCost bounds what the one Read of its samples holds: the
// samples, the compressed chunks it fetched and every chunk it decoded
// into a buffer of its own (measured: the chunks decoded less the bytes
// decoded straight into the samples, which are the samples' bytes less
// those copied). Channels that read one chunk cost it once, as the Read
// decodes it once.
func TestViewFillCostBoundsTheRead(t *testing.T) {
	const ny, nx = 32, 64
	for _, tc := range []struct {
		name     string
		qchunks  []int64 // q is (time 4, level 4, y, x)
		channels string
		ks       []int64
		once     bool // the view reads q's chunks of one sample and must be charged them once
	}{
		{"every level of one chunk", []int64{1, 4, ny, nx}, "      - var: q\n        select: {level: all}\n", []int64{1}, false},
		{"levels 0 and 2 of one chunk", []int64{1, 4, ny, nx}, "      - var: q\n        select: {level: [0, 2]}\n", []int64{1}, true},
		{"levels 0 and 2, two samples", []int64{1, 4, ny, nx}, "      - var: q\n        select: {level: [0, 2]}\n", []int64{1, 2}, false},
		{"every level, beside another channel", []int64{1, 4, ny, nx}, "      - var: s\n      - var: q\n        select: {level: all}\n", []int64{0, 1}, false},
		{"chunks two samples thick", []int64{2, 4, ny, nx}, "      - var: s\n      - var: q\n        select: {level: all}\n", []int64{0, 1}, false},
		{"chunks two samples thick, one sample", []int64{2, 4, ny, nx}, "      - var: q\n        select: {level: all}\n", []int64{1}, false},
		{"a level per chunk", []int64{1, 1, ny, nx}, "      - var: q\n        select: {level: [3, 2, 1]}\n", []int64{0, 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "s.zarr")
			viewtest.WriteStore(t, dir, []storeArray{
				{Path: "q", DType: "float32", Shape: []int64{4, 4, ny, nx}, Chunks: tc.qchunks, Dims: []string{"time", "level", "y", "x"}, Value: noise},
				{Path: "s", DType: "float32", Shape: []int64{4, ny, nx}, Chunks: []int64{1, ny, nx}, Dims: []string{"time", "y", "x"}, Value: noise},
			})
			stats := &zarr.Stats{}
			h := viewtest.OpenStore(t, dir, zarr.Options{ChunkCacheBytes: -1, Stats: stats})
			defer h.Close()
			specs, err := layout.ParseViews("v.yaml", []byte("views:\n  - name: v\n    channels:\n"+tc.channels))
			if err != nil {
				t.Fatal(err)
			}
			views, err := layout.BindViews(context.Background(), h, specs, layout.BindOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v := views[0]
			data := prod(v.SampleShape) * int64(v.DType.Size)
			n := int64(len(tc.ks))
			outs := make([][]byte, n)
			for i := range outs {
				outs[i] = make([]byte, data)
			}
			if err := newFiller(t, Options{Reader: h}).run(nil, nil).fillSamples(context.Background(), v, tc.ks, outs); err != nil {
				t.Fatal(err)
			}
			inPlace := n*data - stats.BytesAssembled.Load()
			held := n*data + stats.BytesFetched.Load() + stats.BytesDecoded.Load() - inPlace
			cost := fillCost(v, data, tc.ks)
			if cost < held {
				t.Errorf("fillCost %d, but the Read held %d: %d of samples, %d fetched, %d decoded (%d of them in place)",
					cost, held, n*data, stats.BytesFetched.Load(), stats.BytesDecoded.Load(), inPlace)
			}
			if tc.once {
				q := h.Array("q")
				start, count := v.Channels[0].Region(v.Start + tc.ks[0]*v.Step)
				if want := n*data + q.ReadCost(start, count); cost != want {
					t.Errorf("fillCost %d, want %d: the chunk the channels share charged once", cost, want)
				}
			}
		})
	}
}
