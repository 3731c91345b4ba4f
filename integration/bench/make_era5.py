#!/usr/bin/env python3
"""Write ERA5-like Zarr v3 stores for the decode benchmark.

Usage: make_era5.py OUTDIR [--gb 4] [--codecs zstd,blosc,gzip] [--jobs 2]

Each codec gets its own store OUTDIR/era5_CODEC.zarr: a group holding `t2m`, float32
(time, latitude, longitude) = (T, 721, 1440), one chunk per time step, and a `time` coordinate.
T is the smallest step count whose decoded size reaches --gb (10^9 bytes), so --gb 4 gives 964
steps of 4,152,960 bytes. The first --unique steps (96) are encoded; the rest are byte copies
of them, each its own file, because encoding (gzip above all) is far slower than decoding.

  zstd:  bytes + zstd level 3
  blosc: bytes + blosc lz4, clevel 5, byte shuffle, typesize 4
  gzip:  bytes + gzip level 5

The values look like a reanalysis 2 m temperature: a smooth large-scale field (latitude gradient,
land-sea-like pattern, waves) that moves a little from step to step, plus small noise, quantised
the way ERA5's GRIB 16-bit packing quantises it. Quantised smooth data compresses 2-4x like real
ERA5 chunks; random bytes would not compress and would make the benchmark about I/O instead.

Chunks are encoded with numcodecs (the same libraries zarr-python uses) and the metadata is
written directly, which is several times faster than going through zarr-python on two cores.
A store is complete once OUTDIR/era5_CODEC.zarr/.complete exists with the same parameters; a
complete store is reused, an incomplete one rewritten.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import time

import numcodecs
import numpy as np

NLAT, NLON = 721, 1440
STEP_BYTES = NLAT * NLON * 4
NBASE = 24  # base fields (one "day" of hours); steps reuse them with cheap perturbations

CODECS = {
    "zstd": ({"name": "zstd", "configuration": {"level": 3, "checksum": False}},
             lambda: numcodecs.Zstd(level=3)),
    "blosc": ({"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle",
                                                   "typesize": 4, "blocksize": 0}},
              lambda: numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=0)),
    "gzip": ({"name": "gzip", "configuration": {"level": 5}}, lambda: numcodecs.GZip(level=5)),
}


def base_fields(seed=7):
    rng = np.random.default_rng(seed)
    lat = np.linspace(90, -90, NLAT, dtype=np.float32)[:, None]
    lon = np.linspace(0, 360, NLON, endpoint=False, dtype=np.float32)[None, :]
    rlat, rlon = np.deg2rad(lat), np.deg2rad(lon)
    clim = 288 - 45 * np.sin(rlat) ** 2 - 8 * np.sin(rlat)  # warm tropics, cold poles
    land = (np.sin(3 * rlon) * np.cos(2 * rlat) + 0.6 * np.sin(5 * rlon + 1) * np.cos(3 * rlat)) > 0.3
    fields = []
    for h in range(NBASE):
        phase = 2 * np.pi * h / NBASE
        diurnal = 6 * land * np.cos(rlat) * np.cos(rlon - phase)
        waves = 4 * np.sin(4 * rlon + 0.3 * h) * np.cos(3 * rlat) + 2.5 * np.cos(7 * rlon - 0.2 * h) * np.sin(2 * rlat)
        # Spatially correlated weather noise: coarse random field, upsampled.
        coarse = rng.standard_normal((NLAT // 16 + 2, NLON // 16 + 2)).astype(np.float32)
        noise = np.kron(coarse, np.ones((16, 16), np.float32))[:NLAT, :NLON]
        fields.append((clim + diurnal + waves + 1.5 * noise).astype(np.float32))
    return np.stack(fields)


def quantise(f):
    # GRIB simple packing with 16 bits, as ERA5 is archived: value = ref + k * 2^E, so the low
    # mantissa bits carry little information, which is what makes real ERA5 float32 compress.
    lo, hi = float(f.min()), float(f.max())
    scale = 2.0 ** math.ceil(math.log2(max(hi - lo, 1e-30) / 65535))
    k = np.rint((f - np.float32(lo)) / np.float32(scale)).astype(np.float32)
    return (np.float32(lo) + k * np.float32(scale)).astype(np.float32)


_BASE = None


def step_field(t, rng_noise):
    b = _BASE[t % NBASE]
    day = t // NBASE
    f = np.roll(b, day % NLON, axis=1)  # the weather drifts east day by day
    f = f + np.float32(0.02 * math.sin(day / 5.0))
    f += rng_noise[(t * 7919) % rng_noise.shape[0]]
    return quantise(f)


def _init(base, noise):
    global _BASE, _NOISE
    _BASE, _NOISE = base, noise


def chunk_path(store, t):
    return os.path.join(store, "t2m", "c", str(t), "0", "0")


def _encode(args):
    store, codec, t0, t1 = args
    enc = CODECS[codec][1]()
    n = 0
    for t in range(t0, t1):
        blob = enc.encode(np.ascontiguousarray(step_field(t, _NOISE)))
        path = chunk_path(store, t)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(blob)
        n += len(blob)
    return n


def _copy(args):
    store, unique, t0, t1 = args
    n = 0
    for t in range(t0, t1):
        path = chunk_path(store, t)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # A real copy, not a link: every step is its own file on disk, read on its own.
        shutil.copyfile(chunk_path(store, t % unique), path)
        n += os.path.getsize(path)
    return n


def write_meta(store, steps, codec):
    os.makedirs(os.path.join(store, "t2m"), exist_ok=True)
    os.makedirs(os.path.join(store, "time", "c"), exist_ok=True)
    with open(os.path.join(store, "zarr.json"), "w") as f:
        json.dump({"zarr_format": 3, "node_type": "group",
                   "attributes": {"title": "ERA5-like benchmark data"}}, f, indent=2)
    meta = {
        "zarr_format": 3, "node_type": "array", "shape": [steps, NLAT, NLON], "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, NLAT, NLON]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": "NaN",
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, CODECS[codec][0]],
        "dimension_names": ["time", "latitude", "longitude"],
        "attributes": {"units": "K", "long_name": "2 metre temperature (synthetic)"},
    }
    with open(os.path.join(store, "t2m", "zarr.json"), "w") as f:
        json.dump(meta, f, indent=2)
    tmeta = {
        "zarr_format": 3, "node_type": "array", "shape": [steps], "data_type": "int64",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [steps]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "dimension_names": ["time"], "attributes": {"units": "hours since 1940-01-01"},
    }
    with open(os.path.join(store, "time", "zarr.json"), "w") as f:
        json.dump(tmeta, f, indent=2)
    hours = (np.arange(steps, dtype="<i8") + 700000)
    with open(os.path.join(store, "time", "c", "0"), "wb") as f:
        f.write(hours.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--gb", type=float, default=4.0, help="decoded size per store, 10^9 bytes")
    ap.add_argument("--codecs", default="zstd,blosc,gzip")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--unique", type=int, default=96,
                    help="distinct steps encoded; later steps are byte copies of step t %% unique "
                         "(encoding, gzip above all, is far slower than decoding on two cores)")
    args = ap.parse_args()
    steps = max(1, math.ceil(args.gb * 1e9 / STEP_BYTES))
    codecs = [c for c in args.codecs.split(",") if c]
    for c in codecs:
        if c not in CODECS:
            sys.exit(f"make_era5.py: unknown codec {c!r} (have {', '.join(CODECS)})")
    os.makedirs(args.outdir, exist_ok=True)
    base = noise = None
    for c in codecs:
        store = os.path.join(args.outdir, f"era5_{c}.zarr")
        unique = max(1, min(steps, args.unique))
        params = {"steps": steps, "unique": unique, "shape": [steps, NLAT, NLON], "codec": CODECS[c][0],
                  "version": 2}
        done = os.path.join(store, ".complete")
        if os.path.exists(done):
            with open(done) as f:
                if json.load(f) == params:
                    print(f"{store}: up to date ({steps} steps)", flush=True)
                    continue
        if base is None:
            t0 = time.time()
            base = base_fields()
            noise = (np.random.default_rng(11).standard_normal((13, NLAT, NLON)) * 0.02).astype(np.float32)
            print(f"base fields in {time.time() - t0:.1f}s", flush=True)
        shutil.rmtree(store, ignore_errors=True)
        t0 = time.time()
        write_meta(store, steps, c)
        per = max(1, unique // (args.jobs * 4))
        work = [(store, c, s, min(unique, s + per)) for s in range(0, unique, per)]
        with mp.get_context("fork").Pool(args.jobs, initializer=_init, initargs=(base, noise)) as pool:
            nbytes = sum(pool.imap_unordered(_encode, work))
            per = max(1, steps // (args.jobs * 16))
            work = [(store, unique, s, min(steps, s + per)) for s in range(unique, steps, per)]
            nbytes += sum(pool.imap_unordered(_copy, work))
        with open(done, "w") as f:
            json.dump(params, f)
        dec = steps * STEP_BYTES
        print(f"{store}: {steps} steps, {dec / 1e9:.2f} GB decoded, {nbytes / 1e9:.2f} GB stored "
              f"(ratio {dec / nbytes:.2f}) in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
