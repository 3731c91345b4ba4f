package cache

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// withUmask runs the test under umask m: the cache's modes must not depend
// on it. The umask is per process, and no test in this package runs in
// parallel.
func withUmask(t *testing.T, m int) {
	old := syscall.Umask(m)
	t.Cleanup(func() { syscall.Umask(old) })
}

// fillSome puts two blobs (one nested) and a chunk into c.
func fillSome(t *testing.T, c *Cache) {
	t.Helper()
	ctx := context.Background()
	for _, p := range []string{"t/0.npy", "sub/sp/1.npy"} {
		data := content(p, 3000)
		h, _, err := c.GetBlob(ctx, BlobKey{Layout: "lay", Path: p}, int64(len(data)), writeFill(data), nil)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	}
	if _, err := c.GetChunk(ctx, "s3://b/k", func(context.Context) ([]byte, error) { return content("k", 500), nil }); err != nil {
		t.Fatal(err)
	}
}

// modes lists every entry of a cache directory, relative to it ("." for
// the directory itself), with its permission bits and group.
func modes(t *testing.T, dir string) map[string][2]int {
	t.Helper()
	out := map[string][2]int{}
	err := filepath.Walk(dir, func(p string, fi fs.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = [2]int{int(fi.Mode().Perm()), groupOf(fi)}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkModes checks every entry against the modes a cache with access a
// gives: blobs and their directories as a says, everything else private.
func checkModes(t *testing.T, dir string, a access) {
	t.Helper()
	ms := modes(t, dir)
	var blobs, chunks int
	for rel, m := range ms {
		fi, _ := os.Lstat(filepath.Join(dir, rel))
		want, blob := a.modeOf(rel, fi.IsDir())
		if rel == "." {
			want, blob = a.root, true
		}
		if m[0] != int(want) {
			t.Errorf("%s: mode %04o, want %04o", rel, m[0], want)
		}
		if blob && a.gid >= 0 && m[1] != a.gid {
			t.Errorf("%s: group %d, want %d", rel, m[1], a.gid)
		}
		if strings.HasSuffix(rel, ".npy") {
			blobs++
		}
		if strings.HasPrefix(rel, "chunks/") && !fi.IsDir() {
			chunks++
		}
	}
	if blobs == 0 || chunks == 0 {
		t.Fatalf("checked %d blobs and %d chunks: %v", blobs, chunks, ms)
	}
}

func TestModesOwnerOnlyByDefault(t *testing.T) {
	withUmask(t, 0)
	dir := filepath.Join(t.TempDir(), "cache")
	c := mustOpen(t, Options{Dir: dir})
	fillSome(t, c)
	a, _ := newAccess(0, nil)
	checkModes(t, dir, a) // while open: the lock, temp dirs
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	checkModes(t, dir, a) // the compacted journal
	for rel, m := range modes(t, dir) {
		if m[0]&0o077 != 0 {
			t.Errorf("%s: mode %04o is not owner-only", rel, m[0])
		}
	}
}

// A umask that takes the owner's own bits still leaves a usable cache.
func TestModesStrictUmask(t *testing.T) {
	withUmask(t, 0o277)
	dir := filepath.Join(t.TempDir(), "cache")
	c := mustOpen(t, Options{Dir: dir, BlobMode: 0o644})
	fillSome(t, c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	a, _ := newAccess(0o644, nil)
	c = mustOpen(t, Options{Dir: dir, BlobMode: 0o644})
	fillSome(t, c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for rel, m := range modes(t, dir) {
		if strings.HasPrefix(rel, "blobs") && m[0] != int(a.blobFile) && m[0] != int(a.blobDir) {
			t.Errorf("%s: mode %04o", rel, m[0])
		}
	}
}

func TestModesShared(t *testing.T) {
	withUmask(t, 0o077) // the strictest usual umask must not narrow what is asked
	gid := uint32(os.Getegid())
	if os.Geteuid() == 0 {
		gid = 4242 // root may give any group
	} else if gs, _ := os.Getgroups(); len(gs) > 1 {
		gid = uint32(gs[len(gs)-1])
	}
	for _, tc := range []struct {
		name  string
		mode  fs.FileMode
		group *uint32
		root  fs.FileMode
		dir   fs.FileMode
	}{
		{"group", 0o440, nil, 0o710, 0o750},
		{"all", 0o444, nil, 0o711, 0o755},
		{"cache-group", 0, &gid, 0o710, 0o750},
		{"all with group", 0o444, &gid, 0o711, 0o755},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cache")
			c := mustOpen(t, Options{Dir: dir, BlobMode: tc.mode, BlobGroup: tc.group})
			fillSome(t, c)
			a := c.acc
			if a.root != tc.root || a.blobDir != tc.dir {
				t.Fatalf("root %04o, blob dirs %04o; want %04o, %04o", a.root, a.blobDir, tc.root, tc.dir)
			}
			if mode, g := c.BlobAccess(); (tc.mode != 0 && mode != tc.mode) || (tc.group != nil && g != int(gid)) {
				t.Fatalf("BlobAccess = %04o, %d", mode, g)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			checkModes(t, dir, a)
			// Never the chunk tier, the journal or the lock.
			for rel, m := range modes(t, dir) {
				if !strings.HasPrefix(rel, "blobs") && rel != "." && m[0]&0o077 != 0 {
					t.Errorf("%s: mode %04o is not owner-only", rel, m[0])
				}
			}
		})
	}
}

// recordLogs collects log records' messages.
type recordLogs struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recordLogs) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordLogs) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec.Level >= slog.LevelInfo {
		r.msgs = append(r.msgs, rec.Message)
	}
	return nil
}
func (r *recordLogs) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recordLogs) WithGroup(string) slog.Handler      { return r }

func (r *recordLogs) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// A cache left wide open (an older zarrfs under umask 022, or chmod -R) is
// tightened at the next Open, with one line; the Open after that walks
// nothing and says nothing.
func TestTightenAtOpen(t *testing.T) {
	// A new cache in a directory made beforehand (mkdir, 0755) is made
	// owner-only without a word.
	dir := filepath.Join(t.TempDir(), "cache")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &recordLogs{}
	c := mustOpen(t, Options{Dir: dir, Logger: slog.New(logs)})
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 || len(logs.msgs) != 0 {
		t.Fatalf("new cache in a 0755 directory: %v %v, logged %q", st.Mode(), err, logs.msgs)
	}
	fillSome(t, c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(dir, func(p string, fi fs.FileInfo, err error) error {
		if fi.IsDir() {
			os.Chmod(p, 0o755)
		} else {
			os.Chmod(p, 0o644)
		}
		return nil
	})
	os.WriteFile(filepath.Join(dir, "journal.new"), []byte("x"), 0o666) // a leftover
	os.Chmod(filepath.Join(dir, "journal.new"), 0o666)

	logs = &recordLogs{}
	c = mustOpen(t, Options{Dir: dir, Logger: slog.New(logs)})
	if n := logs.count("cache permissions tightened"); n != 1 {
		t.Errorf("%d lines saying the permissions were tightened, want 1: %q", n, logs.msgs)
	}
	a, _ := newAccess(0, nil)
	checkModes(t, dir, a)
	fillSome(t, c)
	c.Close()

	logs = &recordLogs{}
	c = mustOpen(t, Options{Dir: dir, Logger: slog.New(logs)})
	c.Close()
	if len(logs.msgs) != 0 {
		t.Errorf("second Open logged %q", logs.msgs)
	}
}

// A blob and its directory widened by hand while the tree's own mark
// (the mode of Dir/blobs) stayed as it was are set back after the next
// Open, in the background: the start does not wait for a walk of every
// blob, and the blob is not left readable by others.
func TestTightenWidenedBlob(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	c := mustOpen(t, Options{Dir: dir})
	fillSome(t, c)
	c.Close()
	blob := filepath.Join(dir, blobsDir, "lay", "sub", "sp", "1.npy")
	os.Chmod(blob, 0o644)
	os.Chmod(filepath.Dir(blob), 0o755)
	logs := &recordLogs{}
	c = mustOpen(t, Options{Dir: dir, Logger: slog.New(logs)})
	defer c.Close()
	a, _ := newAccess(0, nil)
	ok := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		f, errf := os.Stat(blob)
		d, errd := os.Stat(filepath.Dir(blob))
		if errf == nil && errd == nil && f.Mode().Perm() == a.blobFile && d.Mode().Perm() == a.blobDir {
			ok = true
			break
		}
	}
	if !ok {
		t.Fatal("a blob widened by hand was not tightened after Open")
	}
	c.Close()
	checkModes(t, dir, a)
	if n := logs.count("cache permissions changed since the last start set back"); n != 1 {
		t.Errorf("%d lines saying permissions were set back, want 1: %q", n, logs.msgs)
	}
}

// Changing BlobMode between runs changes the files already there: a
// narrower mode takes access away from existing blobs too.
func TestBlobModeChangesExisting(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	for i, mode := range []fs.FileMode{0o444, 0o400, 0o440, 0o444} {
		logs := &recordLogs{}
		c := mustOpen(t, Options{Dir: dir, BlobMode: mode, Logger: slog.New(logs)})
		if i > 0 { // the blobs of the run before now have this run's mode
			checkModes(t, dir, c.acc)
		}
		if i == 1 && logs.count("cache permissions tightened") != 1 {
			t.Errorf("0444 -> 0400: logged %q", logs.msgs)
		}
		if i == 3 && logs.count("cache blobs readable beyond their owner") != 1 {
			t.Errorf("0440 -> 0444: logged %q", logs.msgs)
		}
		fillSome(t, c)
		c.Close()
		checkModes(t, dir, c.acc)
	}
}

// An instance that joins a running one must give blobs the same modes.
func TestJoinWithOtherBlobMode(t *testing.T) {
	dir := t.TempDir()
	c1 := mustOpen(t, Options{Dir: dir, BlobMode: 0o444})
	defer c1.Close()
	for _, mode := range []fs.FileMode{0, 0o400, 0o440} {
		c2, err := Open(Options{Dir: dir, BlobMode: mode})
		if !errors.Is(err, ErrAccessInUse) {
			if c2 != nil {
				c2.Close()
			}
			t.Fatalf("join with mode %04o: %v, want ErrAccessInUse", mode, err)
		}
		if !strings.Contains(err.Error(), "0444") {
			t.Errorf("error does not name the mode in force: %v", err)
		}
	}
	c2 := mustOpen(t, Options{Dir: dir, BlobMode: 0o444})
	fillSome(t, c2)
	c2.Close()
	checkModes(t, dir, c1.acc)
}

// A cache directory, or a file in it, owned by another user is refused,
// root's included, naming the owner.
func TestOtherOwnerRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another uid")
	}
	for _, name := range []string{".", "journal", "lock", "blobs"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cache")
			c := mustOpen(t, Options{Dir: dir})
			fillSome(t, c)
			c.Close()
			p := filepath.Join(dir, name)
			if err := os.Lchown(p, 4243, 4243); err != nil {
				t.Fatal(err)
			}
			c, err := Open(Options{Dir: dir})
			if err == nil {
				c.Close()
				t.Fatal("Open succeeded on a cache of another uid")
			}
			var oe *OwnerError
			if !errors.As(err, &oe) || oe.Owner != 4243 || oe.Path != filepath.Clean(p) {
				t.Fatalf("err = %v, want an OwnerError for %s", err, p)
			}
			if msg := err.Error(); !strings.Contains(msg, "uid 4243") || !strings.HasPrefix(msg, "cache "+dir) || strings.Contains(msg, "\n") {
				t.Errorf("message %q", msg)
			}
			t.Log(err)
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want fs.FileMode
		bad  bool
	}{
		{"owner", 0o400, false},
		{"group", 0o440, false},
		{"all", 0o444, false},
		{"0640", 0o440, false},
		{"644", 0o444, false},
		{"0604", 0o404, false},
		{"0600", 0o400, false},
		{"0400", 0o400, false},
		{"0444", 0o444, false},
		{"0666", 0, true},
		{"0755", 0, true},
		{"0040", 0, true},
		{"0660", 0, true},
		{"1644", 0, true},
		{"rw-r--r--", 0, true},
		{"", 0, true},
		{"9", 0, true},
	} {
		got, err := ParseMode(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseMode(%q) = %04o, %v", tc.in, got, err)
		}
	}
}

func TestBadBlobAccessRefused(t *testing.T) {
	dir := t.TempDir()
	g := uint32(os.Getegid())
	for _, o := range []Options{
		{Dir: dir, BlobMode: 0o666},
		{Dir: dir, BlobMode: 0o700},
		{Dir: dir, BlobMode: 0o644 | fs.ModeSetuid},
		{Dir: dir, BlobMode: 0o604, BlobGroup: &g},
	} {
		if c, err := Open(o); err == nil {
			c.Close()
			t.Errorf("Open with mode %v group %v succeeded", o.BlobMode, o.BlobGroup)
		}
	}
}

// A group mode without a group gives blobs the cache directory's group,
// so an instance that names the group and one that does not agree.
func TestGroupModeTakesDirGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the directory any group")
	}
	dir := filepath.Join(t.TempDir(), "cache")
	gid := uint32(4244)
	c1 := mustOpen(t, Options{Dir: dir, BlobGroup: &gid})
	defer c1.Close()
	c2 := mustOpen(t, Options{Dir: dir, BlobMode: 0o640}) // joins: same mode, the directory's group
	fillSome(t, c2)
	if _, g := c2.BlobAccess(); g != int(gid) {
		t.Fatalf("group %d, want the directory's %d", g, gid)
	}
	c2.Close()
	checkModes(t, dir, c1.acc)
	other := uint32(4245)
	if c3, err := Open(Options{Dir: dir, BlobGroup: &other}); !errors.Is(err, ErrAccessInUse) {
		if c3 != nil {
			c3.Close()
		}
		t.Fatalf("joining with another group: %v, want ErrAccessInUse", err)
	}
}
