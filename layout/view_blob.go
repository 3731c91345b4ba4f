package layout

// A view's sample files, made on demand from the sample index.

import (
	"fmt"

	"github.com/zarrfs/zarrfs/zarr"
)

// viewSet is the sample files of a view, made on demand like an array's.
type viewSet struct {
	v      *View
	opts   Options
	header []byte
	width  int
	size   int64
}

func (s *viewSet) len() int64 { return s.v.N }

func (s *viewSet) index(name string) (int64, bool) { return parseSampleName(name, s.width, s.v.N) }

func (s *viewSet) entry(k int64) Entry {
	name := sampleFileName(k, s.width)
	return Entry{Name: name, Kind: KindBlob, Blob: &ViewBlob{
		v: s.v, align: s.opts.Align, k: k, path: s.v.Name + "/" + name, header: s.header, size: s.size,
	}}
}

// ViewBlob is sample K of a view: its channels, each a region of an
// array, stacked and cast to the view's DType.
type ViewBlob struct {
	v      *View
	align  int64
	k      int64
	path   string
	header []byte
	size   int64
}

var _ Blob = (*ViewBlob)(nil)

func (b *ViewBlob) Path() string   { return b.path }
func (b *ViewBlob) Size() int64    { return b.size }
func (b *ViewBlob) Header() []byte { return b.header }

// Inputs is the view's definition, Align and the sample's index.
func (b *ViewBlob) Inputs() string {
	return fmt.Sprintf("view\x00%s\x00align=%d\x00k=%d", b.v.def, b.align, b.k)
}

// Sources lists one region per channel, static channels included.
func (b *ViewBlob) Sources() []zarr.Request {
	t := b.v.Start + b.k*b.v.Step
	out := make([]zarr.Request, len(b.v.Channels))
	for i := range b.v.Channels {
		ch := &b.v.Channels[i]
		start, count := ch.Region(t)
		out[i] = zarr.Request{Array: ch.Array, Start: start, Count: count}
	}
	return out
}

// View is the view the blob is a sample of.
func (b *ViewBlob) View() *View { return b.v }

// Index is the sample's index among the view's samples (K).
func (b *ViewBlob) Index() int64 { return b.k }
