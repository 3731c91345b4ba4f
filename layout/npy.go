package layout

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// npyMagic opens every NPY file; version 1.0 follows it.
var npyMagic = []byte{0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0}

// npyPrefix is the magic, the version and the 2-byte header length.
const npyPrefix = 10

// maxNumpyHeader is numpy's own limit on the header text it parses without
// allow_pickle=True (numpy.lib.format._MAX_HEADER_SIZE): a longer header
// would make numpy.load refuse our files, so Align is capped by it.
const maxNumpyHeader = 10000

// MinAlign is the smallest Align that holds any NPY header: the shortest
// (a 0-d array of one-byte type) takes 67 bytes.
const MinAlign = 128

// MaxAlign is the largest Align whose header numpy.load still accepts: the
// header text (align-10 bytes) must not exceed 10000 characters.
const MaxAlign = (npyPrefix + maxNumpyHeader) / 64 * 64

// ErrHeaderTooLarge is returned when an array's NPY header does not fit in
// the configured alignment.
var ErrHeaderTooLarge = errors.New("npy header does not fit in the alignment")

// npyShape formats a shape as Python prints a tuple: "()", "(5,)", "(721, 1440)".
func npyShape(shape []int64) string {
	switch len(shape) {
	case 0:
		return "()"
	case 1:
		return "(" + strconv.FormatInt(shape[0], 10) + ",)"
	}
	var b strings.Builder
	b.WriteByte('(')
	for i, s := range shape {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(s, 10))
	}
	b.WriteByte(')')
	return b.String()
}

// NPYHeader returns the NPY 1.0 header for a C-order array of the given
// numpy type string and shape, padded with spaces and ending in '\n' so that
// it is exactly align bytes long: the data that follows starts at align.
func NPYHeader(descr string, shape []int64, align int64) ([]byte, error) {
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, npyShape(shape))
	hlen := align - npyPrefix
	if int64(len(dict))+1 > hlen || hlen > 0xffff {
		return nil, fmt.Errorf("%w: %d bytes of header for shape %s, alignment %d", ErrHeaderTooLarge, len(dict)+1+npyPrefix, npyShape(shape), align)
	}
	h := make([]byte, align)
	copy(h, npyMagic)
	binary.LittleEndian.PutUint16(h[8:], uint16(hlen))
	n := copy(h[npyPrefix:], dict)
	for i := npyPrefix + n; i < len(h)-1; i++ {
		h[i] = ' '
	}
	h[len(h)-1] = '\n'
	return h, nil
}

// ParsedHeader is what ParseNPYHeader reads back from an NPY file.
type ParsedHeader struct {
	Descr        string
	FortranOrder bool
	Shape        []int64
	// DataOffset is where the array data starts.
	DataOffset int64
}

// ParseNPYHeader parses the NPY 1.0 header at the start of b (which must
// hold the whole header). It reads exactly the dictionary form NPYHeader
// writes and numpy itself writes; it exists for tests and for tools that
// check a backing file.
func ParseNPYHeader(b []byte) (ParsedHeader, error) {
	var p ParsedHeader
	if len(b) < npyPrefix || string(b[:6]) != string(npyMagic[:6]) {
		return p, errors.New("npy: bad magic")
	}
	if b[6] != 1 || b[7] != 0 {
		return p, fmt.Errorf("npy: version %d.%d, want 1.0", b[6], b[7])
	}
	hlen := int(binary.LittleEndian.Uint16(b[8:]))
	if len(b) < npyPrefix+hlen {
		return p, fmt.Errorf("npy: header of %d bytes truncated at %d", hlen, len(b)-npyPrefix)
	}
	h := string(b[npyPrefix : npyPrefix+hlen])
	if !strings.HasSuffix(h, "\n") {
		return p, errors.New("npy: header does not end in newline")
	}
	h = strings.TrimSpace(h)
	if !strings.HasPrefix(h, "{") || !strings.HasSuffix(h, "}") {
		return p, fmt.Errorf("npy: header %q is not a dict", h)
	}
	h = strings.TrimSpace(h[1 : len(h)-1])
	var seen int
	for h != "" {
		var key string
		var ok bool
		key, h, ok = cutQuoted(h)
		if !ok {
			return p, fmt.Errorf("npy: bad key in header")
		}
		h = strings.TrimSpace(h)
		if !strings.HasPrefix(h, ":") {
			return p, fmt.Errorf("npy: missing ':' after %q", key)
		}
		h = strings.TrimSpace(h[1:])
		switch key {
		case "descr":
			p.Descr, h, ok = cutQuoted(h)
			if !ok {
				return p, errors.New("npy: bad descr")
			}
		case "fortran_order":
			switch {
			case strings.HasPrefix(h, "False"):
				h = h[5:]
			case strings.HasPrefix(h, "True"):
				p.FortranOrder = true
				h = h[4:]
			default:
				return p, errors.New("npy: bad fortran_order")
			}
		case "shape":
			end := strings.IndexByte(h, ')')
			if !strings.HasPrefix(h, "(") || end < 0 {
				return p, errors.New("npy: bad shape")
			}
			p.Shape = []int64{}
			for _, f := range strings.Split(h[1:end], ",") {
				f = strings.TrimSpace(f)
				if f == "" {
					continue
				}
				v, err := strconv.ParseInt(f, 10, 64)
				if err != nil || v < 0 {
					return p, fmt.Errorf("npy: bad shape entry %q", f)
				}
				p.Shape = append(p.Shape, v)
			}
			h = h[end+1:]
		default:
			return p, fmt.Errorf("npy: unexpected key %q", key)
		}
		seen++
		h = strings.TrimSpace(h)
		h = strings.TrimPrefix(h, ",")
		h = strings.TrimSpace(h)
	}
	if seen != 3 || p.Shape == nil || p.Descr == "" {
		return p, errors.New("npy: header lacks descr, fortran_order or shape")
	}
	p.DataOffset = int64(npyPrefix + hlen)
	return p, nil
}

// cutQuoted reads a single-quoted Python string at the start of s.
func cutQuoted(s string) (val, rest string, ok bool) {
	if !strings.HasPrefix(s, "'") {
		return "", s, false
	}
	end := strings.IndexByte(s[1:], '\'')
	if end < 0 {
		return "", s, false
	}
	return s[1 : 1+end], s[2+end:], true
}
