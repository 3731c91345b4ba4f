package main

// mutation breaks one behaviour by replacing From, which must occur exactly
// once in File, with To; Pkgs (and Run, a -run filter, when set) are the
// tests that should notice.
type mutation struct {
	Name   string
	Breaks string
	File   string
	From   string
	To     string
	Pkgs   []string
	Run    string
}

// mutations are the behaviours whose loss the suite must notice: those an
// audit found unguarded (issues 20 and 30), and a few it found guarded, so
// that a test rewritten later cannot quietly drop them.
var mutations = []mutation{
	{
		Name:   "shard-index-crc",
		Breaks: "the shard index's crc32c is stripped without comparing it",
		File:   "zarr/read.go",
		From:   "if b, err = verifyCRC(b); err != nil {",
		To:     "if b, err = b[:len(b)-4], error(nil); err != nil {",
		Pkgs:   []string{"./zarr"},
	},
	{
		Name:   "crc32c-compare",
		Breaks: "no crc32c (of a chunk or a shard index) is compared",
		File:   "zarr/read.go",
		From:   "if got := crc32.Checksum(body, castagnoli); got != want {",
		To:     "if got := crc32.Checksum(body, castagnoli); got != want && false {",
		Pkgs:   []string{"./zarr"},
	},
	{
		Name:   "nan-fill",
		Breaks: `a "NaN" fill value reads as 0`,
		File:   "zarr/metadata.go",
		From:   "case \"NaN\":\n\t\t\t\tputFloat(out, dt, math.NaN())",
		To:     "case \"NaN\":\n\t\t\t\tputFloat(out, dt, 0)",
		Pkgs:   []string{"./zarr"},
	},
	{
		Name:   "nan-canonical",
		Breaks: "a NaN fill is stored with Go's NaN payload, not numpy's",
		File:   "zarr/scalar.go",
		From:   "binary.LittleEndian.PutUint32(b, 0x7fc00000)",
		To:     "binary.LittleEndian.PutUint32(b, 0x7fc00001)",
		Pkgs:   []string{"./zarr"},
	},
	{
		Name:   "shard-split-start",
		Breaks: "a contiguous rank split ignores the start of the sample range",
		File:   "fs/layout/shard.go",
		From:   "a := lo + r*n/w",
		To:     "a := r*n/w",
		Pkgs:   []string{"./fs/layout"},
	},
	{
		Name:   "warm-samples-rank",
		Breaks: "warm splits --samples START:STOP among ranks as if it started at 0",
		File:   "fs/layout/plan.go",
		From:   "mine := o.Shard.Of(lo, hi)",
		To:     "mine := o.Shard.Of(0, hi-lo)",
		Pkgs:   []string{"./fs/layout", "./integration"},
		Run:    "Plan|Shard|WarmSamples|WarmRankWorld",
	},
	{
		Name:   "ro-node-open",
		Breaks: "the nodes accept opens for writing",
		File:   "fs/nodes.go",
		From:   "return flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND|syscall.O_CREAT) != 0",
		To:     "return false",
		Pkgs:   []string{"./fs"},
	},
	{
		Name:   "ro-node-unlink",
		Breaks: "the nodes accept unlink",
		File:   "fs/nodes.go",
		From:   "func (*roNode) Unlink(context.Context, string) syscall.Errno { return syscall.EROFS }",
		To:     "func (*roNode) Unlink(context.Context, string) syscall.Errno { return 0 }",
		Pkgs:   []string{"./fs"},
	},
	{
		Name:   "ro-mount-flags",
		Breaks: "the mount is not read-only in the kernel",
		File:   "fs/mount.go",
		From:   "Options:          []string{\"ro\", \"default_permissions\"},\n\t\t\tDirectMount:      os.Geteuid() == 0,\n\t\t\tDirectMountFlags: syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV,",
		To:     "Options:          []string{\"default_permissions\"},\n\t\t\tDirectMount:      os.Geteuid() == 0,\n\t\t\tDirectMountFlags: syscall.MS_NOSUID | syscall.MS_NODEV,",
		Pkgs:   []string{"./fs"},
	},
	{
		Name:   "gpu-stats-claims",
		Breaks: "the GPU decoder counts every job it settles as decoded on the device",
		File:   "gpu/queue.go",
		From:   "d.counts.count(j.Err, len(j.Dst))",
		To:     "d.counts.count(nil, len(j.Dst))",
		Pkgs:   []string{"./gpu"},
	},
	{
		Name:   "views-last-sample",
		Breaks: "the views benchmark compares only the last run's sample with the baseline",
		File:   "integration/bench/views/main.go",
		From:   "if !bytes.Equal(samples[i], ref) {",
		To:     "if !bytes.Equal(samples[len(samples)-1], ref) && i >= 0 {",
		Pkgs:   []string{"./integration/bench/views"},
	},
	{
		Name:   "views-bytes-written",
		Breaks: "the views benchmark counts header bytes as data written",
		File:   "integration/bench/views/main.go",
		From:   "c.n.Add(end - max(off, c.align))",
		To:     "c.n.Add(int64(n))",
		Pkgs:   []string{"./integration/bench/views"},
	},
	{
		Name:   "bench-peer-parse",
		Breaks: "a peer's unparsable timing reads as 0 seconds",
		File:   "integration/mount_bench_test.go",
		From:   "return 0, fmt.Errorf(\"output %q is not a number of seconds: %w\", out, err)",
		To:     "return 0, nil",
		Pkgs:   []string{"./integration"},
		Run:    "PeerSeconds",
	},
	{
		Name:   "ci-skips",
		Breaks: "a missing tool skips the tests that need it even under CI",
		File:   "internal/testenv/testenv.go",
		From:   "\tif CI() {\n\t\tt.Fatalf(",
		To:     "\tif false && CI() {\n\t\tt.Fatalf(",
		Pkgs:   []string{"./internal/testenv", "./integration/miniotest", "./fs/layout", "./integration"},
		Run:    "Missing|Without|UnderCI",
	},
	{
		Name:   "blob-fill-size",
		Breaks: "a blob whose fill wrote the wrong number of bytes is published",
		File:   "cache/blob.go",
		From:   "if fi.Size() != size {",
		To:     "if false && fi.Size() != size {",
		Pkgs:   []string{"./cache"},
	},
	{
		Name:   "cache-verify-sum",
		Breaks: "a cache file whose checksum does not match its journal record is trusted",
		File:   "cache/cache.go",
		From:   "if got != sum {",
		To:     "if false && got != sum {",
		Pkgs:   []string{"./cache"},
	},
	{
		Name:   "lru-hit",
		Breaks: "a cache hit no longer makes its blob the most recently used (the LRU is FIFO)",
		File:   "cache/blob.go",
		From:   "\te.pins++\n\tc.lru.MoveToFront(e.elem)\n\twant := e.size",
		To:     "\te.pins++\n\twant := e.size",
		Pkgs:   []string{"./cache"},
		Run:    "HitMakesRecentlyUsed",
	},
	{
		Name:   "recovery-longer-blob",
		Breaks: "recovery trusts a blob file longer than its recorded size",
		File:   "cache/cache.go",
		From:   "if !fi.Mode().IsRegular() || fi.Size() != size {",
		To:     "if !fi.Mode().IsRegular() || fi.Size() < size {",
		Pkgs:   []string{"./cache"},
		Run:    "Recovery",
	},
	{
		Name:   "view-step-identity",
		Breaks: "a view with samples.step > 1 names the source chunks of the wrong time step in its identity",
		File:   "fs/layout/view_fill.go",
		From:   "t := b.v.Start + b.k*b.v.Step",
		To:     "t := b.v.Start + b.k",
		Pkgs:   []string{"./fs/layout"},
	},
	{
		Name:   "breaker-probe-answer",
		Breaks: "the breaker's probe takes an answered error (404, 403) for silence and stays open",
		File:   "objectstore/breaker.go",
		From:   "if err != nil && isSilence(err) {\n\t\t\tcontinue",
		To:     "if err != nil {\n\t\t\tcontinue",
		Pkgs:   []string{"./objectstore"},
		Run:    "Breaker",
	},
	{
		Name:   "fill-fail-release",
		Breaks: "a fill of an array that fails keeps its memory reservation",
		File:   "fs/layout/pieces.go",
		From:   "\tdefer release()\n\tbuf := o.slab(p.bytes)\n\tdefer o.freeSlab(buf)\n\treturn p.pieces(start, count, func(ps, pc []int64) error {\n\t\tn := prod(pc) * int64(a.DType.Size)\n\t\tdst := buf[:n]\n\t\treq := []zarr.Request{{Array: a, Start: ps, Count: pc, Dst: dst}}\n\t\tif err := o.Reader.Read(ctx, req); err != nil {\n\t\t\treturn err\n\t\t}\n\t\tif err := writePiece(w, base, start, count, ps, pc, p.axis, int64(a.DType.Size), dst); err != nil {\n\t\t\treturn fmt.Errorf(\"write: %w\", err)\n\t\t}\n\t\treturn nil\n\t})\n}\n\n",
		To:     "\tbuf := o.slab(p.bytes)\n\tdefer o.freeSlab(buf)\n\tdefer func() {\n\t\tif err == nil {\n\t\t\trelease()\n\t\t}\n\t}()\n\terr = p.pieces(start, count, func(ps, pc []int64) error {\n\t\tn := prod(pc) * int64(a.DType.Size)\n\t\tdst := buf[:n]\n\t\treq := []zarr.Request{{Array: a, Start: ps, Count: pc, Dst: dst}}\n\t\tif err := o.Reader.Read(ctx, req); err != nil {\n\t\t\treturn err\n\t\t}\n\t\tif err := writePiece(w, base, start, count, ps, pc, p.axis, int64(a.DType.Size), dst); err != nil {\n\t\t\treturn fmt.Errorf(\"write: %w\", err)\n\t\t}\n\t\treturn nil\n\t})\n\treturn err\n}\n\n",
		Pkgs:   []string{"./fs/layout"},
	},
}
