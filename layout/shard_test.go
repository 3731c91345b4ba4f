package layout

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"encoding/json"
	"reflect"
	"slices"
	"testing"
)

// Every rank's share, for both modes and awkward sizes, covers [lo, hi)
// exactly once, in order; contiguous shares match DALI's formula.
func TestShardOf(t *testing.T) {
	for _, interleaved := range []bool{false, true} {
		for _, world := range []int{1, 2, 3, 7} {
			for _, r := range [][2]int64{{0, 0}, {0, 1}, {0, 10}, {4, 10}, {3, 5}, {0, 97}} {
				seen := map[int64]int{}
				for rank := range world {
					p := Shard{Rank: rank, World: world, Interleaved: interleaved}.Of(r[0], r[1])
					for i := range p.Count {
						g := p.At(i)
						if pos, ok := p.Pos(g); !ok || pos != i {
							t.Errorf("%+v: Pos(%d) = %d, %v", p, g, pos, ok)
						}
						seen[g]++
						if !interleaved {
							n := r[1] - r[0]
							if lo, hi := r[0]+int64(rank)*n/int64(world), r[0]+int64(rank+1)*n/int64(world); g < lo || g >= hi {
								t.Errorf("contiguous rank %d/%d of %v has %d outside [%d, %d)", rank, world, r, g, lo, hi)
							}
						} else if (g-r[0])%int64(world) != int64(rank) {
							t.Errorf("interleaved rank %d/%d of %v has %d", rank, world, r, g)
						}
					}
					if p.Contains(p.At(p.Count)) {
						t.Errorf("%+v contains the index past its end", p)
					}
				}
				for g := r[0]; g < r[1]; g++ {
					if seen[g] != 1 {
						t.Errorf("interleaved=%v world %d %v: sample %d in %d shares", interleaved, world, r, g, seen[g])
					}
				}
				if len(seen) != int(r[1]-r[0]) {
					t.Errorf("interleaved=%v world %d %v: %d samples covered", interleaved, world, r, len(seen))
				}
			}
		}
	}
}

func TestParseShard(t *testing.T) {
	for _, bad := range []struct {
		rank, world int
		mode        string
	}{{1, 1, ""}, {-1, 2, ""}, {0, 0, ""}, {0, 2, "random"}} {
		if _, err := ParseShard(bad.rank, bad.world, bad.mode); err == nil {
			t.Errorf("ParseShard(%d, %d, %q) accepted", bad.rank, bad.world, bad.mode)
		}
	}
	if s, err := ParseShard(1, 3, "interleaved"); err != nil || !s.Interleaved || s.Mode() != "interleaved" {
		t.Errorf("ParseShard interleaved = %+v, %v", s, err)
	}
}

// A sharded layout lists only the rank's samples, under their global
// names, in arrays and views; lookups outside the share fail; blob paths,
// sizes and the layout ID are those of the unsharded layout; the sidecar
// says which samples are listed.
func TestShardedLayout(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, "views:\n  - name: train\n    dtype: float32\n    samples: {start: 1, stop: 12, step: 2}\n    channels:\n      - var: u10\n      - var: t\n        select: {level: all}\n")
	if err != nil {
		t.Fatal(err)
	}
	full, err := Build(h, Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	for _, shard := range []Shard{{Rank: 1, World: 3}, {Rank: 2, World: 4, Interleaved: true}} {
		l, err := Build(h, Options{Views: views, Shard: shard})
		if err != nil {
			t.Fatal(err)
		}
		if l.ID != full.ID {
			t.Errorf("%+v: layout ID %s, want the unsharded %s", shard, l.ID, full.ID)
		}
		for _, dir := range []string{"t", "sub/sp", "train"} {
			e, ok := l.Lookup(dir)
			fe, _ := full.Lookup(dir)
			if !ok || !e.Dir.IsSampleDir() {
				t.Fatalf("%s: not a sample directory", dir)
			}
			n := fe.Dir.Len()
			want := shard.Of(0, int64(n))
			var got []string
			for i := range e.Dir.Len() {
				got = append(got, e.Dir.Entry(i).Name)
				if g := e.Dir.Sample(i); g != want.At(int64(i)) {
					t.Errorf("%s: entry %d is sample %d, want %d", dir, i, g, want.At(int64(i)))
				}
			}
			var wantNames []string
			for i := range want.Count {
				wantNames = append(wantNames, fe.Dir.Entry(int(want.At(i))).Name)
			}
			if !slices.Equal(got, wantNames) {
				t.Errorf("%+v %s lists %v, want %v", shard, dir, got, wantNames)
			}
			for i := range n {
				fb := fe.Dir.Entry(i)
				se, ok := e.Dir.Lookup(fb.Name)
				if ok != want.Contains(int64(i)) {
					t.Errorf("%+v %s: Lookup(%s) = %v", shard, dir, fb.Name, ok)
				}
				if ok && (se.Blob.Path() != fb.Blob.Path() || se.Blob.Size() != fb.Blob.Size()) {
					t.Errorf("%s: blob %s/%d differs from the unsharded one", dir, se.Blob.Path(), se.Blob.Size())
				}
				if pos, ok2 := e.Dir.Index(fb.Name); ok2 != ok || (ok && e.Dir.Entry(pos).Name != fb.Name) {
					t.Errorf("%s: Index(%s) = %d, %v", dir, fb.Name, pos, ok2)
				}
			}
			side, _ := l.Lookup(dir + ".json")
			var sc struct {
				Files int64         `json:"files"`
				Shard *SidecarShard `json:"shard"`
			}
			if err := json.Unmarshal(side.Data, &sc); err != nil {
				t.Fatal(err)
			}
			wantShard := &SidecarShard{Rank: shard.Rank, World: shard.World, Mode: shard.Mode(), First: want.First, Step: want.Step, Count: want.Count}
			if sc.Files != want.Count || !reflect.DeepEqual(sc.Shard, wantShard) {
				t.Errorf("%s.json: files %d shard %+v, want %d %+v", dir, sc.Files, sc.Shard, want.Count, wantShard)
			}
		}
	}
}
