package icechunk

import (
	"errors"
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/objectstore/icechunk/format"
)

// buildManifest is a manifest of one array (node id "nodeid01") whose
// chunks, at the given 1-D indices, are inline bytes.
func buildManifest(idx ...uint32) []byte {
	b := flatbuffers.NewBuilder(256)
	refs := make([]flatbuffers.UOffsetT, len(idx))
	for i, x := range idx {
		data := b.CreateByteVector([]byte{byte(x)})
		format.ChunkRefStartIndexVector(b, 1)
		b.PrependUint32(x)
		iv := b.EndVector(1)
		format.ChunkRefStart(b)
		format.ChunkRefAddIndex(b, iv)
		format.ChunkRefAddInline(b, data)
		refs[i] = format.ChunkRefEnd(b)
	}
	format.ArrayManifestStartRefsVector(b, len(refs))
	for i := len(refs) - 1; i >= 0; i-- {
		b.PrependUOffsetT(refs[i])
	}
	rv := b.EndVector(len(refs))
	format.ArrayManifestStart(b)
	id := []byte("nodeid01")
	format.ArrayManifestAddNodeId(b, format.CreateObjectId8(b, id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]))
	format.ArrayManifestAddRefs(b, rv)
	am := format.ArrayManifestEnd(b)
	format.ManifestStartArraysVector(b, 1)
	b.PrependUOffsetT(am)
	av := b.EndVector(1)
	format.ManifestStart(b)
	format.ManifestAddArrays(b, av)
	b.Finish(format.ManifestEnd(b))
	return b.FinishedBytes()
}

// A manifest or snapshot that cannot say where a chunk is fails that
// chunk with an error naming the manifest, the chunk and the cause, never
// reads it as the fill value: a chunk referenced twice in one manifest,
// one that two manifests' extents both hold, one a manifest holds outside
// the extent its snapshot lists it under.
func TestManifestsThatCannotSayWhereAChunkIs(t *testing.T) {
	if _, err := parseManifest(buildManifest(0, 1, 1)); !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), "[1]") || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a chunk referenced twice: %v", err)
	}
	m, err := parseManifest(buildManifest(0, 1, 3))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.arrays["nodeid01"]) != 3 {
		t.Fatalf("parsed %d chunks, want 3", len(m.arrays["nodeid01"]))
	}

	n := &node{path: "t", id: "nodeid01", manifests: []manifestRef{
		{id: "AAAA", lo: []uint32{0}, hi: []uint32{2}},
		{id: "BBBB", lo: []uint32{1}, hi: []uint32{4}},
		{id: "CCCC", lo: []uint32{6}, hi: []uint32{8}},
	}}
	if r, ok, err := n.manifestFor([]uint32{0}); err != nil || !ok || r.id != "AAAA" {
		t.Errorf("chunk 0: %v %v %v, want manifest AAAA", r.id, ok, err)
	}
	if _, ok, err := n.manifestFor([]uint32{4}); err != nil || ok {
		t.Errorf("chunk 4, in no extent (never written): %v %v", ok, err)
	}
	_, _, err = n.manifestFor([]uint32{1})
	if !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), "AAAA") || !strings.Contains(err.Error(), "BBBB") || !strings.Contains(err.Error(), `"/t"`) {
		t.Errorf("chunk 1 in two extents: %v, want an error naming both manifests and the array", err)
	}

	if err := m.within(n, n.manifests[1]); err == nil {
		// BBBB's extent is 1..4: chunk 0 lies outside it.
		t.Error("chunk 0 held by a manifest listed for 1..4: no error")
	} else if !strings.Contains(err.Error(), "BBBB") || !strings.Contains(err.Error(), "[0]") {
		t.Errorf("outside its extent: %v, want the manifest and the chunk named", err)
	}
	wide := manifestRef{id: "DDDD", lo: []uint32{0}, hi: []uint32{4}}
	if err := m.within(n, wide); err != nil {
		t.Errorf("every chunk within 0..4: %v", err)
	}
}
