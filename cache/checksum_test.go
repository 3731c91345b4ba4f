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

// refSum is the checksum of data as checksum.go defines it, computed
// from the definition: xxh64 of the whole, or XXH3 of the size and of
// each segment's XXH3.
func refSum(data []byte, tree bool) checksum {
	if !tree {
		return checksum{v: xxhash.Sum64(data)}
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(data)))
	for off := 0; off < len(data); off += segSize {
		b = binary.LittleEndian.AppendUint64(b, xxh3.Hash(data[off:min(off+segSize, len(data))]))
	}
	return checksum{v: xxh3.Hash(b), tree: true}
}

// The running hashes, fed in pieces of any sizes, and hashFile give the
// checksum of the definition; sizes around the segment's, none.
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
			want := refSum(data[:n], tree)
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
			if got := sumOf(data[:n], tree); got != want {
				t.Fatalf("sumOf %d bytes, tree %v: %+v, want %+v", n, tree, got, want)
			}
			if got, err := hashFile(f, int64(n), buf, tree); err != nil || got != want {
				t.Fatalf("hashFile of %d bytes, tree %v: %+v, %v, want %+v", n, tree, got, err, want)
			}
		}
	}
	if a, b := refSum(data[:segSize], true), refSum(data[:segSize+1], true); a == b {
		t.Fatal("a byte more, the same segment hash")
	}
	if a, b := refSum(make([]byte, 10), true), refSum(make([]byte, 11), true); a == b {
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
		case strings.Contains(line, `"blobs/L/new.npy"`) && !strings.Contains(line, fmt.Sprintf(" t%x ", refSum(data, true).v)):
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
