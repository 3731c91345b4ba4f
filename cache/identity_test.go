package cache

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func getIdent(t testing.TB, c *Cache, path, ident string, data []byte) *Handle {
	t.Helper()
	h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: path, Identity: ident}, int64(len(data)), writeFill(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A blob recorded with another identity is stale: GetBlob fills it again
// and replaces the file at the same path, HasBlob does not count it, and a
// reader that opened the old version keeps reading it.
func TestIdentityReplacesStaleBlob(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	v1, v2 := content("v1", 5000), content("v2", 5000)
	old := getIdent(t, c, "t/0.npy", "a1", v1)
	defer old.Close()
	if !c.HasBlob(BlobKey{Layout: "L", Path: "t/0.npy", Identity: "a1"}) || c.HasBlob(BlobKey{Layout: "L", Path: "t/0.npy", Identity: "b2"}) {
		t.Fatal("HasBlob ignores the identity")
	}
	fills := 0
	h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "t/0.npy", Identity: "b2"}, int64(len(v2)), func(ctx context.Context, f Writer) error {
		fills++
		return writeFill(v2)(ctx, f)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if fills != 1 || !bytes.Equal(readAll(t, h), v2) {
		t.Fatalf("fills %d; new version not served", fills)
	}
	if h.Path() != old.Path() {
		t.Fatalf("path moved: %s, was %s", h.Path(), old.Path())
	}
	if got, _ := os.ReadFile(h.Path()); !bytes.Equal(got, v2) {
		t.Fatal("the path does not name the new version")
	}
	if !bytes.Equal(readAll(t, old), v1) {
		t.Fatal("a reader of the old version lost it")
	}
	// The same identity again is a hit; the old one now is stale.
	h2 := getIdent(t, c, "t/0.npy", "b2", content("never", 5000))
	h2.Close()
	if b, n := c.Usage(); n != 1 || b != 5000 {
		t.Fatalf("usage %d bytes in %d files, want one blob", b, n)
	}
}

// Identities survive a restart, a clean one and a kill alike, and a kill
// between the record of a replacement and its rename leaves no stale file
// under the new record.
func TestIdentityPersists(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	getIdent(t, c, "a.npy", "x1", content("a", 100)).Close()
	getIdent(t, c, "b.npy", "", content("b", 100)).Close()
	c.Close()
	c = mustOpen(t, Options{Dir: dir})
	if !c.HasBlob(BlobKey{Layout: "L", Path: "a.npy", Identity: "x1"}) || !c.HasBlob(BlobKey{Layout: "L", Path: "b.npy"}) {
		t.Fatal("identities lost across a clean restart")
	}
	// A replacement whose record reached the journal but whose rename did not.
	jf, _ := os.OpenFile(filepath.Join(dir, journalRel), os.O_WRONLY|os.O_APPEND, 0)
	jf.Write(appendRecord(nil, record{op: opAdd, writer: "dead", size: 100, sum: checksum{v: 12345}, ident: "x2", key: "blobs/L/a.npy"}))
	jf.Close()
	c.abandon()
	c = mustOpen(t, Options{Dir: dir})
	defer c.Close()
	if c.HasBlob(BlobKey{Layout: "L", Path: "a.npy", Identity: "x2"}) || c.HasBlob(BlobKey{Layout: "L", Path: "a.npy", Identity: "x1"}) {
		t.Fatal("a blob whose replacement was cut short is still served")
	}
	h := getIdent(t, c, "a.npy", "x2", content("a2", 100))
	defer h.Close()
	if !bytes.Equal(readAll(t, h), content("a2", 100)) {
		t.Fatal("refill after recovery wrong")
	}
}

// A journal written before identities (header version 1, no identity
// field) is read as blobs without identity and rewritten in the current
// format.
func TestJournalVersion1(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	data := content("old", 300)
	getIdent(t, c, "old.npy", "", data).Close()
	c.Close()
	// Rewrite the journal as version 1 wrote it.
	writeJournal(t, dir, journalHeaderV1, fmt.Sprintf(`A w1 300 %x "blobs/L/old.npy"`, xxhash.Sum64(data)))
	c = mustOpen(t, Options{Dir: dir})
	if !c.HasBlob(BlobKey{Layout: "L", Path: "old.npy"}) {
		t.Fatal("version 1 record not read")
	}
	c.Close()
	j, _ := os.ReadFile(filepath.Join(dir, journalRel))
	if !bytes.HasPrefix(j, []byte(journalHeader)) {
		t.Fatalf("journal not rewritten in the current format: %q", j[:20])
	}
}

// A blob asked for under a new path with the identity of one the layout
// directory holds (sample names widened when the store grew) is linked,
// not filled; garbage can then be listed, demoted and removed.
func TestIdentityAdoptedAcrossPaths(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	data := content("sample 3", 3000)
	getIdent(t, c, "t/3.npy", "s3", data).Close()
	h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "t/03.npy", Identity: "s3"}, int64(len(data)), func(context.Context, Writer) error {
		t.Error("filled although a blob of the same identity exists")
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, h), data) {
		t.Fatal("adopted blob differs")
	}
	if h.Filled() {
		t.Error("an adopted blob reports a fill")
	}
	h.Close()
	a, _ := os.Stat(c.BlobPath(BlobKey{Layout: "L", Path: "t/3.npy"}))
	b, _ := os.Stat(c.BlobPath(BlobKey{Layout: "L", Path: "t/03.npy"}))
	if !os.SameFile(a, b) {
		t.Error("adopted blob is a copy, not a link")
	}
	// Another layout directory does not share identities.
	fills := 0
	h, _, err = c.GetBlob(context.Background(), BlobKey{Layout: "M", Path: "t/03.npy", Identity: "s3"}, int64(len(data)), func(ctx context.Context, f Writer) error {
		fills++
		return writeFill(data)(ctx, f)
	}, nil)
	if err != nil || fills != 1 {
		t.Fatalf("other layout: %v, %d fills", err, fills)
	}
	if !h.Filled() {
		t.Error("a blob filled for another layout reports no fill")
	}
	h.Close()

	if got := c.Blobs("L"); len(got) != 2 {
		t.Fatalf("Blobs(L) = %v", got)
	}
	if n := c.Demote("L", []string{"t/3.npy", "t/nothing.npy"}); n != 1 {
		t.Errorf("demoted %d", n)
	}
	held := getIdent(t, c, "t/03.npy", "s3", data)
	if gone, err := c.RemoveBlob("L", "t/03.npy"); err != nil || gone {
		t.Errorf("removing an open blob: %v %v", gone, err)
	}
	held.Close()
	if gone, err := c.RemoveBlob("L", "t/3.npy"); err != nil || !gone {
		t.Errorf("removing: %v %v", gone, err)
	}
	if _, err := os.Stat(c.BlobPath(BlobKey{Layout: "L", Path: "t/3.npy"})); !os.IsNotExist(err) {
		t.Error("removed blob still on disk")
	}
	if got := c.Blobs("L"); len(got) != 1 || got[0].Path != "t/03.npy" || got[0].Identity != "s3" {
		t.Errorf("Blobs(L) after removal = %v", got)
	}
}

// Demoted blobs are the first evicted.
func TestDemotedEvictedFirst(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir(), Size: 3000})
	defer c.Close()
	for _, p := range []string{"a.npy", "b.npy", "c.npy"} {
		getIdent(t, c, p, "", content(p, 1000)).Close()
	}
	c.Demote("L", []string{"c.npy"}) // the most recent, demoted
	getIdent(t, c, "d.npy", "", content("d", 1000)).Close()
	if c.HasBlob(BlobKey{Layout: "L", Path: "c.npy"}) || !c.HasBlob(BlobKey{Layout: "L", Path: "a.npy"}) {
		t.Error("eviction did not take the demoted blob first")
	}
}
