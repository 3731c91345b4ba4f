package layout

import (
	"bytes"
	"encoding/json"

	"github.com/zarrfs/zarrfs/zarr"
)

// Sidecar is the JSON document at MOUNT/P.json (docs/design.md §4).
type Sidecar struct {
	Kind string `json:"kind"`
	// Path is the array's store path.
	Path        string         `json:"path"`
	Shape       []int64        `json:"shape"`
	DType       string         `json:"dtype"`
	Dims        []*string      `json:"dims"`
	SampleDim   *string        `json:"sample_dim"`
	SampleShape []int64        `json:"sample_shape"`
	Files       int64          `json:"files"`
	DataOffset  int64          `json:"data_offset"`
	FillValue   any            `json:"fill_value"`
	Attributes  map[string]any `json:"attributes"`
	// AttributesLeftOut names the attributes larger than the metadata
	// limit allows (zarr.MetadataLimits.Attributes): never parsed, they
	// are not copied here either.
	AttributesLeftOut []string `json:"attributes_left_out,omitempty"`
	// The rest helps users judge read patterns; it is not part of the
	// contract's minimum.
	SourceDType string   `json:"source_dtype"`
	Chunks      []int64  `json:"chunks"`
	Codecs      []string `json:"codecs"`
	ZarrFormat  int      `json:"zarr_format"`
	// Shard is set when the mount lists only one rank's samples.
	Shard *SidecarShard `json:"shard,omitempty"`
}

// SidecarShard tells which samples a rank's sample directory lists: the
// global indices First, First+Step, ..., Count of them (Files is Count).
type SidecarShard struct {
	Rank  int    `json:"rank"`
	World int    `json:"world"`
	Mode  string `json:"mode"`
	First int64  `json:"first"`
	Step  int64  `json:"step"`
	Count int64  `json:"count"`
}

func (o Options) sidecarShard(p *Progression) *SidecarShard {
	if p == nil {
		return nil
	}
	return &SidecarShard{Rank: o.Shard.Rank, World: o.Shard.World, Mode: o.Shard.Mode(), First: p.First, Step: p.Step, Count: p.Count}
}

// sidecar renders the description of array a. axis is the sample axis or
// -1; files counts the files listed; pick is the rank's share, if any.
func sidecar(o Options, a *zarr.Array, axis int, sampleShape []int64, files int64, pick *Progression) ([]byte, error) {
	s := Sidecar{
		Kind:              "array",
		Path:              a.Path,
		Shape:             nonNil(a.Shape),
		DType:             a.DType.NumpyLE(),
		Dims:              make([]*string, len(a.Shape)),
		SampleShape:       nonNil(sampleShape),
		Files:             files,
		DataOffset:        o.Align,
		FillValue:         a.FillValue,
		Attributes:        a.Attributes,
		AttributesLeftOut: a.AttributesLeftOut,
		SourceDType:       a.DType.NumpySource(),
		Chunks:            nonNil(a.Chunks),
		Codecs:            a.Codecs,
		ZarrFormat:        a.ZarrFormat,
		Shard:             o.sidecarShard(pick),
	}
	for i := range s.Dims {
		// An unnamed dimension is null rather than "", so that consumers
		// cannot mistake it for a name.
		if i < len(a.Dims) && a.Dims[i] != "" {
			d := a.Dims[i]
			s.Dims[i] = &d
		}
	}
	if axis >= 0 {
		d := o.SampleDim
		s.SampleDim = &d
	}
	if s.Attributes == nil {
		s.Attributes = map[string]any{}
	}
	if s.Codecs == nil {
		s.Codecs = []string{}
	}
	return sidecarJSON(s)
}

// sidecarJSON is a sidecar's text: indented, and without HTML escaping,
// so that dtype strings such as "<f4" read as written.
func sidecarJSON(s any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}
