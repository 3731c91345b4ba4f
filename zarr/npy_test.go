package zarr_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// npyArray is a parsed .npy file: the reference values the conformance
// tests compare against.
type npyArray struct {
	Descr string
	Shape []int64
	Data  []byte
}

var (
	npyDescr   = regexp.MustCompile(`'descr':\s*'([^']*)'`)
	npyFortran = regexp.MustCompile(`'fortran_order':\s*(True|False)`)
	npyShape   = regexp.MustCompile(`'shape':\s*\(([^)]*)\)`)
)

// readNpy parses NPY versions 1 to 3. Only what numpy.save writes for
// plain numeric arrays is accepted; Fortran order is refused because every
// reference is written in C order.
func readNpy(path string) (*npyArray, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseNpy(b)
}

func parseNpy(b []byte) (*npyArray, error) {
	if len(b) < 10 || !bytes.Equal(b[:6], []byte("\x93NUMPY")) {
		return nil, fmt.Errorf("npy: bad magic")
	}
	var hlen, off int
	switch b[6] {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(b[8:10])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, fmt.Errorf("npy: short header")
		}
		hlen, off = int(binary.LittleEndian.Uint32(b[8:12])), 12
	default:
		return nil, fmt.Errorf("npy: version %d", b[6])
	}
	if off+hlen > len(b) {
		return nil, fmt.Errorf("npy: header length %d past end", hlen)
	}
	h := string(b[off : off+hlen])
	a := &npyArray{Data: b[off+hlen:]}
	m := npyDescr.FindStringSubmatch(h)
	if m == nil {
		return nil, fmt.Errorf("npy: no descr in %q", h)
	}
	a.Descr = m[1]
	if m := npyFortran.FindStringSubmatch(h); m == nil || m[1] != "False" {
		return nil, fmt.Errorf("npy: not C order: %q", h)
	}
	m = npyShape.FindStringSubmatch(h)
	if m == nil {
		return nil, fmt.Errorf("npy: no shape in %q", h)
	}
	a.Shape = []int64{}
	for _, f := range strings.Split(m[1], ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("npy: shape %q: %w", m[1], err)
		}
		a.Shape = append(a.Shape, n)
	}
	size, err := strconv.Atoi(a.Descr[2:])
	if err != nil {
		return nil, fmt.Errorf("npy: descr %q", a.Descr)
	}
	if want := product(a.Shape) * int64(size); int64(len(a.Data)) != want {
		return nil, fmt.Errorf("npy: %d data bytes, shape %v of %s needs %d", len(a.Data), a.Shape, a.Descr, want)
	}
	return a, nil
}

func product(s []int64) int64 {
	p := int64(1)
	for _, n := range s {
		p *= n
	}
	return p
}

// extract copies the C-order region start/count out of a C-order array.
func extract(data []byte, shape []int64, size int, start, count []int64) []byte {
	out := make([]byte, 0, product(count)*int64(size))
	if len(shape) == 0 {
		return append(out, data[:size]...)
	}
	if product(count) == 0 {
		return out
	}
	strides := make([]int64, len(shape))
	s := int64(size)
	for d := len(shape) - 1; d >= 0; d-- {
		strides[d] = s
		s *= shape[d]
	}
	last := len(shape) - 1
	idx := make([]int64, len(shape)) // offsets within the region, last dim excluded
	for {
		off := int64(0)
		for d := 0; d < last; d++ {
			off += (start[d] + idx[d]) * strides[d]
		}
		off += start[last] * strides[last]
		out = append(out, data[off:off+count[last]*int64(size)]...)
		d := last - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < count[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return out
		}
	}
}

// sameBytes fails the test with the first differing elements (as hex and,
// for floats, as numbers) when got and want differ anywhere. Comparing
// bytes makes NaN payloads and the sign of zero count.
func sameBytes(t *testing.T, what string, got, want []byte, descr string) bool {
	t.Helper()
	if bytes.Equal(got, want) {
		return true
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
		return false
	}
	size, _ := strconv.Atoi(descr[2:])
	if size == 0 {
		size = 1
	}
	var diffs []string
	n := 0
	for i := 0; i+size <= len(got); i += size {
		if bytes.Equal(got[i:i+size], want[i:i+size]) {
			continue
		}
		n++
		if len(diffs) < 5 {
			diffs = append(diffs, fmt.Sprintf("element %d: got %s want %s", i/size,
				fmtElem(got[i:i+size], descr), fmtElem(want[i:i+size], descr)))
		}
	}
	t.Errorf("%s: %d of %d elements differ (%s): %s", what, n, len(got)/size, descr, strings.Join(diffs, "; "))
	return false
}

func fmtElem(b []byte, descr string) string {
	var u uint64
	for i := len(b) - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	switch descr[1:] {
	case "f4":
		return fmt.Sprintf("%#x (%g)", u, math.Float32frombits(uint32(u)))
	case "f8":
		return fmt.Sprintf("%#x (%g)", u, math.Float64frombits(u))
	}
	return fmt.Sprintf("%#x", u)
}

func TestParseNpyAndExtract(t *testing.T) {
	// A 2x3 <i2 array as numpy.save writes it.
	hdr := "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }"
	hdr += strings.Repeat(" ", 128-10-len(hdr)-1) + "\n"
	b := append([]byte("\x93NUMPY\x01\x00"), byte(len(hdr)), 0)
	b = append(b, hdr...)
	for i := range 6 {
		b = append(b, byte(i), 0)
	}
	a, err := parseNpy(b)
	if err != nil {
		t.Fatal(err)
	}
	if a.Descr != "<i2" || len(a.Shape) != 2 || a.Shape[0] != 2 || a.Shape[1] != 3 {
		t.Fatalf("parsed %+v", a)
	}
	got := extract(a.Data, a.Shape, 2, []int64{0, 1}, []int64{2, 2})
	if want := []byte{1, 0, 2, 0, 4, 0, 5, 0}; !bytes.Equal(got, want) {
		t.Fatalf("extract = %v, want %v", got, want)
	}
	if _, err := parseNpy(b[:len(b)-1]); err == nil {
		t.Fatal("short data accepted")
	}
	fortran := bytes.Replace(b, []byte("False"), []byte("True "), 1)
	if _, err := parseNpy(fortran); err == nil {
		t.Fatal("fortran order accepted")
	}
}
