package fs

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// The mount is read-only twice over: the kernel's read-only flag refuses
// writes before they reach the daemon, and the nodes refuse whatever
// reaches them. Each layer is tested here without the other.

// unmountedNodes returns one node of every kind over smallArrays, with a
// Mounted that was never mounted: no kernel sits in front of them.
func unmountedNodes(t *testing.T) (map[string]gofs.InodeEmbedder, *patternReader) {
	t.Helper()
	r := &patternReader{}
	h := &zarr.Hierarchy{Arrays: smallArrays(), Groups: map[string]map[string]any{"": {}}}
	l, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.Open(cache.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	m := &Mounted{opts: Options{Layout: l, Blobs: testBlobs(t, c, r)}, log: slog.New(slog.DiscardHandler), reported: map[string]bool{}, life: context.Background()}
	m.lay.Store(l)
	m.leases = newLeases(time.Minute, m.log)
	t.Cleanup(m.leases.close)
	return map[string]gofs.InodeEmbedder{
		"root":    &dirNode{roNode: roNode{m: m}, path: ""},
		"dir":     &dirNode{roNode: roNode{m: m}, path: "t"},
		"blob":    &blobNode{roNode: roNode{m: m}, path: "t/00.npy"},
		"sidecar": &sidecarNode{roNode: roNode{m: m}, path: "t.json"},
		"link":    &linkNode{roNode: roNode{m: m}, target: linkTarget("t/00.npy")},
		"resolve": &resolveNode{roNode: roNode{m: m}, path: "t/00.npy", target: "/x"},
	}, r
}

// Every node refuses every modifying operation with EROFS, and the files
// refuse every kind of open for writing while plain opens work.
func TestNodesRefuseWrites(t *testing.T) {
	nodes, r := unmountedNodes(t)
	ctx := context.Background()
	for kind, n := range nodes {
		ops := map[string]func() syscall.Errno{
			"setattr": func() syscall.Errno {
				s, ok := n.(gofs.NodeSetattrer)
				if !ok {
					return 0
				}
				return s.Setattr(ctx, nil, &fuse.SetAttrIn{}, &fuse.AttrOut{})
			},
			"create": func() syscall.Errno {
				s, ok := n.(gofs.NodeCreater)
				if !ok {
					return 0
				}
				_, _, _, e := s.Create(ctx, "new.npy", uint32(os.O_WRONLY|os.O_CREATE), 0o644, &fuse.EntryOut{})
				return e
			},
			"mkdir": func() syscall.Errno {
				s, ok := n.(gofs.NodeMkdirer)
				if !ok {
					return 0
				}
				_, e := s.Mkdir(ctx, "d", 0o755, &fuse.EntryOut{})
				return e
			},
			"mknod": func() syscall.Errno {
				s, ok := n.(gofs.NodeMknoder)
				if !ok {
					return 0
				}
				_, e := s.Mknod(ctx, "p", syscall.S_IFIFO|0o644, 0, &fuse.EntryOut{})
				return e
			},
			"unlink": func() syscall.Errno {
				s, ok := n.(gofs.NodeUnlinker)
				if !ok {
					return 0
				}
				return s.Unlink(ctx, "00.npy")
			},
			"rmdir": func() syscall.Errno {
				s, ok := n.(gofs.NodeRmdirer)
				if !ok {
					return 0
				}
				return s.Rmdir(ctx, "t")
			},
			"rename": func() syscall.Errno {
				s, ok := n.(gofs.NodeRenamer)
				if !ok {
					return 0
				}
				return s.Rename(ctx, "00.npy", n, "01.npy", 0)
			},
			"link": func() syscall.Errno {
				s, ok := n.(gofs.NodeLinker)
				if !ok {
					return 0
				}
				_, e := s.Link(ctx, n, "l", &fuse.EntryOut{})
				return e
			},
			"symlink": func() syscall.Errno {
				s, ok := n.(gofs.NodeSymlinker)
				if !ok {
					return 0
				}
				_, e := s.Symlink(ctx, "00.npy", "l", &fuse.EntryOut{})
				return e
			},
			"setxattr": func() syscall.Errno {
				s, ok := n.(gofs.NodeSetxattrer)
				if !ok {
					return 0
				}
				return s.Setxattr(ctx, "user.x", []byte("1"), 0)
			},
		}
		for op, f := range ops {
			if e := f(); e != syscall.EROFS {
				t.Errorf("%s node: %s returned %v, want EROFS", kind, op, e)
			}
		}
	}
	for _, kind := range []string{"blob", "sidecar"} {
		o := nodes[kind].(gofs.NodeOpener)
		for _, flags := range []int{os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_RDONLY | os.O_APPEND, os.O_RDONLY | os.O_CREATE} {
			if fh, _, e := o.Open(ctx, uint32(flags)); e != syscall.EROFS {
				t.Errorf("%s node: open with flags %#x returned %v, want EROFS", kind, flags, e)
				if r, ok := fh.(gofs.FileReleaser); ok {
					r.Release(ctx)
				}
			}
		}
	}
	if n := r.reads.Load(); n != 0 {
		t.Errorf("refused opens read the source %d times", n)
	}
	fh, _, e := nodes["blob"].(gofs.NodeOpener).Open(ctx, uint32(os.O_RDONLY))
	if e != 0 {
		t.Fatalf("read-only open: %v", e)
	}
	fh.(gofs.FileReleaser).Release(ctx)
}

// permissiveDir is a directory that accepts every write: mounted with the
// mount's own options, only the kernel's read-only flag can refuse them.
type permissiveDir struct {
	gofs.Inode
	calls atomic.Int64 // modifying operations that reached the daemon
}

type permissiveFile struct {
	gofs.MemRegularFile
	dir *permissiveDir
}

var (
	_ gofs.NodeOnAdder   = (*permissiveDir)(nil)
	_ gofs.NodeCreater   = (*permissiveDir)(nil)
	_ gofs.NodeMkdirer   = (*permissiveDir)(nil)
	_ gofs.NodeUnlinker  = (*permissiveDir)(nil)
	_ gofs.NodeGetattrer = (*permissiveDir)(nil)
	_ gofs.NodeOpener    = (*permissiveFile)(nil)
	_ gofs.NodeSetattrer = (*permissiveFile)(nil)
)

func (d *permissiveDir) OnAdd(ctx context.Context) {
	for _, name := range []string{"f", "g"} {
		f := &permissiveFile{dir: d}
		f.Attr.Mode = 0o666
		d.AddChild(name, d.NewPersistentInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG}), false)
	}
}

func (d *permissiveDir) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o777
	return 0
}

func (d *permissiveDir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	d.calls.Add(1)
	f := &permissiveFile{dir: d}
	f.Attr.Mode = 0o666
	out.Mode = syscall.S_IFREG | 0o666
	return d.NewInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG}), nil, fuse.FOPEN_DIRECT_IO, 0
}

func (d *permissiveDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	d.calls.Add(1)
	out.Mode = syscall.S_IFDIR | 0o777
	return d.NewInode(ctx, &gofs.Inode{}, gofs.StableAttr{Mode: syscall.S_IFDIR}), 0
}

func (d *permissiveDir) Unlink(ctx context.Context, name string) syscall.Errno {
	d.calls.Add(1)
	return 0
}

func (f *permissiveFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if writeFlags(flags) {
		f.dir.calls.Add(1)
	}
	return f.MemRegularFile.Open(ctx, flags)
}

func (f *permissiveFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.dir.calls.Add(1)
	return f.MemRegularFile.Setattr(ctx, fh, in, out)
}

// mountPermissive mounts a permissiveDir with the options Mount uses,
// changed by edit.
func mountPermissive(t *testing.T, edit func(*gofs.Options)) (string, *permissiveDir) {
	t.Helper()
	requireFUSE(t)
	l, err := layout.Build(&zarr.Hierarchy{Groups: map[string]map[string]any{"": {}}}, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := &Mounted{opts: Options{Layout: l}, owner: fuse.Owner{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}}
	mo := m.fuseOptions()
	edit(mo)
	dir, root := t.TempDir(), &permissiveDir{}
	server, err := gofs.Mount(dir, root, mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := server.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return dir, root
}

// writes tries one write of every kind under dir and returns each error.
func writes(dir string) map[string]error {
	p := func(s string) string { return filepath.Join(dir, s) }
	return map[string]error{
		"open for write": func() error {
			f, err := os.OpenFile(p("f"), os.O_WRONLY, 0)
			if err == nil {
				_, err = f.Write([]byte("x"))
				f.Close()
			}
			return err
		}(),
		"create":   os.WriteFile(p("new"), []byte("x"), 0o644),
		"mkdir":    os.Mkdir(p("d"), 0o755),
		"unlink":   os.Remove(p("g")),
		"truncate": os.Truncate(p("f"), 0),
		"chmod":    os.Chmod(p("f"), 0o600),
	}
}

// With the mount's options, the kernel refuses every write to a tree that
// would accept them, before the daemon hears of it, and says the
// filesystem is read-only.
func TestMountFlagsRefuseWrites(t *testing.T) {
	dir, root := mountPermissive(t, func(*gofs.Options) {})
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Flags&0x1 == 0 { // ST_RDONLY
		t.Errorf("statfs flags %#x lack ST_RDONLY", st.Flags)
	}
	for op, err := range writes(dir) {
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s: %v, want EROFS from the kernel", op, err)
		}
	}
	if n := root.calls.Load(); n != 0 {
		t.Errorf("%d modifying operations reached the daemon", n)
	}
}

// The same tree mounted without the read-only flag accepts the writes: so
// TestMountFlagsRefuseWrites sees the flag at work, not the tree.
func TestPermissiveTreeAcceptsWrites(t *testing.T) {
	dir, root := mountPermissive(t, func(mo *gofs.Options) {
		mo.Options = []string{"default_permissions"}
		mo.DirectMountFlags &^= syscall.MS_RDONLY
	})
	for op, err := range writes(dir) {
		if err != nil {
			t.Errorf("%s: %v", op, err)
		}
	}
	if root.calls.Load() == 0 {
		t.Error("no write reached the daemon")
	}
}
