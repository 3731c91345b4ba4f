package zarr

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"strconv"
)

// A Pin is what one blob's identity was computed from, for the Reads that
// fill the blob to agree with it (Read takes it): for every array, the listing
// the identity read versions from, and for a lazy listing, whose answers
// past the ones it keeps are asked anew each time, the version of every
// chunk of every region the identity named, as an 8-byte sum. A Read under
// the pin reads each array under the pinned listing and checks each
// chunk's version against the pinned one (ErrChanged when it differs), so
// the bytes it returns are those of exactly the versions the identity
// names, however the store changes meanwhile. A Pin costs 8 bytes a chunk
// of a lazily listed region, nothing per chunk otherwise.
//
// A Pin is filled by Region and Listed, then only read: Reads may use it
// concurrently.
type Pin struct {
	listings map[*Array]*Listing
	regions  []pinRegion
}

// pinRegion is the chunk grid box [lo, hi) of one region of a, and the
// version sum of each of its chunks in C order.
type pinRegion struct {
	a      *Array
	lo, hi []int64
	sums   []uint64
}

// pinSeed keys the version sums: two versions of a chunk have one sum
// with a chance of 2^-63, whatever the store names them.
var pinSeed = maphash.MakeSeed()

// versionSum is a chunk's version as a Pin keeps it: 0 for a chunk not
// listed (missing), never 0 for one listed.
func versionSum(version string, listed bool) uint64 {
	if !listed {
		return 0
	}
	return maphash.String(pinSeed, version) | 1
}

// Listing is the listing a Read under p reads a under: the one p pins for
// it, else a's current one (nil for none). A nil Pin pins nothing.
func (p *Pin) Listing(a *Array) *Listing {
	if p != nil {
		if l := p.listings[a]; l != nil {
			return l
		}
	}
	return a.currentListing()
}

// Listed pins lst as the listing a is read under. A nil Pin pins
// nothing.
func (p *Pin) Listed(a *Array, lst *Listing) {
	if p == nil {
		return
	}
	if p.listings == nil {
		p.listings = map[*Array]*Listing{}
	}
	p.listings[a] = lst
}

// Region calls fn with the store key and version in lst of every chunk
// (or shard) of the region start/count of a, in sorted key order (listed
// false: lst lacks it), and pins them (Listed, and for a lazy listing each
// chunk's version sum). It holds no memory per chunk but the pin's; a nil
// Pin only walks.
func (p *Pin) Region(lst *Listing, a *Array, start, count []int64, fn func(key, version string, listed bool)) error {
	return p.RegionBy(lst, a, start, count, (*Listing).Version, fn)
}

// RegionBy is Region taking each chunk's version from version(lst, key)
// (Listing.Known without I/O, say) instead of lst.Version; its first
// error stops the walk and is returned.
func (p *Pin) RegionBy(lst *Listing, a *Array, start, count []int64, version func(*Listing, string) (string, bool, error), fn func(key, version string, listed bool)) error {
	p.Listed(a, lst)
	lo, hi, ok := a.regionGrid(start, count)
	if !ok {
		return nil
	}
	var r *pinRegion
	if p != nil && lst.stat != nil {
		p.regions = append(p.regions, pinRegion{a: a, lo: lo, hi: hi, sums: make([]uint64, box{lo, hi}.volume())})
		r = &p.regions[len(p.regions)-1]
	}
	var err error
	a.eachSortedChunk(lo, hi, func(key string, lin int64) bool {
		v, ok, e := version(lst, key)
		if e != nil {
			err = e
			return false
		}
		if r != nil {
			r.sums[lin] = versionSum(v, ok)
		}
		fn(key, v, ok)
		return true
	})
	return err
}

// pins reports whether p pins the version of the chunk of a at grid
// coordinates c.
func (p *Pin) pins(a *Array, c []int64) bool {
	if p == nil {
		return false
	}
	for i := range p.regions {
		if r := &p.regions[i]; r.a == a {
			if _, ok := r.index(c); ok {
				return true
			}
		}
	}
	return false
}

// check fails with ErrChanged when p pins the chunk of a at grid
// coordinates c to a version other than the one given.
func (p *Pin) check(a *Array, c []int64, version string, listed bool) error {
	if p == nil {
		return nil
	}
	sum := versionSum(version, listed)
	for i := range p.regions {
		r := &p.regions[i]
		if r.a != a {
			continue
		}
		lin, ok := r.index(c)
		if !ok || r.sums[lin] == sum {
			continue
		}
		switch {
		case r.sums[lin] == 0:
			return fmt.Errorf("%w: missing when the blob's identity was taken, now version %s", ErrChanged, version)
		case !listed:
			return fmt.Errorf("%w: now absent, not the version the blob's identity was taken from", ErrChanged)
		}
		return fmt.Errorf("%w: version %s is not the one the blob's identity was taken from", ErrChanged, version)
	}
	return nil
}

// Sum is a digest of the versions p pins one by one for the chunks of
// the region start/count of a: equal for two pins that pin the region's
// chunks to the same versions (a caller keeping bytes of the region
// across fills compares it, with the listing). 0 when p pins none of them
// one by one (no pin, or a listing that names them all for its life).
func (p *Pin) Sum(a *Array, start, count []int64) uint64 {
	if p == nil {
		return 0
	}
	lo, hi, ok := a.regionGrid(start, count)
	if !ok {
		return 0
	}
	for i := range p.regions {
		r := &p.regions[i]
		if r.a != a || !slices.Equal(r.lo, lo) || !slices.Equal(r.hi, hi) {
			continue
		}
		var b [8]byte
		var h maphash.Hash
		h.SetSeed(pinSeed)
		for _, s := range r.sums {
			binary.LittleEndian.PutUint64(b[:], s)
			h.Write(b[:])
		}
		return h.Sum64() | 1
	}
	return 0
}

// index is the position of grid coordinates c in r's C order.
func (r *pinRegion) index(c []int64) (int64, bool) {
	lin := int64(0)
	for d := range r.lo {
		if c[d] < r.lo[d] || c[d] >= r.hi[d] {
			return 0, false
		}
		lin = lin*(r.hi[d]-r.lo[d]) + c[d] - r.lo[d]
	}
	return lin, true
}

func boxExtent(lo, hi []int64) []int64 {
	e := make([]int64, len(lo))
	for d := range lo {
		e[d] = hi[d] - lo[d]
	}
	return e
}

// eachSortedChunk calls fn with the store key of every chunk of the grid
// box [lo, hi) in sorted (byte-wise) order, and the chunk's position in
// the box's C order, until fn returns false. A key is the array's prefix
// followed by the coordinates in decimal, each after a separator that
// sorts before every digit ('/' or '.'), so keys sort as the tuples of
// their coordinates' decimal strings do: nested loops over each axis's
// coordinates sorted as strings, holding one sorted list per axis, not
// one key per chunk. Any other separator falls back to sorting the keys.
func (a *Array) eachSortedChunk(lo, hi []int64, fn func(key string, lin int64) bool) {
	rank := len(lo)
	if len(a.keySep) != 1 || a.keySep[0] >= '0' {
		a.eachSortedChunkSlow(lo, hi, fn)
		return
	}
	axes := make([][]int64, rank) // each axis's coordinates, sorted as strings
	for d := range rank {
		cs := make([]int64, 0, hi[d]-lo[d])
		for c := lo[d]; c < hi[d]; c++ {
			cs = append(cs, c)
		}
		sort.Slice(cs, func(i, j int) bool {
			return strconv.FormatInt(cs[i], 10) < strconv.FormatInt(cs[j], 10)
		})
		axes[d] = cs
	}
	stride := strides(boxExtent(lo, hi), 1)
	c := make([]int64, rank)
	at := make([]int, rank)
	for d := range rank {
		if len(axes[d]) == 0 {
			return
		}
		c[d] = axes[d][0]
	}
	for {
		lin := int64(0)
		for d := range rank {
			lin += (c[d] - lo[d]) * stride[d]
		}
		if !fn(a.ChunkKey(c), lin) {
			return
		}
		d := rank - 1
		for ; d >= 0; d-- {
			if at[d]++; at[d] < len(axes[d]) {
				c[d] = axes[d][at[d]]
				break
			}
			at[d] = 0
			c[d] = axes[d][0]
		}
		if d < 0 {
			return
		}
	}
}

// eachSortedChunkSlow is eachSortedChunk by sorting every key.
func (a *Array) eachSortedChunkSlow(lo, hi []int64, fn func(key string, lin int64) bool) {
	type kl struct {
		k   string
		lin int64
	}
	var keys []kl
	lin := int64(0)
	forEach(lo, hi, func(c []int64) {
		keys = append(keys, kl{a.ChunkKey(c), lin})
		lin++
	})
	sort.Slice(keys, func(i, j int) bool { return keys[i].k < keys[j].k })
	for _, k := range keys {
		if !fn(k.k, k.lin) {
			return
		}
	}
}
