package fill

import (
	"path"
	"strings"
)

// Group names what a mounted file belongs to, for labels of bounded
// cardinality: the sample directory of a sample ("t", "sub/sp", "train"),
// the array of a whole-array file ("lsm" for lsm.npy).
func Group(p string) string {
	if dir := path.Dir(p); dir != "." {
		return dir
	}
	return strings.TrimSuffix(p, ".npy")
}
