package fill

import (
	"errors"
	"io/fs"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/viewtest"
	"github.com/zarrfs/zarrfs/layout"
)

func TestParseSampleSpan(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want *SampleSpan
	}{
		{"", nil},
		{"4:10", &SampleSpan{4, 10}},
		{":10", &SampleSpan{0, 10}},
		{"4:", &SampleSpan{4, -1}},
		{":", &SampleSpan{0, -1}},
		{"3:3", &SampleSpan{3, 3}},
	} {
		got, err := ParseSampleSpan(tt.in)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseSampleSpan(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"5", "a:3", "-1:3", "5:4", "1:b", "1:-2"} {
		if _, err := ParseSampleSpan(bad); !errors.Is(err, ErrInvalidSpan) {
			t.Errorf("ParseSampleSpan(%q): %v, want ErrInvalidSpan", bad, err)
		}
	}
}

// planSamples returns, per sample directory, the sample indices a plan
// holds, and the whole files it holds.
func planSamples(t *testing.T, p *Selection) (map[string][]int64, []string) {
	t.Helper()
	samples := map[string][]int64{}
	var files []string
	for _, b := range p.Blobs {
		dir, name := path.Split(b.Path())
		k, err := strconv.ParseInt(strings.TrimSuffix(name, ".npy"), 10, 64)
		if dir == "" || err != nil {
			files = append(files, b.Path())
			continue
		}
		samples[strings.TrimSuffix(dir, "/")] = append(samples[strings.TrimSuffix(dir, "/")], k)
	}
	return samples, files
}

// A warm's plan: --samples START:STOP is split among the ranks, in arrays
// (12 and 10 samples) and a view (6 samples), in both shardings; whole
// files go to every rank; the layout's own Shard does not change a plan.
func TestPlanSamplesAndShard(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, "views:\n  - name: train\n    dtype: float32\n    samples: {start: 1, stop: 12, step: 2}\n    channels:\n      - var: u10\n      - var: t\n        select: {level: all}\n")
	if err != nil {
		t.Fatal(err)
	}
	full, err := layout.Build(h, layout.Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	sharded, err := layout.Build(h, layout.Options{Views: views, Shard: layout.Shard{Rank: 1, World: 3}})
	if err != nil {
		t.Fatal(err)
	}
	all, err := Select(full, SelectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var everyFile []string
	_, everyFile = planSamples(t, all)
	for _, tc := range []struct {
		name    string
		samples string
		shard   layout.Shard
		want    map[string][]int64 // directory: samples
	}{
		{"contiguous rank 0", "4:10", layout.Shard{Rank: 0, World: 2},
			map[string][]int64{"t": {4, 5, 6}, "q": {4, 5, 6}, "train": {4}}},
		{"contiguous rank 1", "4:10", layout.Shard{Rank: 1, World: 2},
			map[string][]int64{"t": {7, 8, 9}, "q": {7, 8, 9}, "train": {5}}},
		{"interleaved rank 0", "4:10", layout.Shard{Rank: 0, World: 2, Interleaved: true},
			map[string][]int64{"t": {4, 6, 8}, "q": {4, 6, 8}, "train": {4}}},
		{"interleaved rank 1", "4:10", layout.Shard{Rank: 1, World: 2, Interleaved: true},
			map[string][]int64{"t": {5, 7, 9}, "q": {5, 7, 9}, "train": {5}}},
		{"range past the end", "8:100", layout.Shard{Rank: 1, World: 2},
			map[string][]int64{"t": {10, 11}, "q": {9}, "train": nil}},
		{"no range", "", layout.Shard{Rank: 2, World: 3},
			map[string][]int64{"t": {8, 9, 10, 11}, "q": {6, 7, 8, 9}, "train": {4, 5}}},
		{"no shard", "10:", layout.Shard{},
			map[string][]int64{"t": {10, 11}, "q": nil, "train": nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseSampleSpan(tc.samples)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range []*layout.Layout{full, sharded} {
				p, err := Select(l, SelectOptions{Samples: r, Shard: tc.shard})
				if err != nil {
					t.Fatal(err)
				}
				got, files := planSamples(t, p)
				for dir, want := range tc.want {
					if !slices.Equal(got[dir], want) {
						t.Errorf("%s: samples %v, want %v", dir, got[dir], want)
					}
				}
				if !slices.Equal(got["sub/sp"], got["t"]) {
					t.Errorf("sub/sp: samples %v, want those of t, %v", got["sub/sp"], got["t"])
				}
				if !slices.Equal(files, everyFile) {
					t.Errorf("whole files %v, want every one: %v", files, everyFile)
				}
				var bytes int64
				for _, b := range p.Blobs {
					bytes += b.Size()
				}
				if bytes != p.Bytes {
					t.Errorf("Bytes = %d, the blobs sum to %d", p.Bytes, bytes)
				}
				if len(tc.want["t"]) > 0 && !slices.Contains(p.Dirs, "t/") || len(tc.want["q"]) == 0 && slices.Contains(p.Dirs, "q/") {
					t.Errorf("Dirs = %v", p.Dirs)
				}
			}
		})
	}
}

// --only keeps the blobs under the paths named, a file's name with or
// without ".npy"; a path the mount lacks is an error.
func TestPlanOnly(t *testing.T) {
	l, err := layout.Build(viewtest.ViewHierarchy(), layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Select(l, SelectOptions{Only: []string{"sub", "/latitude", "t/03.npy", "q/"}, Samples: &SampleSpan{2, 5}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range p.Blobs {
		got = append(got, b.Path())
	}
	// sub/sp (12 steps, selected as a directory) brings time.npy, which
	// its readers read beside the samples (sub holds none: the top's);
	// t/03.npy, one file, brings nothing; q's 10 steps have no coordinate
	// of their length.
	want := []string{"latitude.npy", "q/2.npy", "q/3.npy", "q/4.npy", "sub/sp/02.npy", "sub/sp/03.npy", "sub/sp/04.npy", "t/03.npy", "time.npy"}
	if !slices.Equal(got, want) {
		t.Errorf("blobs %v, want %v", got, want)
	}
	if want := []string{"latitude.npy", "q/", "sub/sp/", "t/", "time.npy"}; !slices.Equal(p.Dirs, want) {
		t.Errorf("Dirs %v, want %v", p.Dirs, want)
	}
	if p, err := Select(l, SelectOptions{Only: []string{"t/03.npy"}}); err != nil || len(p.Blobs) != 1 {
		t.Errorf("one file selected %d blobs (%v), want it alone", len(p.Blobs), err)
	}
	if p, err := Select(l, SelectOptions{Only: []string{"t"}, Samples: &SampleSpan{0, 1}}); err != nil || len(p.Blobs) != 2 || p.Blobs[1].Path() != "time.npy" {
		t.Errorf("t/ selected %d blobs (%v), want its sample and time.npy", len(p.Blobs), err)
	}
	if _, err := Select(l, SelectOptions{Only: []string{"nosuch"}}); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("Select of a missing path: %v", err)
	}
}
