package cache

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/zeebo/xxh3"
)

// The segment hash, spelled out for an object of two segments, the second
// short, and for the empty object, and the values a version 3 journal holds
// for them: what the format is, pinned (a change to it would fail here, and
// caches written before would fail verification after a crash).
func TestSegmentHashFormat(t *testing.T) {
	d := make([]byte, segSize+10)
	for i := range d {
		d[i] = byte(i*7 + 3)
	}
	le := binary.LittleEndian
	spelled := xxh3.Hash(le.AppendUint64(le.AppendUint64(le.AppendUint64(nil, uint64(len(d))),
		xxh3.Hash(d[:segSize])), xxh3.Hash(d[segSize:])))
	for _, c := range []struct {
		data []byte
		want uint64
	}{{nil, 0xc77b3abb6f87acd9}, {d[:10], 0x3c0b6cc9647b84b1}, {d, 0x1514b8faae85174}} {
		if got := sumOf(c.data, true); got != (checksum{v: c.want, tree: true}) {
			t.Errorf("%d bytes: %x, want %x", len(c.data), got.v, c.want)
		}
	}
	if spelled != 0x1514b8faae85174 {
		t.Errorf("the definition spelled out gives %x", spelled)
	}
	if got := sumOf(d, false); got != (checksum{v: xxhash.Sum64(d)}) {
		t.Errorf("xxh64: %+v", got)
	}
}

// The running hashes, fed in pieces of any sizes, and hashFile give sumOf's
// checksum; sizes around the segment's, none.
func TestChecksumPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	data := make([]byte, 3*segSize+12345)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(data)
	buf := make([]byte, 1<<20)
	for _, n := range []int{0, 1, 4096, segSize - 1, segSize, segSize + 1, 2 * segSize, len(data)} {
		for _, tree := range []bool{true, false} {
			want := sumOf(data[:n], tree)
			for split := range 20 {
				h := newHasher(tree)
				for p := data[:n]; len(p) > 0; {
					k := len(p)
					switch split % 4 {
					case 1:
						k = min(k, 1+r.IntN(1000))
					case 2:
						k = min(k, 1+r.IntN(3*segSize))
					case 3:
						k = min(k, segSize)
					}
					h.Write(p[:k])
					p = p[k:]
				}
				if got := h.sum(); got != want {
					t.Fatalf("%d bytes, tree %v, split %d: %+v, want %+v", n, tree, split, got, want)
				}
			}
			if got, err := hashFile(f, int64(n), buf, tree); err != nil || got != want {
				t.Fatalf("hashFile of %d bytes, tree %v: %+v, %v, want %+v", n, tree, got, err, want)
			}
		}
	}
	if a, b := sumOf(data[:segSize], true), sumOf(data[:segSize+1], true); a == b {
		t.Fatal("a byte more, the same segment hash")
	}
	if a, b := sumOf(make([]byte, 10), true), sumOf(make([]byte, 11), true); a == b {
		t.Fatal("the size is not in the segment hash")
	}
}

// A journal of version 2 (what releases before segment hashes write and
// share): an instance that joins it writes xxh64, which they read; the next
// exclusive Open rewrites it as version 3, its records keeping their
// xxh64 and verifying with it, and blobs filled after that get segment
// hashes.
func TestJournalVersion2(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	old := content("old", 300)
	getIdent(t, c, "old.npy", "o1", old).Close()
	c.Close()
	// Rewrite the journal as version 2 wrote it, the record left
	// suspicious (no marker, no quit), so that the next Open verifies it.
	writeJournal(t, dir, journalHeaderV2, fmt.Sprintf(`A w1 300 %x o1 "blobs/L/old.npy"`, xxhash.Sum64(old)))
	jp := filepath.Join(dir, journalRel)
	// Joined while a release of version 2 holds it (its lock, as such an
	// instance would): records in xxh64.
	c = mustOpen(t, Options{Dir: dir})
	j, _ := os.ReadFile(jp)
	if !bytes.HasPrefix(j, []byte(journalHeader)) {
		t.Fatalf("journal not rewritten as version 3: %q", j[:15])
	}
	if !c.HasBlob(BlobKey{Layout: "L", Path: "old.npy", Identity: "o1"}) {
		t.Fatal("the version 2 record did not verify with its xxh64")
	}
	data := content("new", 5000)
	getIdent(t, c, "new.npy", "n1", data).Close()
	c.Close()
	j, _ = os.ReadFile(jp)
	for _, line := range strings.Split(string(j), "\n") {
		switch {
		case strings.Contains(line, `"blobs/L/old.npy"`) && !strings.Contains(line, fmt.Sprintf(" %x ", xxhash.Sum64(old))):
			t.Errorf("the old record lost its xxh64: %s", line)
		case strings.Contains(line, `"blobs/L/new.npy"`) && !strings.Contains(line, fmt.Sprintf(" t%x ", sumOf(data, true).v)):
			t.Errorf("the new blob has no segment hash: %s", line)
		}
	}
}

// An instance that joins a journal of version 2 while another holds it (a
// release before segment hashes, here its read lock on the directory)
// writes xxh64 records, which that release reads.
func TestJoinVersion2WritesXXH64(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, Options{Dir: dir}).Close()
	jp := filepath.Join(dir, journalRel)
	if err := os.WriteFile(jp, []byte(journalHeaderV2), 0o644); err != nil {
		t.Fatal(err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, lockRel), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := ofdLock(lf, syscall.F_RDLCK, false); err != nil {
		t.Fatal(err)
	}
	c := mustOpen(t, Options{Dir: dir})
	data := content("joined", 5000)
	getIdent(t, c, "j.npy", "j1", data).Close()
	c.Close()
	j, _ := os.ReadFile(jp)
	if !bytes.HasPrefix(j, []byte(journalHeaderV2)) {
		t.Fatalf("a joined journal was rewritten: %q", j[:15])
	}
	want := fmt.Sprintf(" %x j1 \"blobs/L/j.npy\"", xxhash.Sum64(data))
	if !strings.Contains(string(j), want) {
		t.Fatalf("no xxh64 record %q in the version 2 journal:\n%s", want, j)
	}
	// What a release of version 2 parses: every line of it.
	n, bad := scanRecords(j[len(journalHeaderV2):], map[string]string{}, func(r record) {
		if r.sum.tree {
			t.Errorf("a segment hash in a version 2 journal: %+v", r)
		}
	})
	if bad != 0 || n != len(j)-len(journalHeaderV2) {
		t.Fatalf("%d bad records, %d of %d bytes", bad, n, len(j)-len(journalHeaderV2))
	}
}

// writeJournal replaces dir's journal with header and one record, body,
// as a release of that header's version wrote them.
func writeJournal(t *testing.T, dir, header, body string) {
	t.Helper()
	j := fmt.Sprintf("%s%s %x\n", header, body, crc32.Checksum([]byte(body), castagnoli))
	if err := os.WriteFile(filepath.Join(dir, journalRel), []byte(j), 0o644); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkChecksum times the two checksums over 16 MiB handed in the
// pieces a fill writes (hashPiece), as the running hash of a blob sees
// them; each piece is hashed right after the previous one, so it comes
// from the core's cache only as far as 16 MiB stays there.
func BenchmarkChecksum(b *testing.B) {
	data := make([]byte, 16<<20)
	r := rand.New(rand.NewPCG(2, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	for _, c := range []struct {
		name string
		tree bool
	}{{"xxh64", false}, {"segments", true}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				h := newHasher(c.tree)
				for off := 0; off < len(data); off += hashPiece {
					h.Write(data[off : off+hashPiece])
				}
				h.sum()
			}
		})
	}
}
