package integration

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/zarr/zarrtest"
)

// A view through the real mount and warm: numpy reads (C, H, W) samples
// equal to np.stack of zarr-python's reads, the sidecar lists the channels,
// warm with the same --view fills exactly those files, and the metrics
// endpoint counts the work.
func TestViewMountAndMetrics(t *testing.T) {
	requireMountTools(t)
	requirePython(t)
	src := exampleStore(t, zarrtest.Example{Times: 6, Levels: 3, Lat: 19, Lon: 36, TimeChunk: 4})
	view := filepath.Join(t.TempDir(), "train.yaml")
	os.WriteFile(view, []byte(`views:
  - name: train
    samples: {start: 1, stop: 6, step: 2}
    dtype: float16
    channels:
      - var: t
        select: {level: [0, 2]}
      - var: z
        select_values: {level: [850]}
      - var: u10
      - var: lsm
`), 0o644)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cacheDir := t.TempDir()
	d := mountAt(t, src, t.TempDir(), cacheDir, "--view", view, "--metrics", addr)
	out := python(t, `
import json, sys, numpy as np, zarr
mnt, src = sys.argv[1], sys.argv[2]
g = zarr.open_group(src, mode="r")
side = json.load(open(mnt + "/train.json"))
names = sorted(f for f in __import__("os").listdir(mnt + "/train"))
bad = []
if names != ["0.npy", "1.npy", "2.npy"]:
    bad.append(f"names {names}")
if side["kind"] != "view" or side["shape"][:2] != [3, 5] or side["dtype"] != "<f2":
    bad.append(f"sidecar {side['kind']} {side['shape']} {side['dtype']}")
if side.get("sample_coords") != [6, 18, 30]:
    bad.append(f"sample_coords {side.get('sample_coords')}")
for k, t in enumerate([1, 3, 5]):
    want = np.stack([g["t"][t, 0], g["t"][t, 2], g["z"][t, 1], g["u10"][t], g["lsm"][:]]).astype(np.float16)
    got = np.load(f"{mnt}/train/{k}.npy")
    if got.shape != want.shape or got.tobytes() != want.tobytes():
        bad.append(f"sample {k} differs")
print(json.dumps(bad))
`, d.mnt, src)
	if strings.TrimSpace(out) != "[]" {
		t.Fatalf("view check: %s", out)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "zarrfs_chunks_decoded_total") || strings.Contains(string(body), "zarrfs_chunks_decoded_total 0\n") {
		t.Errorf("metrics lack a non-zero decode counter:\n%.2000s", body)
	}
	d.stop(t)

	// warm with the same flags has nothing left to do for the view.
	out = warm(t, src, cacheDir, "--view", view, "--only", "train")
	if !strings.Contains(out, "nothing to do: 3 files") {
		t.Errorf("warm after the mount read the view:\n%s", out)
	}
}
