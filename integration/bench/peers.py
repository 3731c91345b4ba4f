#!/usr/bin/env python3
"""Time the peer readers on one benchmark store; print one JSON line per measurement.

Usage: peers.py STORE [--array t2m] [--reader zarr-python|tensorstore] [--mode MODE] [--batch N]
                      [--steps N]

Modes (each a full pass over the time steps, one process per reader so peak RSS is its own):
  zarr-python  step    zarr.open(STORE)[ARRAY][t] for every t, default async concurrency
  zarr-python  batch   [t:t+N] slabs
  tensorstore  step    ts.open(...) then arr[t].read().result() for every t
  tensorstore  batch   arr[t:t+N].read().result()
  tensorstore  whole   arr.read().result() once

Output fields: reader, mode, store, array, steps, bytes (decoded), seconds, gbps (10^9 bytes/s),
peak_rss_bytes (ru_maxrss), sha256_step0 (of step 0 as little-endian bytes, to check that every
reader decodes the same values).
"""

import argparse
import hashlib
import json
import os
import resource
import sys
import time

import numpy as np


def sha0(x):
    return hashlib.sha256(np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<")).tobytes()).hexdigest()


def run_zarr(store, array, mode, batch, steps):
    import zarr

    a = zarr.open(store, mode="r")[array]
    n = min(steps or a.shape[0], a.shape[0])
    step0 = sha0(a[0])
    nbytes = 0
    t0 = time.perf_counter()
    if mode == "step":
        for t in range(n):
            nbytes += a[t].nbytes
    elif mode == "batch":
        for t in range(0, n, batch):
            nbytes += a[t:min(n, t + batch)].nbytes
    else:
        raise SystemExit(f"peers.py: zarr-python has no mode {mode!r}")
    return n, nbytes, time.perf_counter() - t0, step0


def run_tensorstore(store, array, mode, batch, steps):
    import tensorstore as ts

    with open(os.path.join(store, "zarr.json")) as f:
        fmt = json.load(f).get("zarr_format", 3)
    spec = {
        "driver": "zarr3" if fmt == 3 else "zarr",
        "kvstore": {"driver": "file", "path": os.path.join(os.path.abspath(store), array)},
    }
    a = ts.open(spec, read=True).result()
    n = min(steps or a.shape[0], a.shape[0])
    step0 = sha0(a[0].read().result())
    nbytes = 0
    t0 = time.perf_counter()
    if mode == "step":
        for t in range(n):
            nbytes += a[t].read().result().nbytes
    elif mode == "batch":
        for t in range(0, n, batch):
            nbytes += a[t:min(n, t + batch)].read().result().nbytes
    elif mode == "whole":
        nbytes += a[:n].read().result().nbytes
    else:
        raise SystemExit(f"peers.py: tensorstore has no mode {mode!r}")
    return n, nbytes, time.perf_counter() - t0, step0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--array", default="t2m")
    ap.add_argument("--reader", choices=["zarr-python", "tensorstore"], default="zarr-python")
    ap.add_argument("--mode", default="step")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=0, help="read only the first N steps (0: all)")
    args = ap.parse_args()
    fn = run_zarr if args.reader == "zarr-python" else run_tensorstore
    n, nbytes, secs, step0 = fn(args.store, args.array, args.mode, args.batch, args.steps)
    out = {
        "reader": args.reader,
        "mode": args.mode if args.mode != "batch" else f"batch{args.batch}",
        "store": os.path.basename(os.path.normpath(args.store)),
        "array": args.array,
        "steps": n,
        "bytes": nbytes,
        "seconds": round(secs, 4),
        "gbps": round(nbytes / secs / 1e9, 4),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "sha256_step0": step0,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
