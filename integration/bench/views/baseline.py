#!/usr/bin/env python3
"""xarray + zarr-python baseline of the view benchmark: assemble each (20, 721, 1440) sample
the way a plain training loader does, one xarray selection per sample.

Usage: baseline.py STORE CHANNELS_JSON N [--dump FILE]

Prints one JSON line: {"reader": "xarray+zarr-python", "samples": N, "seconds": S, "bytes": B}.
--dump writes sample 0's raw float32 bytes, which the Go side compares with its own file.
"""

import argparse
import json
import time

import numpy as np
import xarray as xr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("channels")
    ap.add_argument("n", type=int)
    ap.add_argument("--dump")
    a = ap.parse_args()
    chans = json.load(open(a.channels))
    upper, levels, surface, static = [], [], [], []
    for c in chans:
        if "level" in c:
            if c["var"] not in upper:
                upper.append(c["var"])
            if c["level"] not in levels:
                levels.append(c["level"])
        elif c["var"] == "lsm":
            static.append(c["var"])
        else:
            surface.append(c["var"])
    # chunks=None: no dask, every read goes straight to zarr-python.
    ds = xr.open_zarr(a.store, chunks=None, consolidated=False)
    total = 0
    t0 = time.perf_counter()
    for k in range(a.n):
        up = ds[upper].isel(time=k).sel(level=levels).to_array().values  # (vars, levels, H, W)
        sf = ds[surface].isel(time=k).to_array().values
        st = ds[static].to_array().values
        sample = np.concatenate([up.reshape(-1, *up.shape[-2:]), sf, st]).astype(np.float32)
        total += sample.nbytes
        if k == 0 and a.dump:
            sample.tofile(a.dump)
    dt = time.perf_counter() - t0
    print(json.dumps({"reader": "xarray+zarr-python", "samples": a.n, "seconds": dt, "bytes": total}))


if __name__ == "__main__":
    main()
