package cache

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// After a simulated kill: torn temp files, a truncated blob, a blob with a
// flipped byte, a blob grown past its recorded size (its recorded bytes
// intact, so only the size tells) and a deletion logged but not carried
// out are all cleaned up by the next Open, which serves only complete,
// correct blobs.
func TestRecoveryAfterKill(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	for i := range 20 {
		getBlob(t, c, key(i))
	}
	// A fill in progress at the moment of the kill: its temp file stays.
	started, hang := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(hang) })
	go c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "torn.npy"}, 1<<20, func(ctx context.Context, f Writer) error {
		f.Write(make([]byte, 1000))
		close(started)
		<-hang
		return errors.New("killed")
	}, nil)
	<-started
	deadTmp := tempFiles(t, dir)
	if len(deadTmp) != 1 {
		t.Fatalf("temp files %v, want the one torn fill", deadTmp)
	}
	c.abandon() // no clean shutdown: the journal keeps its tail

	// Damage after the kill.
	truncated, flipped := c.BlobPath(BlobKey{Layout: "L", Path: key(3)}), c.BlobPath(BlobKey{Layout: "L", Path: key(4)})
	if err := os.Truncate(truncated, 100); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(flipped)
	b[len(b)/2] ^= 0x55
	os.WriteFile(flipped, b, 0o644)
	grown := c.BlobPath(BlobKey{Layout: "L", Path: key(5)})
	os.Chmod(grown, 0o600) // blobs are read-only
	gf, err := os.OpenFile(grown, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	gf.Write([]byte("trailing bytes no record covers"))
	gf.Close()
	// A deletion that was logged, then killed before the unlink.
	ghost := BlobKey{Layout: "L", Path: "ghost.npy"}
	os.WriteFile(c.BlobPath(ghost), []byte("orphan"), 0o644)
	jf, _ := os.OpenFile(filepath.Join(dir, journalRel), os.O_WRONLY|os.O_APPEND, 0)
	jf.Write(appendRecord(nil, record{op: opAdd, writer: "dead", size: 6, sum: checksum{v: 1}, key: "blobs/L/ghost.npy"}))
	jf.Write(appendRecord(nil, record{op: opDel, writer: "dead", key: "blobs/L/ghost.npy"}))
	jf.Write([]byte("A dead 12 34 \"blobs/L/torn-rec")) // a record torn mid-write
	jf.Close()
	// Torn temps of another dead instance, and a stray file with no owner.
	os.MkdirAll(filepath.Join(dir, tmpDir, "deadbeef"), 0o755)
	os.WriteFile(filepath.Join(dir, tmpDir, "deadbeef.lock"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, tmpDir, "deadbeef", "blob-1"), []byte("torn"), 0o644)
	os.WriteFile(filepath.Join(dir, tmpDir, "stray"), []byte("torn"), 0o644)

	var logs strings.Builder
	c2 := mustOpen(t, Options{Dir: dir, Logger: testLoggerTo(t, &logs)})
	defer c2.Close()
	if tf := tempFiles(t, dir); len(tf) != 0 {
		t.Fatalf("torn temp files survived Open: %v", tf)
	}
	for _, p := range []string{truncated, flipped, grown, c.BlobPath(ghost)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived recovery", p)
		}
	}
	if !strings.Contains(logs.String(), "suspicious=20") || !strings.Contains(logs.String(), "dropped=4") {
		t.Errorf("recovery log: %s", logs.String())
	}
	for i := range 20 {
		k := BlobKey{Layout: "L", Path: key(i)}
		if has := c2.HasBlob(k); has == (i == 3 || i == 4 || i == 5) {
			t.Errorf("HasBlob(%s) = %v", k.Path, has)
		}
		getBlob(t, c2, key(i)) // damaged ones are filled again
	}
	used, files := c2.Usage()
	if d, f := diskUsage(t, dir); d != used || f != files || files != 20 {
		t.Fatalf("Usage %d/%d, disk %d/%d", used, files, d, f)
	}
}

// A clean shutdown leaves nothing to verify, and the index survives it.
// Damage done later is caught where it can be cheaply: a blob whose size
// changed is filled again on its next open.
func TestRestartAfterCleanClose(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	for i := range 10 {
		getBlob(t, c, key(i))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	c2 := mustOpen(t, Options{Dir: dir, Logger: testLoggerTo(t, &logs)})
	defer c2.Close()
	if !strings.Contains(logs.String(), "entries=10") || !strings.Contains(logs.String(), "suspicious=0") {
		t.Fatalf("reopen log: %s", logs.String())
	}
	os.Truncate(c2.BlobPath(BlobKey{Layout: "L", Path: key(2)}), 10)
	fills := 0
	for i := range 10 {
		p := key(i)
		data := content(p, sizeOf(p))
		h, _, err := c2.GetBlob(context.Background(), BlobKey{Layout: "L", Path: p}, int64(len(data)), func(ctx context.Context, f Writer) error {
			fills++
			return writeFill(data)(ctx, f)
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(readAll(t, h), data) {
			t.Fatalf("%s: wrong contents", p)
		}
		h.Close()
	}
	if fills != 1 {
		t.Fatalf("%d fills after restart, want 1 (the truncated blob)", fills)
	}
}

// A journal that is missing or unreadable vouches for nothing: the cache
// starts empty rather than serve files it cannot check.
func TestLostJournalEmptiesCache(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	getBlob(t, c, key(1))
	c.Close()
	os.WriteFile(filepath.Join(dir, journalRel), []byte("garbage\n"), 0o644)
	c2 := mustOpen(t, Options{Dir: dir})
	defer c2.Close()
	if c2.HasBlob(BlobKey{Layout: "L", Path: key(1)}) {
		t.Fatal("blob kept without a journal")
	}
	if d, f := diskUsage(t, dir); d != 0 || f != 0 {
		t.Fatalf("%d bytes in %d files left", d, f)
	}
}

func TestJournalRecordRoundTrip(t *testing.T) {
	recs := []record{
		{op: opAdd, writer: "0123456789abcdef", size: 1 << 40, sum: checksum{v: 0xfedcba9876543210}, key: "blobs/L/t/0042.npy"},
		{op: opAdd, writer: "w", size: 0, key: "blobs/L/with space/and \"quotes\"\n.npy"},
		{op: opAdd, writer: "w", size: 7, sum: checksum{v: 0x0123456789abcdef, tree: true}, ident: "s7", key: "blobs/L/t/0007.npy"},
		{op: opDel, writer: "w", key: "chunks/ab/abcdef"},
		{op: opMarker},
		{op: opQuit, writer: "w"},
	}
	var buf []byte
	for _, r := range recs {
		buf = appendRecord(buf, r)
	}
	var got []record
	n, bad := scanRecords(buf, map[string]string{}, func(r record) { got = append(got, r) })
	if n != len(buf) || bad != 0 || len(got) != len(recs) {
		t.Fatalf("consumed %d/%d, bad %d, %d records", n, len(buf), bad, len(got))
	}
	for i := range recs {
		if got[i] != recs[i] {
			t.Errorf("record %d: %+v, want %+v", i, got[i], recs[i])
		}
	}
	// Every single-byte corruption is rejected or leaves the line incomplete.
	line := appendRecord(nil, recs[0])
	for i := range len(line) - 1 {
		b := bytes.Clone(line)
		b[i] ^= 0x01
		scanRecords(b, map[string]string{}, func(r record) {
			if r != recs[0] {
				t.Errorf("flip at %d accepted as %+v", i, r)
			}
		})
	}
}

func FuzzParseRecord(f *testing.F) {
	f.Add(appendRecord(nil, record{op: opAdd, writer: "w", size: 5, sum: checksum{v: 9}, key: "blobs/L/a.npy"}))
	f.Add(appendRecord(nil, record{op: opMarker}))
	f.Add([]byte("A w 1 2 \"blobs/x\" 0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		scanRecords(b, map[string]string{}, func(r record) {
			if r.op == opAdd || r.op == opDel {
				if checkRel(r.key) != nil {
					t.Fatalf("accepted key %q", r.key)
				}
			}
		})
	})
}

func testLoggerTo(t testing.TB, sb *strings.Builder) *slogLogger {
	return newTeeLogger(t, sb)
}

// Under churn a lone instance keeps rewriting the journal, so it stays
// proportional to what is cached; the index it leaves is exact.
func TestJournalCompactsUnderChurn(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir, Size: 32 << 10, noSync: true, compactMin: 4 << 10})
	for i := range 400 {
		getBlob(t, c, key(i))
	}
	fi, err := os.Stat(filepath.Join(dir, journalRel))
	if err != nil {
		t.Fatal(err)
	}
	_, files := c.Usage()
	if limit := int64(files)*120*2*2 + 2*(4<<10) + 4096; fi.Size() > limit {
		t.Fatalf("journal %d bytes for %d entries after 400 fills (limit %d)", fi.Size(), files, limit)
	}
	c.Close()
	checkCacheL(t, dir)
}

// A file at a blob's path that the index does not know (its record was
// lost) is used if it is intact and replaced if it is not.
func TestUnindexedFileAtBlobPath(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	for _, tc := range []struct {
		name    string
		damaged bool
	}{{"intact.npy", false}, {"damaged.npy", true}} {
		k := BlobKey{Layout: "L", Path: tc.name}
		data := content(tc.name, 3000)
		stale := bytes.Clone(data)
		if tc.damaged {
			stale[10] ^= 1
		}
		os.MkdirAll(filepath.Dir(c.BlobPath(k)), 0o755)
		os.WriteFile(c.BlobPath(k), stale, 0o644)
		h, _, err := c.GetBlob(context.Background(), k, 3000, writeFill(data), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(readAll(t, h), data) {
			t.Fatalf("%s: handle reads wrong bytes", tc.name)
		}
		h.Close()
		if got, _ := os.ReadFile(c.BlobPath(k)); !bytes.Equal(got, data) {
			t.Fatalf("%s: file at path has wrong bytes", tc.name)
		}
	}
}

// Blobs are published without an fsync each; the filesystem is synced
// before anything makes them trusted: a compaction, and the quit record of
// an instance that closes while another runs.
func TestSyncBeforeTrust(t *testing.T) {
	dir := t.TempDir()
	var syncs atomic.Int32
	c := mustOpen(t, Options{Dir: dir, onSync: func() { syncs.Add(1) }, compactMin: 1 << 40})
	other := mustOpen(t, Options{Dir: dir})
	syncs.Store(0) // the first Open compacted the journal
	for i := range 3 {
		getBlob(t, c, key(i))
	}
	if n := syncs.Load(); n != 0 {
		t.Fatalf("%d syncs while filling: the fill path must not sync", n)
	}
	c.Close() // not alone: appends its quit record
	if n := syncs.Load(); n != 1 {
		t.Fatalf("%d syncs at a shared Close, want 1 before the quit record", n)
	}
	other.Close()

	c = mustOpen(t, Options{Dir: dir, onSync: func() { syncs.Add(1) }, compactMin: 1 << 40})
	getBlob(t, c, key(9))
	syncs.Store(0)
	c.mu.Lock()
	err := c.compact()
	c.mu.Unlock()
	if err != nil || syncs.Load() != 1 {
		t.Fatalf("compact: %v, %d syncs, want 1", err, syncs.Load())
	}
	c.Close()
}

// Summarize reads what the journal says without opening the cache, and
// counts the instances running.
func TestSummarize(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	getBlob(t, c, key(0))
	getBlob(t, c, key(1))
	if _, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "M", Path: "x.npy"}, 10, writeFill(make([]byte, 10)), nil); err != nil {
		t.Fatal(err)
	}
	c.ChunkTier().Put("chunk", []byte("12345"))
	s, err := Summarize(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(sizeOf(key(0)) + sizeOf(key(1)) + 10)
	if s.Blobs != 3 || s.BlobBytes != want || s.Chunks != 1 || s.ChunkBytes != 5 || len(s.Layouts) != 2 ||
		s.Layouts[0] != (LayoutSummary{"L", 2, want - 10}) || s.Running != 1 {
		t.Errorf("summary %+v", s)
	}
	c.Close()
	if s, err := Summarize(dir); err != nil || s.Running != 0 || s.Blobs != 3 {
		t.Errorf("after Close: %+v, %v", s, err)
	}
	if _, err := Summarize(filepath.Join(dir, "nope")); err == nil {
		t.Error("a missing directory summarized")
	}
}
