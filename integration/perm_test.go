package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/integration/miniotest"
	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// The cache's permissions, seen by a second, unprivileged user created for
// the test: a default cache shows it nothing; --cache-group and
// --cache-mode open the decoded blobs, never the compressed chunks; a
// cache of another user is refused; zarrfs path of another user's mount
// names the owner; direct mode with --cache-mode lets the user read
// through the links.

// testUser is an unprivileged user (with its own group) and a second group
// it belongs to, created with useradd for one test and removed after it.
type testUser struct {
	name     string
	uid, gid uint32 // the user and its own group
	group    string // the extra group
	groupID  uint32
	bin      string // a copy of zarrfs the user may run
}

// requireUseradd skips the test, or fails it under CI, when it cannot
// create users.
func requireUseradd(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root: creating a test user needs root"
	}
	for _, tool := range []string{"useradd", "userdel", "groupadd", "groupdel"} {
		if _, err := lookSbin(tool); err != nil && why == "" {
			why = tool + " not found"
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

func lookSbin(tool string) (string, error) {
	if p, err := exec.LookPath(tool); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(d, tool); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found", tool)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// sbin runs an account tool, retrying while another process holds the
// account files' lock.
func sbin(t *testing.T, tool string, args ...string) error {
	t.Helper()
	p, err := lookSbin(tool)
	if err != nil {
		return err
	}
	var out []byte
	for attempt := 0; attempt < 20; attempt++ {
		out, err = exec.Command(p, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "lock") {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("%s %v: %v: %s", tool, args, err, out)
	}
	return nil
}

// newTestUser creates the user and its extra group, and a copy of the
// binary under base (which it must be able to reach).
func newTestUser(t *testing.T, base string) *testUser {
	t.Helper()
	requireUseradd(t)
	var b [4]byte
	rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	u := &testUser{name: "zfsu" + suffix, group: "zfsg" + suffix}
	if err := sbin(t, "groupadd", u.group); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sbin(t, "groupdel", u.group); err != nil {
			t.Error(err)
		}
	})
	if err := sbin(t, "useradd", "-M", "-U", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", "-G", u.group, u.name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sbin(t, "userdel", u.name); err != nil {
			t.Error(err)
		}
	})
	pu, err := user.Lookup(u.name)
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroup(u.group)
	if err != nil {
		t.Fatal(err)
	}
	u.uid, u.gid, u.groupID = atou(t, pu.Uid), atou(t, pu.Gid), atou(t, g.Gid)

	u.bin = filepath.Join(base, "zarrfs")
	src, err := os.ReadFile(zarrfsBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(u.bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return u
}

func atou(t *testing.T, s string) uint32 {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(n)
}

// command runs name as the user, with the given supplementary groups only.
func (u *testUser) command(groups []uint32, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: groups}}
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent", "LANG=C"}
	cmd.Dir = "/"
	return cmd
}

// inGroup and noGroup are the supplementary groups of the user with and
// without the extra group.
func (u *testUser) inGroup() []uint32 { return []uint32{u.groupID} }
func (u *testUser) noGroup() []uint32 { return []uint32{} }

// read reads file as the user: its bytes, or the error cat gave.
func (u *testUser) read(groups []uint32, file string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := u.command(groups, "cat", file)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// mustRead checks that the user reads file and gets what root reads there.
func (u *testUser) mustRead(t *testing.T, groups []uint32, file string) {
	t.Helper()
	got, err := u.read(groups, file)
	if err != nil {
		t.Fatalf("%s (groups %v) cannot read %s: %v", u.name, groups, file, err)
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s read %d bytes of %s, root %d, not the same", u.name, len(got), file, len(want))
	}
}

// mustNotRead checks that the user is refused file.
func (u *testUser) mustNotRead(t *testing.T, groups []uint32, file string) {
	t.Helper()
	if _, err := u.read(groups, file); err == nil {
		t.Fatalf("%s (groups %v) read %s", u.name, groups, file)
	} else if !strings.Contains(err.Error(), "Permission denied") {
		t.Fatalf("%s reading %s: %v, want Permission denied", u.name, file, err)
	}
}

// reachableDir is a fresh directory that every user can search, like a
// scratch volume: t.TempDir makes its directories owner-only.
func reachableDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, p := range []string{d, filepath.Dir(d)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// cacheFiles walks a cache directory and checks every entry's mode: blob
// files blob, directories under blobs/ blobDir, the cache directory root,
// everything else owner-only; with gid >= 0, the group of the blob tree
// and the root. It returns some blob and chunk files (empty when none).
func checkCacheModes(t *testing.T, dir string, blob, blobDir, root fs.FileMode, gid int) (blobs, chunks []string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		want, inBlobs := fs.FileMode(0o600), false
		switch {
		case rel == ".":
			want, inBlobs = root, true
		case rel == "blobs" || strings.HasPrefix(rel, "blobs/"):
			want, inBlobs = blob, true
			if d.IsDir() {
				want = blobDir
			}
		case d.IsDir():
			want = 0o700
		case strings.HasPrefix(rel, "chunks/"):
			// Compressed chunks are read-only to their owner, as blobs
			// are, and never opened to a group or to all.
			want = 0o400
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("cache %s: mode %04o, want %04o", rel, got, want)
		}
		if inBlobs && gid >= 0 {
			if g := int(fi.Sys().(*syscall.Stat_t).Gid); g != gid {
				t.Errorf("cache %s: group %d, want %d", rel, g, gid)
			}
		}
		if !d.IsDir() && strings.HasPrefix(rel, "blobs/") {
			blobs = append(blobs, p)
		}
		if !d.IsDir() && strings.HasPrefix(rel, "chunks/") {
			chunks = append(chunks, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return blobs, chunks
}

var permExample = zarrtest.Example{Times: 4, Levels: 2, Lat: 9, Lon: 12, TimeChunk: 2}

// TestCachePermissions: what warm and a plain mount leave in the cache,
// with and without the flags, and what the other user can read of it.
func TestCachePermissions(t *testing.T) {
	requireMountTools(t)
	base := reachableDir(t)
	u := newTestUser(t, base)
	src := filepath.Join(base, "era5.zarr")
	if err := permExample.Write(src); err != nil {
		t.Fatal(err)
	}
	owner := func(t *testing.T, blobs []string) {
		t.Helper()
		if len(blobs) == 0 {
			t.Fatal("no blob in the cache")
		}
		for _, g := range [][]uint32{u.noGroup(), u.inGroup()} {
			u.mustNotRead(t, g, blobs[0])
		}
	}

	t.Run("default", func(t *testing.T) {
		cacheDir := filepath.Join(base, "default")
		warm(t, src, cacheDir, "--only", "t")
		blobs, _ := checkCacheModes(t, cacheDir, 0o400, 0o700, 0o700, -1)
		owner(t, blobs)
		// A mount on the same cache fills the rest the same way.
		d := mountAt(t, src, t.TempDir(), cacheDir)
		readTree(t, d.mnt)
		blobs, _ = checkCacheModes(t, cacheDir, 0o400, 0o700, 0o700, -1)
		owner(t, blobs)
		d.stop(t)
	})

	t.Run("cache-group", func(t *testing.T) {
		cacheDir := filepath.Join(base, "group")
		warm(t, src, cacheDir, "--only", "t", "--cache-group", u.group)
		blobs, _ := checkCacheModes(t, cacheDir, 0o440, 0o750, 0o710, int(u.groupID))
		u.mustRead(t, u.inGroup(), blobs[0])
		u.mustNotRead(t, u.noGroup(), blobs[0])
		d := mountAt(t, src, t.TempDir(), cacheDir, "--cache-group", u.group)
		readTree(t, d.mnt)
		blobs, _ = checkCacheModes(t, cacheDir, 0o440, 0o750, 0o710, int(u.groupID))
		for _, b := range blobs {
			u.mustRead(t, u.inGroup(), b)
		}
		u.mustNotRead(t, u.noGroup(), blobs[len(blobs)-1])
		d.stop(t)
	})

	t.Run("cache-mode all", func(t *testing.T) {
		cacheDir := filepath.Join(base, "all")
		warm(t, src, cacheDir, "--cache-mode", "all")
		blobs, _ := checkCacheModes(t, cacheDir, 0o444, 0o755, 0o711, -1)
		u.mustRead(t, u.noGroup(), blobs[0])
		// The journal and lock stay the owner's.
		u.mustNotRead(t, u.noGroup(), filepath.Join(cacheDir, "journal"))
		u.mustNotRead(t, u.noGroup(), filepath.Join(cacheDir, "lock"))
		// Back to the default: the blobs already there are closed again.
		warm(t, src, cacheDir)
		blobs, _ = checkCacheModes(t, cacheDir, 0o400, 0o700, 0o700, -1)
		owner(t, blobs)
	})

	t.Run("widened by hand", func(t *testing.T) {
		cacheDir := filepath.Join(base, "chmod")
		warm(t, src, cacheDir, "--only", "t")
		if out, err := exec.Command("chmod", "-R", "a+rX", cacheDir).CombinedOutput(); err != nil {
			t.Fatalf("chmod: %v %s", err, out)
		}
		cmd := exec.Command(zarrfsBin(t), "warm", src, "--cache", cacheDir, "--only", "t")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if out, err := cmd.Output(); err != nil {
			t.Fatalf("warm: %v %s %s", err, out, stderr.String())
		}
		if n := strings.Count(stderr.String(), "cache permissions tightened"); n != 1 {
			t.Errorf("warm said %d times that it tightened the cache:\n%s", n, stderr.String())
		}
		blobs, _ := checkCacheModes(t, cacheDir, 0o400, 0o700, 0o700, -1)
		owner(t, blobs)
	})
}

// eventually polls cond for a few seconds: the daemon's stderr is copied
// into the test a little after the line that says it is mounted.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// readTree reads every .npy file of a mount.
func readTree(t *testing.T, mnt string) {
	t.Helper()
	n := 0
	for _, f := range npyFiles(t, mnt) {
		if _, err := os.ReadFile(filepath.Join(mnt, f)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("the mount has no .npy file")
	}
}

// The compressed chunks of an S3 source are the owner's whatever the flags:
// the other user reads neither blobs nor chunks of a default cache, and
// with --cache-group or --cache-mode all only the blobs.
func TestCachePermissionsS3(t *testing.T) {
	requireMountTools(t)
	base := reachableDir(t)
	u := newTestUser(t, base)
	local := filepath.Join(t.TempDir(), "era5.zarr")
	if err := permExample.Write(local); err != nil {
		t.Fatal(err)
	}
	srv := miniotest.Start(t)
	bucket := srv.NewBucket(t)
	srv.UploadDir(t, bucket, "era5.zarr", local)
	s3Env(t, srv)
	src := "s3://" + bucket + "/era5.zarr"

	for _, tc := range []struct {
		name                string
		flags               []string
		blob, blobDir, root fs.FileMode
		gid                 int
		readers             [][]uint32 // groups that may read blobs
	}{
		{"default", nil, 0o400, 0o700, 0o700, -1, nil},
		{"cache-group", []string{"--cache-group", u.group}, 0o440, 0o750, 0o710, int(u.groupID), [][]uint32{u.inGroup()}},
		{"cache-mode all", []string{"--cache-mode", "all"}, 0o444, 0o755, 0o711, -1, [][]uint32{u.noGroup(), u.inGroup()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cacheDir := filepath.Join(base, strings.ReplaceAll(tc.name, " ", "-"))
			d := mountAt(t, src, t.TempDir(), cacheDir, append([]string{"--s3-endpoint", srv.Endpoint}, tc.flags...)...)
			readTree(t, d.mnt)
			blobs, chunks := checkCacheModes(t, cacheDir, tc.blob, tc.blobDir, tc.root, tc.gid)
			if len(blobs) == 0 || len(chunks) == 0 {
				t.Fatalf("%d blobs and %d chunks in the cache", len(blobs), len(chunks))
			}
			for _, g := range [][]uint32{u.noGroup(), u.inGroup()} {
				u.mustNotRead(t, g, chunks[0])
				if out, err := u.command(g, "ls", filepath.Join(cacheDir, "chunks")).CombinedOutput(); err == nil {
					t.Errorf("the user lists the chunk tier: %s", out)
				}
			}
			for _, g := range tc.readers {
				u.mustRead(t, g, blobs[0])
			}
			if tc.readers == nil {
				u.mustNotRead(t, u.noGroup(), blobs[0])
				u.mustNotRead(t, u.inGroup(), blobs[0])
			}
			d.stop(t)
		})
	}
}

// A second user pointed at a cache directory is refused with one line
// naming its owner, both ways round: the user on root's cache, root on the
// user's. Nothing in the cache changes.
func TestCacheOfAnotherUserRefused(t *testing.T) {
	requireMountTools(t)
	base := reachableDir(t)
	u := newTestUser(t, base)
	src := filepath.Join(base, "era5.zarr")
	if err := permExample.Write(src); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}

	refused := func(t *testing.T, cmd *exec.Cmd, owner string) {
		t.Helper()
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("%v: still running after 60s (not refused)\n%s", cmd.Args, stderr.String())
		}
		msg := strings.TrimSpace(stderr.String())
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("%v: %v, want exit status 1\n%s", cmd.Args, err, msg)
		}
		if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "belongs to "+owner) {
			t.Errorf("%v: error %q, want one line naming %s", cmd.Args[1:3], msg, owner)
		}
		t.Log(msg)
	}

	t.Run("user on root's cache", func(t *testing.T) {
		cacheDir := filepath.Join(base, "root-cache")
		warm(t, src, cacheDir, "--cache-mode", "all")
		before := blobFiles(t, cacheDir)
		root := "root (uid 0)"
		refused(t, u.command(u.inGroup(), u.bin, "warm", src, "--cache", cacheDir), root)
		refused(t, u.command(u.inGroup(), u.bin, "mount", src, mnt, "--cache", cacheDir), root)
		if isMounted(mnt) {
			t.Fatal("the refused mount is mounted")
		}
		if after := blobFiles(t, cacheDir); len(after) != len(before) {
			t.Errorf("the cache changed: %d blobs, %d before", len(after), len(before))
		}
		// Root's own mount still uses it.
		d := mountAt(t, src, t.TempDir(), cacheDir, "--cache-mode", "all")
		readTree(t, d.mnt)
		d.stop(t)
	})

	t.Run("root on the user's cache", func(t *testing.T) {
		home := filepath.Join(base, "home")
		if err := os.Mkdir(home, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(home, int(u.uid), int(u.gid)); err != nil {
			t.Fatal(err)
		}
		cacheDir := filepath.Join(home, "cache")
		cmd := u.command(u.noGroup(), u.bin, "warm", src, "--cache", cacheDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("warm as %s: %v\n%s", u.name, err, out)
		}
		st, err := os.Stat(cacheDir)
		if err != nil || st.Mode().Perm() != 0o700 || st.Sys().(*syscall.Stat_t).Uid != u.uid {
			t.Fatalf("the user's cache: %v %v", st, err)
		}
		name := fmt.Sprintf("%s (uid %d)", u.name, u.uid)
		refused(t, exec.Command(zarrfsBin(t), "warm", src, "--cache", cacheDir), name)
		refused(t, exec.Command(zarrfsBin(t), "mount", src, t.TempDir(), "--cache", cacheDir), name)
		// Nothing of root's landed in it.
		filepath.WalkDir(cacheDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if fi, err := d.Info(); err == nil && fi.Sys().(*syscall.Stat_t).Uid != u.uid {
				t.Errorf("%s belongs to uid %d", p, fi.Sys().(*syscall.Stat_t).Uid)
			}
			return nil
		})
	})
}

// The mount registry is owner-only, and zarrfs path of another user's
// mount answers with an error naming the owner, not a path.
func TestPathOfAnotherUsersMount(t *testing.T) {
	requireMountTools(t)
	base := reachableDir(t)
	u := newTestUser(t, base)
	src := filepath.Join(base, "era5.zarr")
	if err := permExample.Write(src); err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", runtime)
	mnt := filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, flags := range [][]string{nil, {"--allow-other", "--cache-mode", "all"}} {
		d := mountAt(t, src, mnt, filepath.Join(base, "cache"+strconv.Itoa(len(flags))), flags...)
		file := filepath.Join(mnt, "t", "0.npy")
		if _, err := os.ReadFile(file); err != nil { // zarrfs path names filled blobs only
			t.Fatal(err)
		}
		out, err := exec.Command(zarrfsBin(t), "path", file).Output()
		if err != nil || !strings.HasPrefix(string(out), d.cache) {
			t.Fatalf("zarrfs path as root: %q %v", out, err)
		}
		reg := filepath.Join(runtime, "zarrfs", "mounts")
		ents, err := os.ReadDir(reg)
		if err != nil || len(ents) != 1 {
			t.Fatalf("registry %s: %v %v", reg, ents, err)
		}
		for p, want := range map[string]fs.FileMode{reg: 0o700, filepath.Dir(reg): 0o700, filepath.Join(reg, ents[0].Name()): 0o600} {
			if st, err := os.Stat(p); err != nil || st.Mode().Perm() != want {
				t.Errorf("%s: %v %v, want mode %04o", p, st.Mode(), err, want)
			}
		}

		cmd := u.command(u.inGroup(), u.bin, "path", file)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		msg := strings.TrimSpace(stderr.String())
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("zarrfs path as %s: %v, want exit status 1: %s", u.name, err, msg)
		}
		if stdout.Len() != 0 || strings.Contains(msg, d.cache) || !strings.Contains(msg, "root (uid 0)") || strings.Count(msg, "\n") != 0 {
			t.Errorf("zarrfs path as %s with %v: stdout %q, stderr %q; want one line naming root and no path", u.name, flags, stdout.String(), msg)
		}
		t.Log(msg)
		d.stop(t)
	}
}

// Direct mode with --allow-other: with --cache-mode all (or --cache-group,
// for the group's members) another user resolves the links and reads the
// cache files they name; with the default cache it is refused, though a
// plain mount serves it through FUSE. A warm on the same cache must give
// the same flags.
func TestDirectModeOtherUser(t *testing.T) {
	requireMountTools(t)
	base := reachableDir(t)
	u := newTestUser(t, base)
	src := filepath.Join(base, "era5.zarr")
	if err := permExample.Write(src); err != nil {
		t.Fatal(err)
	}
	newMnt := func(name string) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("cache-mode all", func(t *testing.T) {
		cacheDir := filepath.Join(base, "all")
		d := mountAt(t, src, newMnt("mall"), cacheDir, "--direct", "--allow-other", "--cache-mode", "all", "--log-level", "debug")
		if !eventually(func() bool { return strings.Contains(d.stderr.String(), "cache_mode=0444") }) {
			t.Errorf("the settings line does not show the cache mode:\n%s", d.stderr)
		}
		files := npyFiles(t, d.mnt)
		for _, f := range files {
			p := filepath.Join(d.mnt, f)
			u.mustRead(t, u.noGroup(), p)
			real, err := u.command(u.noGroup(), "readlink", "-e", p).Output()
			if err != nil || !strings.HasPrefix(string(real), cacheDir+"/blobs/") {
				t.Fatalf("readlink -e %s as %s: %q %v", f, u.name, real, err)
			}
		}
		if _, chunks := checkCacheModes(t, cacheDir, 0o444, 0o755, 0o711, -1); len(chunks) != 0 {
			t.Errorf("a local source put %d chunks in the cache", len(chunks))
		}
		// A write through a link (numpy.save to a mounted path) is refused
		// and changes nothing.
		p := filepath.Join(d.mnt, files[0])
		before, _ := u.read(u.noGroup(), p)
		if out, err := u.command(u.noGroup(), "sh", "-c", "printf x > \"$0\"", p).CombinedOutput(); err == nil {
			t.Errorf("%s wrote through the direct link %s: %s", u.name, files[0], out)
		}
		if after, err := u.read(u.noGroup(), p); err != nil || !bytes.Equal(before, after) || len(after) < 4096 {
			t.Errorf("%s changed after a refused write: %d -> %d bytes, %v", files[0], len(before), len(after), err)
		}

		// A warm joining with other flags is refused; with the same, it runs.
		cmd := exec.Command(zarrfsBin(t), "warm", src, "--cache", cacheDir)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "--cache-mode") {
			t.Errorf("warm with other cache flags beside the mount: %v\n%s", err, out)
		}
		warm(t, src, cacheDir, "--cache-mode", "all")
		d.stop(t)
	})

	t.Run("cache-group", func(t *testing.T) {
		cacheDir := filepath.Join(base, "group")
		d := mountAt(t, src, newMnt("mgroup"), cacheDir, "--direct", "--allow-other", "--cache-group", u.group)
		f := filepath.Join(d.mnt, "t", "0.npy")
		u.mustRead(t, u.inGroup(), f)
		u.mustNotRead(t, u.noGroup(), f)
		checkCacheModes(t, cacheDir, 0o440, 0o750, 0o710, int(u.groupID))
		d.stop(t)
	})

	t.Run("default", func(t *testing.T) {
		cacheDir := filepath.Join(base, "default")
		d := mountAt(t, src, newMnt("mdefault"), cacheDir, "--direct", "--allow-other")
		if !eventually(func() bool { return strings.Contains(d.stderr.String(), "--cache-mode") }) {
			t.Errorf("no warning that other users cannot open the blobs:\n%s", d.stderr)
		}
		f := filepath.Join(d.mnt, "t", "0.npy")
		for _, g := range [][]uint32{u.noGroup(), u.inGroup()} {
			u.mustNotRead(t, g, f)
		}
		checkCacheModes(t, cacheDir, 0o400, 0o700, 0o700, -1)
		d.stop(t)

		// Through FUSE (no --direct) the daemon reads the blobs: the user
		// needs no access to the cache.
		plain := mountAt(t, src, newMnt("mplain"), cacheDir, "--allow-other")
		for _, f := range npyFiles(t, plain.mnt) {
			u.mustRead(t, u.noGroup(), filepath.Join(plain.mnt, f))
		}
		checkCacheModes(t, cacheDir, 0o400, 0o700, 0o700, -1)
		plain.stop(t)
	})
}
