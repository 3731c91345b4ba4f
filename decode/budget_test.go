package decode

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/gpu"
)

// One number sizes GPU decoding: without PinnedMemory the pinned bound
// follows GPUMemory (the rounds' staging plus what the default lends), so
// a larger GPUMemory alone is never refused for its staging; a pinned
// bound given too small is refused in one line naming the flag.
func TestPinnedFollowsGPUMemory(t *testing.T) {
	def, err := Options{GPUMemory: DefaultGPUMemory}.gpuOptions()
	if err != nil {
		t.Fatal(err)
	}
	if got := def.StagingBytes + def.HostBytes; got != DefaultPinnedMemory {
		t.Errorf("pinned at the default --gpu-memory: %d, want %d", got, int64(DefaultPinnedMemory))
	}
	for _, mem := range []int64{768 << 20, 2 << 30, 8 << 30, 40 << 30} {
		g, err := Options{GPUMemory: mem}.gpuOptions()
		if err != nil {
			t.Errorf("--gpu-memory %s alone: %v", size(mem), err)
			continue
		}
		if g.HostBytes != DefaultLentMemory || g.StagingBytes < g.MaxBatchBytes {
			t.Errorf("--gpu-memory %s: staging %s for rounds of %s, lent %s", size(mem), size(g.StagingBytes), size(g.MaxBatchBytes), size(g.HostBytes))
		}
	}
	// Given, it is the bound, and too small it names itself and the way out.
	_, err = Options{GPUMemory: 8 << 30, PinnedMemory: 2 << 30}.gpuOptions()
	if !errors.Is(err, gpu.ErrBudget) || !strings.HasPrefix(err.Error(), "--pinned-memory 2GiB: ") ||
		!strings.Contains(err.Error(), "leave --pinned-memory out") || strings.Contains(err.Error(), "\n") {
		t.Errorf("8GiB with 2GiB pinned: %v", err)
	}
	_, err = Options{GPUMemory: 600 << 20}.gpuOptions()
	if !errors.Is(err, gpu.ErrBudget) || !strings.HasPrefix(err.Error(), "--gpu-memory 600MiB: ") {
		t.Errorf("600MiB: %v", err)
	}

	// gpu mode takes --gpu-memory 8GiB alone; the pipeline reports the
	// pinned bound it followed.
	var made []*fakeGPU
	opts := fakes(GPU, 1, &made)
	opts.GPUMemory = 8 << 30
	p, err := New(opts)
	if err != nil {
		t.Fatalf("gpu mode, --gpu-memory 8GiB alone: %v", err)
	}
	defer p.Close()
	if p.opts.PinnedMemory != p.opts.GPU.StagingBytes+p.opts.GPU.HostBytes || p.opts.GPU.StagingBytes < 4<<30 {
		t.Errorf("pinned %s, staging %s", size(p.opts.PinnedMemory), size(p.opts.GPU.StagingBytes))
	}
}

// Auto mode with bounds the GPU cannot decode in says so once, at start, as
// a warning naming the flag, and stays on the CPU.
func TestAutoBudgetSaidOnce(t *testing.T) {
	var buf bytes.Buffer
	var made []*fakeGPU
	opts := fakes(Auto, 1, &made)
	opts.GPUMemory, opts.PinnedMemory = 8<<30, 1<<30
	opts.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for range 3 {
		j := []codec.Job{zstdJob(t)}
		if err := p.DecodeBatch(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	if on, _ := p.Ready(context.Background()); on || len(made) != 0 {
		t.Errorf("auto under budget: on GPU %v, %d GPUs opened", on, len(made))
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "--pinned-memory 1GiB") {
		t.Errorf("want one warning naming --pinned-memory, got:\n%s", buf.String())
	}
}
