package layout

import (
	"fmt"
	"slices"
	"strings"

	"github.com/zarrfs/zarrfs/zarr"
)

// DefaultSampleDims is the sample dimensions a mount tries, in order, when
// none is named: "time", and "valid_time" as ERA5 from the new CDS names
// its time axis.
const DefaultSampleDims = "time,valid_time"

// ParseSampleDims splits a comma-separated list of sample dimension names
// (--sample-dim), refusing an empty name.
func ParseSampleDims(list string) ([]string, error) {
	names := strings.Split(list, ",")
	for i, n := range names {
		names[i] = strings.TrimSpace(n)
		if names[i] == "" {
			return nil, fmt.Errorf("%w: sample dimension list %q has an empty name", ErrInvalidOption, list)
		}
	}
	return names, nil
}

// ChooseSampleDim returns the first name of list (comma-separated) that
// some readable array of h with two or more dimensions names, which is
// what gets a directory of samples; when none does, the first name and
// false. Once chosen, a mount keeps its name (Source.Open), so that a
// store that grows an array of another name does not rename its files.
func ChooseSampleDim(h *zarr.Hierarchy, list string) (string, bool) {
	names, err := ParseSampleDims(list)
	if err != nil || len(names) == 0 {
		return list, false
	}
	for _, n := range names {
		for _, a := range h.Arrays {
			if a.Unsupported == "" && len(a.Dims) >= 2 && slices.Contains(a.Dims, n) {
				return n, true
			}
		}
	}
	return names[0], false
}

// multiDims lists the dimension names of h's readable arrays of two or
// more dimensions, sorted, at most max of them: what a warning that no
// sample dimension matched offers instead.
func multiDims(h *zarr.Hierarchy, max int) []string {
	seen := map[string]bool{}
	for _, a := range h.Arrays {
		if a.Unsupported != "" || len(a.Dims) < 2 {
			continue
		}
		for _, d := range a.Dims {
			if d != "" {
				seen[d] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	slices.Sort(out)
	if len(out) > max {
		out = append(out[:max], "...")
	}
	return out
}
