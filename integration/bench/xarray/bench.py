"""xarray through a zarrfs mount (engine="zarrfs") against xr.open_zarr on the source, same run.

Writes (once) a store with zarr-python: `x` of (time=N, 4, 8) float32 in
chunks of 1,000 steps, CF time coordinate, consolidated metadata. Then, each
REPEAT times: the time to open (`xr.open_dataset(MOUNT, engine="zarrfs")`
on a fresh mount, whose coordinate files are decoded then, and again,
against `xr.open_zarr(SOURCE)`), and a full read of `x` (`.values`) through a
fresh mount with an empty cache (cold: every sample is decoded and written
to the cache on first open), again through the same mount (warm), and with
open_zarr. Prints medians and the ratios against open_zarr.

    python3 integration/bench/xarray/bench.py [--samples 100000] [--shape 4,8] [--repeat 3] [--dir DIR]
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings

import numpy as np
import xarray as xr
import zarr

import zarrfs


def make_store(path, n, shape, chunk):
    if os.path.exists(os.path.join(path, "zarr.json")):
        return
    shutil.rmtree(path, ignore_errors=True)
    g = zarr.open_group(path, mode="w")
    t = g.create_array("time", shape=(n,), chunks=(n,), dtype="i8", dimension_names=["time"],
                       attributes={"units": "hours since 1979-01-01"})
    t[:] = np.arange(n)
    dims = ["time"] + [f"d{i}" for i in range(len(shape))]
    x = g.create_array("x", shape=(n,) + shape, chunks=(chunk,) + shape, dtype="f4", dimension_names=dims)
    step = max(1, 64 * 2**20 // (int(np.prod(shape)) * 4))
    rng = np.random.default_rng(0)
    for i in range(0, n, step):
        j = min(n, i + step)
        x[i:j] = rng.standard_normal((j - i,) + shape, dtype=np.float32)
    zarr.consolidate_metadata(path)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--shape", default="4,8", help="sample shape, comma-separated")
    ap.add_argument("--chunk", type=int, default=1000, help="time steps per source chunk")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=".cache/bench/xarray")
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    os.makedirs(args.dir, exist_ok=True)
    src = os.path.abspath(os.path.join(args.dir, f"x{args.samples}_{'x'.join(map(str, shape))}.zarr"))
    make_store(src, args.samples, shape, args.chunk)
    for root, _, files in os.walk(src):  # into the page cache, for both readers
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                fh.read()
    warnings.simplefilter("ignore", RuntimeWarning)
    print(f"== {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; store {src}: "
          f"x {(args.samples,) + shape} float32, chunks of {args.chunk} steps", flush=True)

    xr.open_zarr(src).x.isel(time=0).values  # imports and first-use costs, for neither side
    res = {k: [] for k in ("open_cold", "open_warm", "open_zarr", "read_cold", "read_warm", "read_zarr")}
    for r in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="zarrfs-bench-") as tmp:
            with zarrfs.Mount(src, os.path.join(tmp, "mnt"), cache=os.path.join(tmp, "cache")) as m:
                # The first open of a fresh mount decodes the coordinate
                # arrays (time.npy); later opens find them in the cache.
                dt, ds = timed(lambda: xr.open_dataset(m.path, engine="zarrfs"))
                res["open_cold"].append(dt)
                dt, ds = timed(lambda: xr.open_dataset(m.path, engine="zarrfs"))
                res["open_warm"].append(dt)
                dt, zs = timed(lambda: xr.open_zarr(src))
                res["open_zarr"].append(dt)
                dt, a = timed(lambda: ds.x.values)
                res["read_cold"].append(dt)
                dt, b = timed(lambda: xr.open_dataset(m.path, engine="zarrfs").x.values)
                res["read_warm"].append(dt)
                dt, c = timed(lambda: xr.open_zarr(src).x.values)
                res["read_zarr"].append(dt)
                assert np.array_equal(a, c) and np.array_equal(b, c)
                assert np.array_equal(ds.time.values, zs.time.values)
        print(f"run {r}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in res.items()), flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print("| measure | zarrfs engine | xr.open_zarr | zarrfs / open_zarr |")
    print("|---|---|---|---|")
    print(f"| open, fresh mount | {med['open_cold']:.4f} s | {med['open_zarr']:.4f} s | "
          f"{med['open_cold'] / med['open_zarr']:.2f}x |")
    print(f"| open again | {med['open_warm']:.4f} s | {med['open_zarr']:.4f} s | "
          f"{med['open_warm'] / med['open_zarr']:.2f}x |")
    print(f"| full read of x, cold mount | {med['read_cold']:.2f} s | {med['read_zarr']:.2f} s | "
          f"{med['read_cold'] / med['read_zarr']:.2f}x |")
    print(f"| full read of x, warm mount | {med['read_warm']:.2f} s | {med['read_zarr']:.2f} s | "
          f"{med['read_warm'] / med['read_zarr']:.2f}x |")


if __name__ == "__main__":
    main()
