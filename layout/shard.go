package layout

import "fmt"

// Shard splits the samples of every sample directory among ranks
// (docs/design.md §6), the same way `zarrfs warm --rank/--world` does, so
// that a mount with --rank R lists exactly what a warm with --rank R filled.
// The zero value (World 0 or 1) is no split.
type Shard struct {
	Rank  int
	World int
	// Interleaved gives rank R samples R, R+W, R+2W, ... (PyTorch's
	// DistributedSampler without shuffling); otherwise rank R gets the
	// contiguous block [floor(R*N/W), floor((R+1)*N/W)) (DALI's shard_id
	// and num_shards with stick_to_shard).
	Interleaved bool
}

// ShardMode names the split: "contiguous" or "interleaved".
func (s Shard) Mode() string {
	if s.Interleaved {
		return "interleaved"
	}
	return "contiguous"
}

// ParseShard checks rank, world and mode ("contiguous" or "interleaved").
func ParseShard(rank, world int, mode string) (Shard, error) {
	if world < 1 || rank < 0 || rank >= world {
		return Shard{}, fmt.Errorf("%w: rank %d of world %d: want 0 <= rank < world", ErrInvalidOption, rank, world)
	}
	switch mode {
	case "", "contiguous":
		return Shard{Rank: rank, World: world}, nil
	case "interleaved":
		return Shard{Rank: rank, World: world, Interleaved: true}, nil
	}
	return Shard{}, fmt.Errorf("%w: shard mode %q: want contiguous or interleaved", ErrInvalidOption, mode)
}

func (s Shard) active() bool { return s.World > 1 }

// Of returns the samples of [lo, hi) that the rank reads, as an arithmetic
// progression: indices First, First+Step, ..., Count of them.
func (s Shard) Of(lo, hi int64) Progression {
	if hi < lo {
		hi = lo
	}
	if !s.active() {
		return Progression{First: lo, Step: 1, Count: hi - lo}
	}
	n, r, w := hi-lo, int64(s.Rank), int64(s.World)
	if s.Interleaved {
		c := int64(0)
		if r < n {
			c = (n - r + w - 1) / w
		}
		return Progression{First: lo + r, Step: w, Count: c}
	}
	a := lo + r*n/w
	b := lo + (r+1)*n/w
	return Progression{First: a, Step: 1, Count: b - a}
}

// Progression is the arithmetic progression First + i*Step, 0 <= i < Count.
type Progression struct {
	First, Step, Count int64
}

// At returns the i-th member.
func (p Progression) At(i int64) int64 { return p.First + i*p.Step }

// Pos returns the position of g in the progression, if it is a member.
func (p Progression) Pos(g int64) (int64, bool) {
	if g < p.First || (g-p.First)%p.Step != 0 {
		return 0, false
	}
	i := (g - p.First) / p.Step
	return i, i < p.Count
}

// Contains reports whether g is a member.
func (p Progression) Contains(g int64) bool {
	_, ok := p.Pos(g)
	return ok
}
