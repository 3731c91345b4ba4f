package cache

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Who may read what.
//
// A cache directory belongs to one user. A mount without --allow-other
// shows its files to that user only, and the chunk tier holds bytes fetched
// with that user's credentials, so everything in the directory is created
// owner-only (directories 0700, files 0600) whatever the umask, and Open
// tightens a directory left wider by an older zarrfs, by hand or by a
// different Options.BlobMode. Open refuses a directory, or any of its own
// files, owned by another uid, root's included: a second user would
// otherwise read the first's data, or leave files the first cannot read,
// evict or lock.
//
// Options.BlobMode and BlobGroup widen read access to the decoded blobs,
// and to the directories leading to them (search on Dir, read and search
// under Dir/blobs), for readers that open the blob files themselves:
// direct mode with --allow-other, GPUDirect Storage readers of a warmed
// copy. The chunk tier, the journal, the lock and temp files stay
// owner-only.
//
// The mode and group of Dir/blobs say what the tree under it has: Open,
// when alone, walks the tree before it returns only when they differ from
// what it wants, and sets them last, so a walk cut short by a kill is done
// again; when they match, it walks the tree after it returns, in the
// background, to set back what was changed by hand since. An Open
// that joins a running instance never changes modes; it refuses to run
// with a setting other than the one in force (ErrAccessInUse), since the
// two would give the blobs different modes.

// ErrAccessInUse is returned by Open when another instance is using the
// directory with other blob permissions (Options.BlobMode, BlobGroup).
var ErrAccessInUse = errors.New("cache in use with other blob permissions")

// OwnerError is returned by Open when the cache directory, or one of its
// own files, belongs to a user other than the caller.
type OwnerError struct {
	Dir   string // the cache directory
	Path  string // the file or directory owned by another: Dir or in it
	Owner int    // its owner's uid
	Self  int    // the caller's effective uid
}

func (e *OwnerError) Error() string {
	what := "cache " + e.Dir
	if e.Path != e.Dir {
		what += ": " + e.Path
	}
	return fmt.Sprintf("%s belongs to %s, not to %s; a cache directory serves one user only",
		what, userName(e.Owner), userName(e.Self))
}

// userName is "name (uid N)", or "uid N" when the name is unknown.
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		return fmt.Sprintf("%s (uid %d)", u.Username, uid)
	}
	return fmt.Sprintf("uid %d", uid)
}

// DefaultBlobMode is the mode of blobs when Options.BlobMode is zero.
//
// Blobs are published read-only, to their owner too: in direct mode a
// sample's path is a link to its blob, which a write through the link
// (numpy.save to a mounted path, say) would otherwise change under every
// later reader. The cache removes and replaces blobs through their
// directories and never writes one once published.
const DefaultBlobMode fs.FileMode = 0o400

// ParseMode parses a blob mode for --cache-mode: "owner" (0400), "group"
// (0440), "all" (0444), or an octal mode such as "0440" or "444". Only
// read bits count: write bits are dropped ("0640" is 0440). Errors do not
// repeat s.
func ParseMode(s string) (fs.FileMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "owner", "private", "user":
		return 0o400, nil
	case "group":
		return 0o440, nil
	case "all", "world", "other", "others":
		return 0o444, nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 8, 32)
	if err != nil {
		return 0, errors.New("want owner, group, all or an octal mode such as 0640")
	}
	// Owner write is dropped (blobs are read-only; 0640 is a habit, not a
	// request), but a refusal names the mode as typed, not what is left.
	if n&^0o644 != 0 {
		return 0, fmt.Errorf("%s gives more than read access (blobs are read-only: at most 0444, or 0644 with the owner's write dropped)", strings.TrimSpace(s))
	}
	m := fs.FileMode(n) &^ 0o200
	if err := checkBlobMode(m); err != nil {
		return 0, fmt.Errorf("%s: the owner needs read", strings.TrimSpace(s))
	}
	return m, nil
}

func checkBlobMode(m fs.FileMode) error {
	if m&^0o444 != 0 {
		return fmt.Errorf("%04o gives more than read access (blobs are read-only: at most 0444)", uint32(m))
	}
	if m&0o400 == 0 {
		return fmt.Errorf("%04o: the owner needs read", uint32(m))
	}
	return nil
}

// access is the permissions the cache gives its files.
type access struct {
	blobFile fs.FileMode // blobs
	blobDir  fs.FileMode // Dir/blobs and the directories under it
	root     fs.FileMode // Dir: searchable by whoever may read blobs
	gid      int         // group of blobs and their directories (and Dir); -1 leaves it
}

const (
	privateFile fs.FileMode = 0o600
	privateDir  fs.FileMode = 0o700
	// chunkFile is the mode of a compressed chunk: read-only to its owner,
	// as blobs are by default, and never opened to others (--cache-mode
	// shares decoded blobs only: chunks are bytes fetched with the
	// owner's credentials, and no reader but the cache opens them).
	chunkFile fs.FileMode = 0o400
)

func newAccess(mode fs.FileMode, group *uint32) (access, error) {
	if mode == 0 {
		mode = DefaultBlobMode
		if group != nil {
			mode = 0o440
		}
	}
	mode &^= 0o200 // the owner's write bit of a mode given as before
	if err := checkBlobMode(mode); err != nil {
		return access{}, fmt.Errorf("blob mode %w", err)
	}
	a := access{blobFile: mode, blobDir: privateDir, root: privateDir, gid: -1}
	if mode&0o040 != 0 {
		a.blobDir |= 0o050
		a.root |= 0o010
	}
	if mode&0o004 != 0 {
		a.blobDir |= 0o005
		a.root |= 0o001
	}
	if group != nil {
		if mode&0o040 == 0 {
			return access{}, fmt.Errorf("blob group %d with mode %04o: the mode gives the group nothing", *group, uint32(mode))
		}
		a.gid = int(*group)
	}
	return a, nil
}

// shared reports whether blobs are readable beyond their owner.
func (a access) shared() bool { return a.blobFile&0o044 != 0 }

func (a access) String() string {
	s := fmt.Sprintf("%04o", uint32(a.blobFile))
	if a.gid >= 0 {
		s += " group " + groupName(a.gid)
	}
	return s
}

func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil && g.Name != "" {
		return g.Name
	}
	return strconv.Itoa(gid)
}

// modeOf is the mode a directory (dir) or file at rel, relative to Dir,
// must have, and whether it is part of the blob tree.
func (a access) modeOf(rel string, dir bool) (fs.FileMode, bool) {
	if top, _, _ := cutFirst(rel); top == blobsDir {
		if dir {
			return a.blobDir, true
		}
		return a.blobFile, true
	}
	if dir {
		return privateDir, false
	}
	if top, _, _ := cutFirst(rel); top == chunksDir {
		return chunkFile, false
	}
	return privateFile, false
}

// BlobAccess reports the mode of blob files and their group (-1 when the
// group is whatever new files get).
func (c *Cache) BlobAccess() (mode fs.FileMode, gid int) {
	return c.acc.blobFile, c.acc.gid
}

func ownerOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

func groupOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Gid)
	}
	return -1
}

// makeRoot creates Dir (owner-only, whatever the umask) and checks that it
// and the entries the cache keeps in it belong to the caller.
func makeRoot(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, privateDir); err == nil {
		if err := os.Chmod(dir, privateDir); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s: not a directory", dir)
	}
	self := os.Geteuid()
	if uid := ownerOf(fi); uid != self {
		return &OwnerError{Dir: dir, Path: dir, Owner: uid, Self: self}
	}
	for _, name := range []string{blobsDir, chunksDir, tmpDir, journalRel, lockRel} {
		p := filepath.Join(dir, name)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if uid := ownerOf(fi); uid != self {
			return &OwnerError{Dir: dir, Path: p, Owner: uid, Self: self}
		}
	}
	return nil
}

// mkdirs creates the directory rel (relative to Dir) and any missing
// parents with the modes and group acc gives them.
func (c *Cache) mkdirs(rel string) error {
	p := filepath.Join(c.dir, rel)
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return nil
		}
		return &os.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
	}
	if parent := filepath.Dir(rel); parent != "." {
		if err := c.mkdirs(parent); err != nil {
			return err
		}
	}
	mode, blob := c.acc.modeOf(filepath.ToSlash(rel), true)
	if err := os.Mkdir(p, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // made meanwhile, by a concurrent fill
		}
		return err
	}
	return setAccess(p, mode, blob, c.acc.gid)
}

// setAccess gives a file just made the mode the umask may have narrowed,
// and the blobs' group.
func setAccess(p string, mode fs.FileMode, blob bool, gid int) error {
	if blob && gid >= 0 {
		if err := os.Lchown(p, -1, gid); err != nil {
			return err
		}
	}
	return os.Chmod(p, mode)
}

// prepare readies a finished temp file for its final path rel: the
// directories leading there exist, and a blob has the mode and group the
// cache gives blobs (a chunk keeps its temp file's owner-only mode).
func (c *Cache) prepare(rel, tmpName string) error {
	if err := c.mkdirs(filepath.Dir(filepath.FromSlash(rel))); err != nil {
		return err
	}
	if mode, blob := c.acc.modeOf(rel, false); blob && (mode != privateFile || c.acc.gid >= 0) {
		return setAccess(tmpName, mode, true, c.acc.gid)
	}
	return nil
}

// applyAccess gives every file in the cache the mode (and blobs the group)
// that acc wants, and logs one line if it had to take access away from a
// cache that existed (a directory made by mkdir for a new cache is
// tightened without a word) or if blobs are shared. The caller holds the
// directory lock for writing.
func (c *Cache) applyAccess(existed bool) error {
	var fix fixCount
	// Dir/blobs last: its mode says the walk under it was done.
	for _, name := range []string{tmpDir, chunksDir, blobsDir} {
		p := filepath.Join(c.dir, name)
		mode, blob := c.acc.modeOf(name, true)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if name != tmpDir && c.acc.matches(fi, mode, blob) {
			// The tree under it was done: not walked before Open returns.
			// What was widened by hand since is, after it (tightenLater).
			if name == blobsDir {
				c.wg.Add(1)
				go c.tightenLater(p)
			}
			continue
		}
		err = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				fix.fail(err)
				return nil
			}
			if q == p {
				return nil
			}
			rel, _ := filepath.Rel(c.dir, q)
			c.fixOne(q, filepath.ToSlash(rel), d, &fix)
			return nil
		})
		if err != nil {
			return err
		}
		c.fixOne(p, name, fs.FileInfoToDirEntry(fi), &fix)
	}
	// Everything else in Dir (the journal, the lock, whatever an older
	// version left), then Dir itself.
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		switch e.Name() {
		case tmpDir, chunksDir, blobsDir:
			continue
		}
		if e.IsDir() {
			filepath.WalkDir(filepath.Join(c.dir, e.Name()), func(q string, d fs.DirEntry, err error) error {
				if err == nil {
					c.fixPrivate(q, d, &fix)
				}
				return nil
			})
			continue
		}
		c.fixPrivate(filepath.Join(c.dir, e.Name()), e, &fix)
	}
	if fi, err := os.Stat(c.dir); err == nil {
		c.fixMode(c.dir, fi, c.acc.root, c.acc.gid, &fix)
	}
	if fix.err != nil {
		c.log.Warn("cache permissions not fully set", "fixed", fix.tightened+fix.widened, "failed", fix.failed, "first_err", fix.err)
	}
	switch {
	case fix.tightened > 0 && existed:
		c.log.Info("cache permissions tightened", "entries", fix.tightened+fix.widened, "blob_mode", c.acc.String())
	case c.acc.shared():
		c.log.Info("cache blobs readable beyond their owner", "blob_mode", c.acc.String())
		c.warnUnreachable()
	}
	return nil
}

// tightenLater walks the blob tree at dir, in the background of an Open
// that found the tree's mark in order, and gives every blob and directory
// the mode the cache gives it: one changed by hand since the last walk
// (chmod 0644 on a blob, 0755 on its directory) is set back at the next
// start, without making every start wait for a walk of the whole tree.
// Close stops it.
func (c *Cache) tightenLater(dir string) {
	defer c.wg.Done()
	var fix fixCount
	filepath.WalkDir(dir, func(q string, d fs.DirEntry, err error) error {
		if c.base.Err() != nil {
			return filepath.SkipAll
		}
		if err != nil || q == dir {
			return nil
		}
		rel, _ := filepath.Rel(c.dir, q)
		c.fixOne(q, filepath.ToSlash(rel), d, &fix)
		return nil
	})
	if fix.tightened+fix.widened > 0 {
		c.log.Info("cache permissions changed since the last start set back", "entries", fix.tightened+fix.widened, "blob_mode", c.acc.String())
	}
	if fix.err != nil {
		c.log.Warn("cache permissions not fully set", "failed", fix.failed, "first_err", fix.err)
	}
}

type fixCount struct {
	tightened, widened, failed int
	err                        error
}

func (f *fixCount) fail(err error) {
	f.failed++
	if f.err == nil {
		f.err = err
	}
}

// matches reports whether fi has mode (and, for the blob tree, the group).
func (a access) matches(fi fs.FileInfo, mode fs.FileMode, blob bool) bool {
	return fi.Mode().Perm() == mode && (!blob || a.gid < 0 || groupOf(fi) == a.gid)
}

// fixOne sets one entry under Dir to the mode and group acc gives it.
// Links and other special files are left alone: the cache makes none.
func (c *Cache) fixOne(p, rel string, d fs.DirEntry, fix *fixCount) {
	if !d.IsDir() && !d.Type().IsRegular() {
		return
	}
	fi, err := d.Info()
	if err != nil {
		return // removed meanwhile
	}
	mode, blob := c.acc.modeOf(rel, d.IsDir())
	gid := -1
	if blob {
		gid = c.acc.gid
	}
	c.fixMode(p, fi, mode, gid, fix)
}

// fixPrivate takes group and other access away from an entry the cache
// does not know.
func (c *Cache) fixPrivate(p string, d fs.DirEntry, fix *fixCount) {
	if !d.IsDir() && !d.Type().IsRegular() {
		return
	}
	if fi, err := d.Info(); err == nil {
		c.fixMode(p, fi, fi.Mode().Perm()&0o700, -1, fix)
	}
}

func (c *Cache) fixMode(p string, fi fs.FileInfo, mode fs.FileMode, gid int, fix *fixCount) {
	if gid >= 0 && groupOf(fi) != gid {
		if err := os.Lchown(p, -1, gid); err != nil {
			fix.fail(err)
			return
		}
		fix.widened++
	}
	have := fi.Mode().Perm()
	if have == mode {
		return
	}
	if err := os.Chmod(p, mode); err != nil {
		fix.fail(err)
		return
	}
	if have&^mode != 0 {
		fix.tightened++
	} else {
		fix.widened++
	}
}

// checkAccess, for an Open that joins a running instance, makes sure that
// instance gives blobs the permissions this one would.
func (c *Cache) checkAccess() error {
	fi, err := os.Lstat(filepath.Join(c.dir, blobsDir))
	if err != nil {
		return err
	}
	if c.acc.matches(fi, c.acc.blobDir, true) {
		return nil
	}
	have := access{}
	for _, m := range []fs.FileMode{0o400, 0o440, 0o404, 0o444} {
		if a, _ := newAccess(m, nil); a.blobDir == fi.Mode().Perm() {
			have = a
		}
	}
	in := fmt.Sprintf("directory mode %04o", uint32(fi.Mode().Perm()))
	if have.blobFile != 0 {
		in = fmt.Sprintf("blob mode %04o", uint32(have.blobFile))
	}
	if c.acc.gid >= 0 {
		in += " group " + groupName(groupOf(fi))
	}
	return fmt.Errorf("%w: another process uses it with %s, this one asks for %s", ErrAccessInUse, in, c.acc)
}

// warnUnreachable warns when a directory above Dir keeps the readers that
// blobs are shared with from reaching them.
func (c *Cache) warnUnreachable() {
	root, err := os.Stat(c.dir)
	if err != nil {
		return
	}
	gid := c.acc.gid
	if gid < 0 {
		gid = groupOf(root)
	}
	for d := filepath.Dir(c.dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return
		}
		m := fi.Mode().Perm()
		ok := m&0o001 != 0 || (c.acc.blobFile&0o004 == 0 && m&0o010 != 0 && groupOf(fi) == gid)
		if !ok {
			c.log.Warn("cache blobs are shared but a directory above the cache is not searchable by their readers",
				"dir", d, "mode", fmt.Sprintf("%04o", uint32(m)))
			return
		}
		if d == filepath.Dir(d) {
			return
		}
	}
}
