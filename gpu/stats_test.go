package gpu

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
)

// Stats counts each job once by what became of it: decoded on the device
// and delivered, refused (for the CPU: up front, or with a failed round),
// or corrupt; and the rounds the device ran.
func TestStatsCountOutcomes(t *testing.T) {
	f := newFake(t, false)
	errDevice := errors.New("device lost")
	failing := newCaller(2, 2, 0)
	f.fail = func(r *round) error {
		if failing.owns(r) > 0 {
			return errDevice
		}
		return nil
	}
	d := newFakeDecoder(f, Options{})
	defer d.Close()
	if s := d.Stats(); s != (Stats{}) {
		t.Fatalf("a new decoder's stats: %+v", s)
	}
	c := newCaller(1, 4, 0)
	// Job 1: a valid LZ4 header with a damaged block, which the device
	// rejects; job 2: zlib, which the GPU path refuses up front (Options.
	// Deflate is off).
	c.jobs[1].Src = bytes.Clone(c.jobs[1].Src)
	for i := 4; i < len(c.jobs[1].Src); i++ {
		c.jobs[1].Src[i] = 0xFF
	}
	c.jobs[2].Codec, c.jobs[2].Src = codec.Zlib, compress(codec.Zlib, c.want[2])
	if err := d.DecodeBatch(context.Background(), c.jobs); err != nil {
		t.Fatal(err)
	}
	var good int64
	for k, j := range c.jobs {
		if j.Err == nil {
			good += int64(len(j.Dst))
			if !bytes.Equal(j.Dst, c.want[k]) {
				t.Fatalf("job %d: wrong bytes", k)
			}
		}
	}
	if !errors.Is(c.jobs[1].Err, codec.ErrCorrupt) || !errors.Is(c.jobs[2].Err, codec.ErrUnsupported) {
		t.Fatalf("damaged job: %v; zlib job: %v", c.jobs[1].Err, c.jobs[2].Err)
	}
	want := Stats{Chunks: 2, Bytes: good, Refused: 1, Corrupt: 1, Rounds: 1}
	if s := d.Stats(); s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
	failing.run(d)
	if err := <-failing.err; !errors.Is(err, errDevice) {
		t.Fatalf("failed round: %v", err)
	}
	want.Refused += 2
	if s := d.Stats(); s != want {
		t.Fatalf("after a failed round: stats %+v, want %+v", s, want)
	}
}

// requireOnGPU fails t unless d's own counters say it decoded exactly n
// chunks on the device since before, n > 0: the bytes a GPU test compares
// with the CPU's must be the GPU's.
func requireOnGPU(t testing.TB, d *Decoder, before Stats, n int) {
	t.Helper()
	got := d.Stats().Chunks - before.Chunks
	if n == 0 || got != int64(n) {
		t.Errorf("the decoder's stats say the GPU decoded %d chunks; the test counted %d decoded there", got, n)
	}
}

// Costs counts, per codec, what was delivered and the host's time on the
// GPU path's own goroutines: framing and checks, packing, copying out.
func TestCosts(t *testing.T) {
	f := newFake(t, false)
	d := newFakeDecoder(f, Options{})
	defer d.Close()
	c := newCaller(1, 6, 0) // zstd, LZ4 and blosc, two each
	c.run(d)
	c.check(t, "caller")
	costs := d.Costs()
	var chunks int64
	for _, name := range []codec.Name{codec.Zstd, codec.LZ4, codec.Blosc} {
		k := costs[name]
		if k.Chunks != 2 || k.Bytes <= 0 || k.HostNanos <= 0 {
			t.Errorf("%s: %+v, want 2 chunks, their bytes and some host time", name, k)
		}
		chunks += k.Chunks
	}
	if s := d.Stats(); s.Chunks != chunks {
		t.Errorf("Costs count %d chunks, Stats %d", chunks, s.Chunks)
	}
}
