package gpu

import (
	"math/rand/v2"

	"github.com/zarrfs/zarrfs/codec"
	dmg "github.com/zarrfs/zarrfs/internal/damage"
)

// The damage that chunks come to on disk and in transit (package
// internal/damage), applied to good chunks by the host-check differential
// tests (no GPU) and by the GPU's damaged-chunk test alike.

// damageKinds names every kind, in the order the tests report them.
var damageKinds = dmg.Kinds

// damage returns kind applied to the good chunk src of codec c, drawing
// from r, or nil when the kind does not apply.
func damage(kind string, c codec.Name, src []byte, r *rand.Rand) []byte {
	return dmg.Apply(kind, c, src, r)
}
