package fill

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"context"
	"encoding/binary"
	"math"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// memoStorePy writes (create) or rewrites (rewrite) with zarr-python a
// store of t, float32 (4, 8, 8) in chunks of two time steps, element
// [i, y, x] = i*100 + y*8 + x (+1000 once rewritten), and lsm, a float32
// (8, 8) land-sea mask of 0 and 1 (inverted once rewritten).
const memoStorePy = `
import sys
import numpy as np
import zarr
op, path = sys.argv[1:3]
yx = np.arange(64, dtype=np.float32).reshape(8, 8)
mask = ((np.arange(8)[:, None] + np.arange(8)[None, :]) % 2).astype(np.float32)
if op == 'create':
    g = zarr.open_group(path, mode='w', zarr_format=3)
    t = g.create_array('t', shape=(4, 8, 8), chunks=(2, 8, 8), dtype='f4', dimension_names=('time', 'y', 'x'))
    t[:] = np.stack([i * 100 + yx for i in range(4)])
    lsm = g.create_array('lsm', shape=(8, 8), chunks=(8, 8), dtype='f4', dimension_names=('y', 'x'))
    lsm[:] = mask
else:
    g = zarr.open_group(path, mode='r+')
    g['t'][0:2] = np.stack([i * 100 + yx + 1000 for i in range(2)])
    g['lsm'][:] = 1 - mask
`

// A view's static channel (a land-sea mask), memoized after the first
// sample, and a chunk kept decoded for the next sample of its two, both
// rewritten while the array's listing stays the same: past the versions a
// local store's listings keep (LazyVersions; -1 keeps none, as a mount
// past 65,536 chunks read since its last refresh), every identity asks the
// store again and names the new versions, and the next sample must be
// filled with the new mask and the new values, never the memoized or
// cached old ones under the new identity. zarr-python writes and rewrites
// the store.
func TestStaticMemoPastTheLazyVersions(t *testing.T) {
	testenv.Python(t, "numpy", "zarr")
	dir := filepath.Join(t.TempDir(), "s.zarr")
	run := func(op string) {
		if out, err := exec.Command("python3", "-c", memoStorePy, op, dir).CombinedOutput(); err != nil {
			t.Fatalf("zarr-python %s: %v\n%s", op, err, out)
		}
	}
	run("create")
	h := viewtest.OpenStore(t, dir, zarr.Options{LazyVersions: -1})
	defer h.Close()
	l, views := buildViews(t, h, "views:\n  - name: v\n    channels:\n      - var: t\n      - var: lsm\n", layout.Options{})
	if memo, keep := views[0].Static(nil); memo == nil && keep == nil {
		t.Fatal("the view memoizes no static channel: the test proves nothing")
	}
	c, err := cache.Open(cache.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := newFiller(t, Options{Cache: c})
	fill := func(k int) []float32 {
		t.Helper()
		b := mustDir(t, l, "v").SampleEntry(int64(k)).Blob
		bk, _, err := f.Open(context.Background(), l, b)
		if err != nil {
			t.Fatal(err)
		}
		defer bk.Close()
		data := make([]byte, b.Size()-l.Align())
		if _, err := bk.File().ReadAt(data, l.Align()); err != nil {
			t.Fatal(err)
		}
		vs := make([]float32, len(data)/4)
		for i := range vs {
			vs[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		return vs
	}
	mask := func(i int, inverted bool) float32 {
		m := float32((i/8 + i%8) % 2)
		if inverted {
			return 1 - m
		}
		return m
	}
	check := func(k int, vs []float32, rewritten bool) {
		t.Helper()
		add := float32(0)
		if rewritten {
			add = 1000
		}
		for i := range 64 {
			if want := float32(k*100+i) + add; vs[i] != want {
				t.Fatalf("sample %d, t[%d] = %v, want %v (rewritten %v)", k, i, vs[i], want, rewritten)
			}
			if want := mask(i, rewritten); vs[64+i] != want {
				t.Fatalf("sample %d, lsm[%d] = %v, want %v (rewritten %v): the mask served from before the rewrite", k, i, vs[64+i], want, rewritten)
			}
		}
	}
	check(0, fill(0), false)
	lst := h.Array("lsm").Listing()
	run("rewrite")
	check(1, fill(1), true)
	if h.Array("lsm").Listing() != lst {
		t.Error("lsm was listed again: the memo's listing told the rewrite, not its versions")
	}
}
