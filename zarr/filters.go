package zarr

import (
	"encoding/json"
	"fmt"

	"github.com/zarrfs/zarrfs/codec"
)

// The numcodecs filters of HDF5 datasets as kerchunk and VirtualiZarr
// describe them: a Zarr v2 "filters" list (kerchunk puts the whole HDF5
// pipeline there, shuffle, then zlib, then fletcher32, with a null
// compressor) and the same codecs under their Zarr v3 "numcodecs.*" names.

// v2Codec maps one numcodecs codec id of a v2 filters list or compressor
// to its bytes-to-bytes step. Unknown ids are unsupported, with a reason a
// user can act on where one is known.
func v2Codec(id string, cfg map[string]any, dt DType) (bbCodec, error) {
	switch id {
	case "blosc":
		if cn, _ := cfg["cname"].(string); cn == "snappy" {
			return bbCodec{}, fmt.Errorf("%w: blosc compressor snappy", codec.ErrUnsupported)
		}
		return bbCodec{name: codec.Blosc}, nil
	case "zstd":
		return bbCodec{name: codec.Zstd}, nil
	case "zlib":
		return bbCodec{name: codec.Zlib}, nil
	case "gzip":
		return bbCodec{name: codec.Gzip}, nil
	case "lz4":
		return bbCodec{name: codec.LZ4}, nil
	case "shuffle":
		n := dt.Size
		if v, ok := cfg["elementsize"]; ok {
			num, ok := v.(json.Number)
			x, err := num.Int64()
			if !ok || err != nil || x < 1 || x > codec.MaxShuffleElement {
				return bbCodec{}, fmt.Errorf("shuffle elementsize %v is not a positive integer", v)
			}
			n = int(x)
		}
		return bbCodec{name: codec.ShuffleOf(n)}, nil
	case "fletcher32":
		return bbCodec{name: codec.Fletcher32Of("")}, nil
	case "grib":
		return bbCodec{}, fmt.Errorf("%w: filter \"grib\" (GRIB messages, which only eccodes decodes)", codec.ErrUnsupported)
	case "":
		return bbCodec{}, fmt.Errorf("filter without an id")
	}
	return bbCodec{}, fmt.Errorf("%w: filter %q", codec.ErrUnsupported, id)
}

// v2Filters returns the bytes-to-bytes steps of a v2 filters list, in
// encode order.
func v2Filters(list []any, dt DType) ([]bbCodec, error) {
	var out []bbCodec
	for _, f := range list {
		fm, ok := f.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("filter %v is not an object", f)
		}
		id, _ := fm["id"].(string)
		c, err := v2Codec(id, fm, dt)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// numcodecsV3 maps a v3 codec named "numcodecs.ID" (the numcodecs.zarr3
// adapters VirtualiZarr writes) to its bytes-to-bytes step.
func numcodecsV3(name string, cfg map[string]any, dt DType) (bbCodec, error) {
	id := name[len("numcodecs."):]
	switch id {
	case "blosc", "zstd", "zlib", "gzip", "lz4", "shuffle", "fletcher32":
		return v2Codec(id, cfg, dt)
	}
	return bbCodec{}, fmt.Errorf("%w: codec %q", codec.ErrUnsupported, name)
}

// foldChecksums folds a fletcher32 step into the step it wraps (encode
// order: the one before it), so that every decode step has a known output
// size. Only an outermost fletcher32 (HDF5 runs it last) is read: one
// inside a compression codec would change the size the codec decodes to.
func foldChecksums(bb []bbCodec) ([]bbCodec, error) {
	for i, c := range bb {
		if c.name != codec.Fletcher32Of("") {
			continue
		}
		if i != len(bb)-1 {
			return nil, fmt.Errorf("%w: fletcher32 before another codec", codec.ErrUnsupported)
		}
		if i == 0 {
			return bb, nil
		}
		inner := bb[i-1]
		if inner.crc32c {
			return nil, fmt.Errorf("%w: fletcher32 around crc32c", codec.ErrUnsupported)
		}
		out := append([]bbCodec(nil), bb[:i-1]...)
		return append(out, bbCodec{name: codec.Fletcher32Of(inner.name)}), nil
	}
	return bb, nil
}

// compressions counts the steps that change the size of the data: at most
// one is read, since the size each decodes to must follow from the
// metadata.
func compressions(bb []bbCodec) int {
	n := 0
	for _, c := range bb {
		if !c.crc32c && !codec.IsFilter(c.name) {
			n++
		}
	}
	return n
}
