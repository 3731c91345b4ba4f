package icechunk

import (
	"errors"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
)

func TestEncodeID(t *testing.T) {
	// The example of the specification: the initial snapshot's id.
	id := []byte{0x0b, 0x1c, 0xc8, 0xd6, 0x78, 0x75, 0x80, 0xf0, 0xe3, 0x3a, 0x65, 0x34}
	if got := encodeID(id); got != "1CECHNKREP0F1RSTCMT0" {
		t.Fatalf("encodeID = %s", got)
	}
	if !isSnapshotID("1CECHNKREP0F1RSTCMT0") || isSnapshotID("1CECHNKREP0F1RSTCMTI") || isSnapshotID("main") {
		t.Fatal("isSnapshotID")
	}
}

func TestUnpack(t *testing.T) {
	h := append([]byte(nil), magic...)
	h = append(h, []byte("zarrfs-test             ")...)
	good := append(append([]byte(nil), h...), 2, fileManifest, compressNone)
	good = append(good, make([]byte, 16)...)
	if spec, _, err := unpack(good, fileManifest); err != nil || spec != 2 {
		t.Fatalf("unpack: %d %v", spec, err)
	}
	bad := append([]byte(nil), good...)
	bad[36] = 3
	if _, _, err := unpack(bad, fileManifest); !errors.Is(err, ErrSpecVersion) {
		t.Errorf("spec 3: %v", err)
	}
	if _, _, err := unpack(good, fileSnapshot); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("wrong file type: %v", err)
	}
	if _, _, err := unpack(good[:20], fileManifest); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("short file: %v", err)
	}
	z := append(append([]byte(nil), h...), 1, fileManifest, compressZstd, 1, 2, 3)
	if _, _, err := unpack(z, fileManifest); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("bad zstd: %v", err)
	}
	// Damaged flatbuffers never panic.
	for _, f := range []func([]byte) error{
		func(b []byte) error { _, err := parseManifest(b); return err },
	} {
		_ = f(make([]byte, 16))
		_ = f([]byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 1, 2, 3, 4})
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 8 {
			return
		}
		parseManifest(b) // must not panic
	})
}
