package fs

import (
	"context"
	"hash/fnv"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/layout"
)

// inoOf gives every path a stable inode number, so the same file keeps its
// number across lookups and forgets (tools such as tar and rsync rely on it,
// and go-fuse keys the passthrough backing file by inode). Numbers stay below
// go-fuse's automatic range (2^63 and up) and above the root's 1.
func inoOf(p string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(p))
	ino := h.Sum64() &^ (1 << 63)
	if ino < 2 {
		ino += 2
	}
	return ino
}

// roNode refuses every modifying operation with EROFS. Embedded by all nodes.
type roNode struct {
	gofs.Inode
	m *Mounted
}

var (
	_ gofs.NodeSetattrer  = (*roNode)(nil)
	_ gofs.NodeCreater    = (*roNode)(nil)
	_ gofs.NodeMkdirer    = (*roNode)(nil)
	_ gofs.NodeMknoder    = (*roNode)(nil)
	_ gofs.NodeUnlinker   = (*roNode)(nil)
	_ gofs.NodeRmdirer    = (*roNode)(nil)
	_ gofs.NodeRenamer    = (*roNode)(nil)
	_ gofs.NodeLinker     = (*roNode)(nil)
	_ gofs.NodeSymlinker  = (*roNode)(nil)
	_ gofs.NodeSetxattrer = (*roNode)(nil)
)

func (*roNode) Setattr(context.Context, gofs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}
func (*roNode) Create(context.Context, string, uint32, uint32, *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}
func (*roNode) Mkdir(context.Context, string, uint32, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}
func (*roNode) Mknod(context.Context, string, uint32, uint32, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}
func (*roNode) Unlink(context.Context, string) syscall.Errno { return syscall.EROFS }
func (*roNode) Rmdir(context.Context, string) syscall.Errno  { return syscall.EROFS }
func (*roNode) Rename(context.Context, string, gofs.InodeEmbedder, string, uint32) syscall.Errno {
	return syscall.EROFS
}
func (*roNode) Link(context.Context, gofs.InodeEmbedder, string, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}
func (*roNode) Symlink(context.Context, string, string, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}
func (*roNode) Setxattr(context.Context, string, []byte, uint32) syscall.Errno { return syscall.EROFS }

// fill sets the attributes every node shares: owner, times, link count.
func (n *roNode) fill(a *fuse.Attr, mode uint32, size int64, ino uint64) {
	n.m.fillAttr(a, mode, size, ino)
}

func (m *Mounted) fillAttr(a *fuse.Attr, mode uint32, size int64, ino uint64) {
	a.Mode = mode
	a.Size = uint64(size)
	a.Blocks = (uint64(size) + 511) / 512
	a.Blksize = 1 << 20
	a.Ino = ino
	a.Nlink = 1
	if mode&syscall.S_IFDIR != 0 {
		a.Nlink = 2
	}
	a.Owner = m.owner
	t := m.mtime
	a.SetTimes(&t, &t, &t)
}

const (
	dirMode  = syscall.S_IFDIR | 0o555
	fileMode = syscall.S_IFREG | 0o444
)

// dirNode is a group or sample directory. Its entries come from the
// current layout on demand, so a directory of 100,000 samples holds no
// inode until the kernel looks one up, and the kernel may forget them
// again. Nodes name their path, not a layout's entry: after a refresh
// (Options.Refresh) they answer from the new tree.
type dirNode struct {
	roNode
	path string
	// resolve marks the unlisted mirror of the tree under resolveDir that
	// direct mode's links point into (see direct.go).
	resolve bool
}

// dir returns the directory in the current layout, nil if it is gone.
func (n *dirNode) dir() *layout.Dir {
	e, ok := n.m.Layout().Lookup(n.path)
	if !ok || e.Kind != layout.KindDir {
		return nil
	}
	return e.Dir
}

var (
	_ gofs.NodeLookuper       = (*dirNode)(nil)
	_ gofs.NodeOpendirHandler = (*dirNode)(nil)
	_ gofs.NodeGetattrer      = (*dirNode)(nil)
)

func (n *dirNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr, dirMode, 0, n.StableAttr().Ino)
	return 0
}

func (n *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.m.opts.Direct && !n.resolve && n.path == "" && name == resolveDir {
		ino := inoOf(resolveDir)
		n.m.fillAttr(&out.Attr, dirMode, 0, ino)
		node := &dirNode{roNode: roNode{m: n.m}, path: "", resolve: true}
		return n.NewInode(ctx, node, gofs.StableAttr{Mode: dirMode, Ino: ino}), 0
	}
	d := n.dir()
	if d == nil {
		return nil, syscall.ENOENT
	}
	e, ok := d.Lookup(name)
	if !ok || (n.resolve && e.Kind == layout.KindSidecar) {
		return nil, syscall.ENOENT
	}
	if n.m.opts.Direct && n.path == "" && shadowed(n.m.Layout(), name) {
		return nil, syscall.ENOENT
	}
	return n.m.child(ctx, &n.Inode, n.path, e, &out.Attr, n.resolve), 0
}

// OpendirHandle returns a stream over the layout directory. FOPEN_CACHE_DIR
// lets the kernel keep the listing; a refresh that changes it tells the
// kernel to drop it (Mounted.notify).
func (n *dirNode) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return &dirStream{n: n}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// child makes (or finds, by its stable inode number) the inode of entry e in
// directory dir, and fills its attributes. resolve places it in the
// resolving mirror of direct mode.
func (m *Mounted) child(ctx context.Context, parent *gofs.Inode, dir string, e layout.Entry, a *fuse.Attr, resolve bool) *gofs.Inode {
	p := e.Name
	if dir != "" {
		p = dir + "/" + e.Name
	}
	key := p
	if resolve {
		key = resolveDir + "/" + p
	}
	ino := inoOf(key)
	var node gofs.InodeEmbedder
	mode := uint32(fileMode)
	size := e.Size()
	switch {
	case e.Kind == layout.KindDir:
		mode = dirMode
		node = &dirNode{roNode: roNode{m: m}, path: p, resolve: resolve}
	case e.Kind == layout.KindBlob && resolve:
		target := m.opts.Blobs.Path(m.Layout(), e.Blob.Path())
		mode, size = linkMode, int64(len(target))
		node = &resolveNode{roNode: roNode{m: m}, path: p, target: target}
	case e.Kind == layout.KindBlob && m.opts.Direct:
		target := linkTarget(p)
		mode, size = linkMode, int64(len(target))
		node = &linkNode{roNode: roNode{m: m}, target: target}
	case e.Kind == layout.KindBlob:
		node = &blobNode{roNode: roNode{m: m}, path: p}
	default:
		node = &sidecarNode{roNode: roNode{m: m}, path: p}
	}
	m.fillAttr(a, mode, size, ino)
	child := parent.NewInode(ctx, node, gofs.StableAttr{Mode: mode, Ino: ino})
	if e.Kind != layout.KindDir && m.inodes != nil {
		m.inodes.add(parent, e.Name)
	}
	return child
}

// dirStream lists a layout directory by index; the offset of an entry is its
// index plus one, so seeking is free. The resolving mirror lists nothing.
type dirStream struct {
	n   *dirNode
	pos int
}

var (
	_ gofs.FileReaddirenter = (*dirStream)(nil)
	_ gofs.FileSeekdirer    = (*dirStream)(nil)
	_ gofs.FileReleasedirer = (*dirStream)(nil)
)

func (s *dirStream) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d := s.n.dir()
	if s.n.resolve || d == nil || s.pos >= d.Len() {
		return nil, 0
	}
	e := d.Entry(s.pos)
	s.pos++
	if s.n.m.opts.Direct && d.Path() == "" && shadowed(s.n.m.Layout(), e.Name) {
		return s.Readdirent(ctx)
	}
	p := e.Name
	if d.Path() != "" {
		p = d.Path() + "/" + e.Name
	}
	mode := uint32(fileMode)
	switch {
	case e.Kind == layout.KindDir:
		mode = dirMode
	case e.Kind == layout.KindBlob && s.n.m.opts.Direct:
		mode = linkMode
	}
	return &fuse.DirEntry{Name: e.Name, Mode: mode, Ino: inoOf(p), Off: uint64(s.pos)}, 0
}

func (s *dirStream) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	n := 0
	if d := s.n.dir(); d != nil {
		n = d.Len()
	}
	s.pos = int(min(off, uint64(n)))
	return 0
}

func (s *dirStream) Releasedir(ctx context.Context, flags uint32) {}

// sidecarNode serves a JSON description from memory, the current
// layout's.
type sidecarNode struct {
	roNode
	path string
}

func (n *sidecarNode) data() []byte {
	e, ok := n.m.Layout().Lookup(n.path)
	if !ok || e.Kind != layout.KindSidecar {
		return nil
	}
	return e.Data
}

var (
	_ gofs.NodeOpener    = (*sidecarNode)(nil)
	_ gofs.NodeReader    = (*sidecarNode)(nil)
	_ gofs.NodeGetattrer = (*sidecarNode)(nil)
)

func (n *sidecarNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var size int
	if sf, ok := f.(*sidecarFile); ok {
		size = len(sf.data)
	} else {
		size = len(n.data())
	}
	n.fill(&out.Attr, fileMode, int64(size), n.StableAttr().Ino)
	return 0
}

// Open takes the description as it is now: a reader keeps the version it
// opened. KEEP_CACHE: a refresh that changes it drops the kernel's copy
// (Mounted.notify).
func (n *sidecarNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if writeFlags(flags) {
		return nil, 0, syscall.EROFS
	}
	data := n.data()
	if data == nil {
		return nil, 0, syscall.ENOENT
	}
	return &sidecarFile{data: data}, fuse.FOPEN_KEEP_CACHE, 0
}

func (n *sidecarNode) Read(ctx context.Context, f gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	var data []byte
	if sf, ok := f.(*sidecarFile); ok {
		data = sf.data
	} else {
		data = n.data()
	}
	if off >= int64(len(data)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(data)))
	return fuse.ReadResultData(data[off:end]), 0
}

// sidecarFile is an open sidecar: the bytes it was opened with.
type sidecarFile struct{ data []byte }

// writeFlags reports whether open flags ask for any kind of write.
func writeFlags(flags uint32) bool {
	return flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND|syscall.O_CREAT) != 0
}

// blobNode is an .npy file backed by a cache file filled on first open.
type blobNode struct {
	roNode
	path string
	// backing is the inode number of the cache file the last open got: a
	// different one means the blob was replaced (its sample changed), and
	// the kernel's cached pages of the old one must go.
	backing atomic.Uint64
}

// blob returns the blob in the current layout, nil if it is gone.
func (n *blobNode) blob() layout.Blob {
	e, ok := n.m.Layout().Lookup(n.path)
	if !ok || e.Kind != layout.KindBlob {
		return nil
	}
	return e.Blob
}

var (
	_ gofs.NodeOpener    = (*blobNode)(nil)
	_ gofs.NodeGetattrer = (*blobNode)(nil)
)

func (n *blobNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var size int64
	if bf, ok := f.(*blobFile); ok {
		size = bf.size
	} else if b := n.blob(); b != nil {
		size = b.Size()
	}
	n.fill(&out.Attr, fileMode, size, n.StableAttr().Ino)
	return 0
}

// Open fills the blob if the cache lacks it or holds another version of it
// (concurrent opens wait for one fill) and hands the kernel the backing
// file for passthrough reads. The open file keeps reading the version it
// opened, whatever later refreshes find.
func (n *blobNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if writeFlags(flags) {
		return nil, 0, syscall.EROFS
	}
	blob := n.blob()
	if blob == nil {
		return nil, 0, syscall.ENOENT
	}
	n.m.opens.Add(1)
	b, _, err := n.m.open(blob)
	if err != nil {
		return nil, 0, n.m.errno(blob, err)
	}
	n.m.openFiles.Add(1)
	// KEEP_CACHE while the backing file is the one opened before: its
	// bytes never change, so the page cache survives reopen (go-fuse drops
	// it again when passthrough is granted). A new backing file is a new
	// version of the sample: without KEEP_CACHE the kernel drops the old
	// version's pages at this open.
	keep := uint32(fuse.FOPEN_KEEP_CACHE)
	if st, err := b.File().Stat(); err == nil {
		ino := st.Sys().(*syscall.Stat_t).Ino
		if prev := n.backing.Swap(ino); prev != 0 && prev != ino {
			keep = 0
		}
	}
	return &blobFile{b: b, fd: int(b.File().Fd()), size: blob.Size(), m: n.m}, keep, 0
}

// blobFile is an open .npy file. With passthrough the kernel reads the
// backing file itself and Read is never called; otherwise Read splices from
// the backing descriptor.
type blobFile struct {
	b    fill.Backing
	fd   int
	size int64
	m    *Mounted
}

var (
	_ gofs.FilePassthroughFder = (*blobFile)(nil)
	_ gofs.FileReader          = (*blobFile)(nil)
	_ gofs.FileReleaser        = (*blobFile)(nil)
)

func (f *blobFile) PassthroughFd() (int, bool) { return f.fd, true }

func (f *blobFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return fuse.ReadResultFd(uintptr(f.fd), off, len(dest)), 0
}

func (f *blobFile) Release(ctx context.Context) syscall.Errno {
	f.m.openFiles.Add(-1)
	if err := f.b.Close(); err != nil {
		return gofs.ToErrno(err)
	}
	return 0
}

// Flush answers ENOSYS: nothing is ever written, and the kernel then stops
// sending FLUSH on close for the whole mount, saving a round trip per file.
func (*roNode) Flush(context.Context, gofs.FileHandle) syscall.Errno { return syscall.ENOSYS }

var _ gofs.NodeFlusher = (*roNode)(nil)
