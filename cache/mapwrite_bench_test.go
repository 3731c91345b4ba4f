package cache

import (
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkBlobWrite writes an 87 MB sample's data as a fill does, through
// the mapping and with write(2), into ZARRFS_BENCH_DIR (default /dev/shm):
// wall time per sample and the process's CPU time per sample ("cpu-ms").
func BenchmarkBlobWrite(b *testing.B) {
	dir := os.Getenv("ZARRFS_BENCH_DIR")
	if dir == "" {
		dir = "/dev/shm"
	}
	data := content("sample", 87<<20)
	for _, mode := range []string{"write", "mapped"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			c0 := cpuTime()
			t0 := time.Now()
			for range b.N {
				f, err := os.CreateTemp(dir, "bench-*")
				if err != nil {
					b.Fatal(err)
				}
				var filling atomic.Int64
				filling.Store(1)
				hw := &hashingWriter{f: f, d: newHasher(true), noMap: mode == "write", filling: &filling}
				if _, err := hw.WriteAt(data, 4096); err != nil {
					b.Fatal(err)
				}
				f.Close()
				os.Remove(f.Name())
			}
			b.ReportMetric(float64(cpuTime()-c0)/float64(time.Millisecond)/float64(b.N), "cpu-ms")
			_ = t0
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
