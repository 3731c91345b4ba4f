#!/usr/bin/env python3
"""Write the ERA5-like store and the 20-channel view of the view benchmark.

Usage: make_store.py OUTDIR [--steps 20]

OUTDIR/era5_views.zarr (Zarr v3, zarr-python, zstd level 3) holds, on a 721 x 1440 grid:
  t, u, v, z, q   float32 (time, level, latitude, longitude), 3 levels, chunks (10, 1, 721, 1440)
  t2m, u10, v10, msl   float32 (time, latitude, longitude), chunks (10, 721, 1440)
  lsm             float32 (latitude, longitude), static
  time, level, latitude, longitude   1-D coordinates
OUTDIR/train.yaml declares the view: 5 variables x 3 levels + 4 surface fields + lsm = 20
channels, float32. OUTDIR/channels.json lists the same channels for the xarray baseline.

Values are smooth fields that move a little per step, quantised like ERA5's 16-bit GRIB
packing, so chunks compress about as real ERA5 does (random bytes would not compress and
would turn the benchmark into a disk test). A store is reused when OUTDIR/.complete matches.
"""

import argparse
import json
import math
import os
import shutil

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

NLAT, NLON, TCHUNK = 721, 1440, 10
LEVELS = [850, 500, 250]
UPPER = {"t": (250, 30), "u": (0, 20), "v": (0, 15), "z": (50000, 3000), "q": (0.005, 0.004)}
SURFACE = {"t2m": (288, 25), "u10": (0, 8), "v10": (0, 8), "msl": (101325, 1500)}


def quantise(f):
    lo, hi = float(f.min()), float(f.max())
    scale = 2.0 ** math.ceil(math.log2(max(hi - lo, 1e-30) / 65535))
    return (np.float32(lo) + np.rint((f - np.float32(lo)) / np.float32(scale)).astype(np.float32) * np.float32(scale)).astype(np.float32)


def grid():
    lat = np.deg2rad(np.linspace(90, -90, NLAT, dtype=np.float32))[:, None]
    lon = np.deg2rad(np.linspace(0, 360, NLON, endpoint=False, dtype=np.float32))[None, :]
    return lat, lon


def fields(seed, base, amp, t0, n, noise):
    """n steps of a moving field: large-scale waves plus a fixed coarse noise pattern."""
    lat, lon = grid()
    out = np.empty((n, NLAT, NLON), np.float32)
    for i in range(n):
        t = t0 + i
        w = (np.cos(lat) * np.sin(3 * lon + 0.2 * t + seed) + 0.5 * np.sin(2 * lat) * np.cos(5 * lon - 0.1 * t)
             + 0.3 * np.sin(lat * (seed + 1)))
        out[i] = quantise((base + amp * (w + noise)).astype(np.float32))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    path = os.path.join(a.outdir, "era5_views.zarr")
    stamp = os.path.join(path, ".complete")
    params = json.dumps({"steps": a.steps, "version": 1})
    if os.path.exists(stamp) and open(stamp).read() == params:
        print(f"reusing {path}")
    else:
        shutil.rmtree(path, ignore_errors=True)
        rng = np.random.default_rng(3)
        coarse = rng.standard_normal((NLAT // 16 + 2, NLON // 16 + 2)).astype(np.float32)
        noise = 0.1 * np.kron(coarse, np.ones((16, 16), np.float32))[:NLAT, :NLON]
        g = zarr.open_group(path, mode="w", zarr_format=3)
        T = a.steps
        comp = ZstdCodec(level=3)
        seed = 0
        for name, (base, amp) in UPPER.items():
            arr = g.create_array(name, shape=(T, len(LEVELS), NLAT, NLON), chunks=(TCHUNK, 1, NLAT, NLON), dtype="float32",
                                 dimension_names=["time", "level", "latitude", "longitude"], compressors=comp, fill_value=np.nan)
            for li in range(len(LEVELS)):
                seed += 1
                for t0 in range(0, T, TCHUNK):
                    n = min(TCHUNK, T - t0)
                    arr[t0:t0 + n, li] = fields(seed, base, amp, t0, n, noise)
        for name, (base, amp) in SURFACE.items():
            seed += 1
            arr = g.create_array(name, shape=(T, NLAT, NLON), chunks=(TCHUNK, NLAT, NLON), dtype="float32",
                                 dimension_names=["time", "latitude", "longitude"], compressors=comp, fill_value=np.nan)
            for t0 in range(0, T, TCHUNK):
                n = min(TCHUNK, T - t0)
                arr[t0:t0 + n] = fields(seed, base, amp, t0, n, noise)
        lat, lon = grid()
        lsm = g.create_array("lsm", shape=(NLAT, NLON), chunks=(NLAT, NLON), dtype="float32",
                             dimension_names=["latitude", "longitude"], compressors=comp)
        lsm[:] = ((np.sin(3 * lon) * np.cos(2 * lat)) > 0.3).astype(np.float32)
        for name, v in {"time": np.arange(T, dtype="int64") * 3600, "level": np.array(LEVELS, dtype="int32"),
                        "latitude": np.linspace(90, -90, NLAT, dtype="float32"),
                        "longitude": np.linspace(0, 360, NLON, endpoint=False, dtype="float32")}.items():
            c = g.create_array(name, shape=v.shape, chunks=v.shape, dtype=v.dtype, dimension_names=[name])
            c[:] = v
        with open(stamp, "w") as f:
            f.write(params)
        print(f"wrote {path}")
    channels = [{"var": v, "level": l} for v in UPPER for l in LEVELS] + [{"var": v} for v in SURFACE] + [{"var": "lsm"}]
    with open(os.path.join(a.outdir, "channels.json"), "w") as f:
        json.dump(channels, f)
    lines = ["views:", "  - name: train", "    dtype: float32", "    channels:"]
    for v in UPPER:
        lines += [f"      - var: {v}", f"        select_values: {{level: {LEVELS}}}"]
    lines += [f"      - var: {v}" for v in SURFACE] + ["      - var: lsm"]
    with open(os.path.join(a.outdir, "train.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
