package cache

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits maps a unit suffix (lower case) to its multiplier. Single
// letters and the IEC "i" forms are powers of 1024, as in coreutils
// (`--block-size=1G`) and Kubernetes ("Gi"); the "B" forms are SI, as disk
// vendors print them. A plain number is bytes.
var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 1e12,
	"p": 1 << 50, "pi": 1 << 50, "pib": 1 << 50, "pb": 1e15,
}

// ParseSize parses a human byte count (--cache-size, --memory): "4096", "200KiB",
// "500GiB", "1.5TB", "10G" (binary), "2 MB" (decimal). Units are case
// insensitive; fractions are allowed and rounded down to whole bytes. "0"
// means 0, which Options.Size reads as unlimited. Negative, non-finite and
// out-of-range values are errors.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("size %q: want a number with an optional unit such as KiB, MiB, GiB, TiB, KB, GB, TB", s)
	}
	if mult == 1 && !strings.Contains(num, ".") {
		// Exact for integers beyond 2^53, where a float would round.
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("size %q: %w", s, err)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	v := math.Floor(f * mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return int64(v), nil
}
