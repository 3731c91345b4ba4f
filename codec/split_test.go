package codec

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
)

// A large blosc frame decoded by a batch that leaves workers idle is cut
// into block ranges over them: the bytes are those of decoding it whole,
// and a damaged block fails the job with the error decoding it whole
// gives, whichever part meets it.
func TestBloscSplitAcrossWorkers(t *testing.T) {
	data := make([]byte, splitMin+5*splitPart+4000) // a short last block
	for i := range data {
		data[i] = byte(splitmix64(uint64(i/7)) & 0x0f)
	}
	frame := bloscEncode(t, data, 4, bloscLZ4, ByteShuffle, 256<<10, true)
	small := bloscEncode(t, data[:64<<10], 4, bloscLZ4, ByteShuffle, 16<<10, true)

	if parts := split([]Job{{Codec: Blosc, Src: frame, Dst: make([]byte, len(data))}}, 8); len(parts) != 8 {
		t.Fatalf("a %d-byte frame for 8 idle workers: %d parts, want 8", len(data), len(parts))
	}
	if parts := split([]Job{{Codec: Blosc, Src: frame, Dst: make([]byte, len(data))}, {Codec: Blosc, Src: small, Dst: make([]byte, 64<<10)}}, 2); parts != nil {
		t.Fatalf("no idle worker: %d parts, want none", len(parts))
	}

	c := must(NewCPU(Options{Workers: 8}))
	defer c.Close()
	jobs := []Job{
		{Codec: Blosc, Src: frame, Dst: make([]byte, len(data))},
		{Codec: Blosc, Src: small, Dst: make([]byte, 64<<10)},
	}
	if err := c.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	if jobs[0].Err != nil || !bytes.Equal(jobs[0].Dst, data) {
		t.Fatalf("split frame: %v, equal %v", jobs[0].Err, bytes.Equal(jobs[0].Dst, data))
	}
	if jobs[1].Err != nil || !bytes.Equal(jobs[1].Dst, data[:64<<10]) {
		t.Fatalf("small frame beside it: %v", jobs[1].Err)
	}

	// Two damaged blocks, in two different parts: the first one's error,
	// as the whole frame's decoder reports it.
	bad := append([]byte{}, frame...)
	nblocks := (len(data) + (256 << 10) - 1) / (256 << 10)
	for _, blk := range []int{nblocks / 2, nblocks - 2} {
		pos := int(binary.LittleEndian.Uint32(bad[16+4*blk:]))
		binary.LittleEndian.PutUint32(bad[pos:], 1<<30) // its first stream claims too much
	}
	whole := newDecoder().decode(Blosc, make([]byte, len(data)), bad)
	if whole == nil {
		t.Fatal("the damaged frame decodes whole")
	}
	jobs = []Job{{Codec: Blosc, Src: bad, Dst: make([]byte, len(data))}}
	if err := c.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	if jobs[0].Err == nil || jobs[0].Err.Error() != whole.Error() {
		t.Fatalf("damaged split frame: %v, want %v", jobs[0].Err, whole)
	}
}
