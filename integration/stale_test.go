package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// restoreMtime sets p's modification time back to mtime, as touch -d, cp -p,
// tar x or rsync -t leave a file they rewrote.
func restoreMtime(t testing.TB, p string, mtime time.Time) {
	t.Helper()
	if err := os.Chtimes(p, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// A chunk rewritten in place with other bytes of the same length, its
// modification time then restored, is a rewrite: a mount serves the new
// bytes after --metadata-ttl, and so does a new mount on the same cache
// after another such rewrite, never the old sample. Size, modification
// time and inode are all unchanged; only the change time tells.
func TestRewriteWithMtimeRestored(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	src := filepath.Join(t.TempDir(), "grow.zarr")
	growStore(t, "create", src, 8)
	chunk := filepath.Join(src, "raw", "c", "0", "0", "0")
	st, err := os.Stat(chunk)
	if err != nil {
		t.Fatal(err)
	}
	mtime := st.ModTime()
	cacheDir := t.TempDir()
	d := mountAt(t, src, t.TempDir(), cacheDir, "--metadata-ttl", "1s")
	file := filepath.Join(d.mnt, "raw", "5.npy")
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	rewriteSample(t, src, 5, 0.25)
	restoreMtime(t, chunk, mtime)
	if now, _ := os.Stat(chunk); now.Size() != st.Size() || !now.ModTime().Equal(mtime) {
		t.Fatalf("the rewrite changed the size or the modification time: the test proves nothing")
	}
	// The next refresh starts within the TTL; two leave room for a loaded
	// machine.
	time.Sleep(2 * time.Second)
	after, err := os.ReadFile(file)
	if err != nil || bytes.Equal(after, before) {
		t.Fatalf("raw/5.npy two TTLs after a same-size rewrite with its mtime restored: %v, old bytes served %v", err, bytes.Equal(after, before))
	}
	if n := checkGrowMount(t, d.mnt, src); n != 3*8+1 {
		t.Errorf("checked %d files after the rewrite", n)
	}
	d.stop(t)

	// Again with the mount down: a new mount on the same cache reads anew.
	rewriteSample(t, src, 5, 0.25)
	restoreMtime(t, chunk, mtime)
	d = mountAt(t, src, t.TempDir(), cacheDir)
	again, err := os.ReadFile(filepath.Join(d.mnt, "raw", "5.npy"))
	if err != nil || bytes.Equal(again, after) {
		t.Fatalf("raw/5.npy after a remount on the same cache: %v, old bytes served %v", err, bytes.Equal(again, after))
	}
	if n := checkGrowMount(t, d.mnt, src); n != 3*8+1 {
		t.Errorf("checked %d files after the remount", n)
	}
}
