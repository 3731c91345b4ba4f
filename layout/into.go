package layout

import (
	"context"
	"fmt"
	"io"
)

// FillInto fills the data of blobs[i] (its bytes after the header, Size -
// Align of them) into outs[i], memory the caller holds: a ring slot that a
// reader's process shares, say, where going through a file would cost a
// write and a read. It is FillBatch without the writers: runs of
// consecutive samples of one view are read together, straight into outs
// (chunks that land whole decode in place there), and other blobs are
// filled one by one through their Fill. It acquires from the memory budget
// what FillBatch would, so delivery and the mount's fills share one bound.
// Nothing is read back from outs (a static channel is read for each sample
// or copied from what another fill kept), so the Read's decoder may put a
// chunk that lands whole in outs somewhere else instead (a GPU decoding
// into a ring slot: deliver.GPUFill). It stops at the first error; outs
// then hold garbage.
func FillInto(ctx context.Context, blobs []Blob, outs [][]byte, maxBytes int64) error {
	if len(blobs) != len(outs) {
		return fmt.Errorf("layout: FillInto with %d blobs and %d buffers", len(blobs), len(outs))
	}
	if maxBytes <= 0 {
		maxBytes = DefaultBatchBytes
	}
	for i, b := range blobs {
		if want := b.Size() - int64(len(b.Header())); int64(len(outs[i])) != want {
			return fmt.Errorf("%s: FillInto with a buffer of %d bytes, want %d", b.Path(), len(outs[i]), want)
		}
	}
	for i := 0; i < len(blobs); {
		vb, ok := blobs[i].(*viewBlob)
		data := int64(0)
		if ok {
			data = vb.size - vb.opts.Align
		}
		if !ok || !vb.opts.MemoryBudget.Fits(vb.v.fillCost(data, []int64{vb.k})) {
			// Not a view, or a sample too large to read in one go (it is
			// then filled channel by channel, as Fill does).
			if err := blobs[i].Fill(ctx, dataWriter{outs[i], int64(len(blobs[i].Header()))}); err != nil {
				return err
			}
			i++
			continue
		}
		ks := []int64{vb.k}
		j := i + 1
		for j < len(blobs) && int64(j-i+1)*data <= maxBytes {
			nb, ok := blobs[j].(*viewBlob)
			if !ok || nb.v != vb.v || nb.opts.Reader != vb.opts.Reader || nb.opts.Align != vb.opts.Align {
				break
			}
			if !vb.opts.MemoryBudget.Fits(2 * vb.v.fillCost(data, append(ks, nb.k))) {
				break
			}
			ks = append(ks, nb.k)
			j++
		}
		release, err := vb.opts.acquire(ctx, vb.v.fillCost(data, ks), "samples of view "+vb.v.Name)
		if err != nil {
			return fmt.Errorf("%s: %w", vb.path, err)
		}
		err = vb.v.fillSamplesAs(ctx, vb.opts.Reader, ks, outs[i:j], true)
		release()
		if err != nil {
			if j-i == 1 {
				return fmt.Errorf("%s: %w", vb.path, err)
			}
			return fmt.Errorf("%s..%s: %w", vb.path, blobs[j-1].Path(), err)
		}
		i = j
	}
	return nil
}

// dataWriter takes a blob's Fill into the caller's buffer of its data: the
// header (written at offsets below skip) is dropped, the data written at
// its offset less skip.
type dataWriter struct {
	buf  []byte
	skip int64
}

var _ io.WriterAt = dataWriter{}

func (w dataWriter) WriteAt(p []byte, off int64) (int, error) {
	if off < w.skip {
		if off+int64(len(p)) > w.skip {
			return 0, fmt.Errorf("layout: a write of %d bytes at %d straddles the data offset %d", len(p), off, w.skip)
		}
		return len(p), nil
	}
	off -= w.skip
	if off+int64(len(p)) > int64(len(w.buf)) {
		return 0, fmt.Errorf("layout: a write of %d bytes at data offset %d passes the end (%d)", len(p), off, len(w.buf))
	}
	copy(w.buf[off:], p)
	return len(p), nil
}
