package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/zarrfs/zarrfs/internal/mountinfo"
)

// tmpfsHugeHint returns a line for the log when the cache is on a tmpfs
// mounted without huge pages, and "" otherwise. Writing a blob to such a
// tmpfs allocates it 4 KiB page by page: writes cost about twice the CPU
// they cost on a tmpfs mounted with huge=within_size, and threads write
// half as fast (BENCHMARKS.md, tuning choices). The sysfs setting
// shmem_enabled "force" gives every tmpfs huge pages, so no hint then.
func tmpfsHugeHint(mounts []mountinfo.Entry, shmemEnabled, dir string) string {
	e, ok := mountinfo.Containing(mounts, dir)
	if !ok || e.FSType != "tmpfs" || strings.Contains(shmemEnabled, "[force]") {
		return ""
	}
	switch huge, _ := e.Option("huge"); huge {
	case "always", "within_size":
		return ""
	}
	return "the cache is on a tmpfs without huge pages (" + e.Mountpoint + "): writing blobs there costs about twice the CPU it does on a tmpfs mounted with huge=within_size (docs/cache.md)"
}

// logCacheHint logs tmpfsHugeHint for a cache directory of this machine:
// where fills are about to run (a mount going live, a warm with work to
// do), not on the paths that end in an error, which is one line.
func logCacheHint(log *slog.Logger, dir string) {
	if hint := cacheTmpfsHint(dir); hint != "" {
		log.Info(hint)
	}
}

// cacheTmpfsHint is tmpfsHugeHint for a cache directory of this machine
// (absolute, as Cache.Dir is; the mount table names resolved paths).
func cacheTmpfsHint(dir string) string {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	mounts, err := mountinfo.Read()
	if err != nil {
		return ""
	}
	shmem, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	return tmpfsHugeHint(mounts, string(shmem), dir)
}
