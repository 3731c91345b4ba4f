#!/usr/bin/env python3
"""Write the ERA5-like store of the GPU runs, and its 21-channel training view.

Usage: make_store.py OUTDIR [--steps 96] [--unique 24] [--jobs N] [--codecs mixed|blosc]

OUTDIR/era5.zarr is a Zarr v3 group shaped like the public ERA5 copies:
  t, z, u, v   float32 (time, level=4, 721, 1440), chunks of one step (16.6 MB), bytes + zstd level 3
  t2m, u10, v10, msl  float32 (time, 721, 1440), chunks of one step (4.2 MB), blosc lz4 + byte shuffle
  sst          float32 (time, 721, 1440), chunks of 4 steps (16.6 MB), blosc lz4 + byte shuffle: a chunk
               of several steps, of which a sample takes one (not in the view)
  lsm          float32 (721, 1440), static, zstd
  time, level, latitude, longitude  coordinates
With --codecs blosc every variable is blosc lz4 + byte shuffle instead (zarr 2's default, as ARCO-ERA5
and WeatherBench2 are written), and lsm zstd with a content checksum: every chunk of that store is one
the GPU may decode without --gpu-trust-unchecked. The mixed store's zstd frames have no checksum
(numcodecs' default).
OUTDIR/train.yaml is the view stacking 4 x 4 levels + 4 surface fields + lsm = 21 channels, 87 MB a
sample as float32. Values look like reanalysis fields quantised as ERA5's 16-bit GRIB packing does,
so they compress as real data does. The first --unique steps are encoded; later steps are byte
copies of them (each its own file), since encoding is far slower than decoding.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil

import numcodecs
import numpy as np

NLAT, NLON, NLEV = 721, 1440, 4  # --lat/--lon make smaller fields for runs on CPUs
LEVELS = [1000, 850, 500, 250]
UPPER = {"t": (250.0, 30.0), "z": (50000.0, 2000.0), "u": (0.0, 15.0), "v": (0.0, 12.0)}
SURFACE = {"t2m": (288.0, 15.0), "u10": (0.0, 8.0), "v10": (0.0, 7.0), "msl": (101325.0, 1500.0)}
STEPPED = {"sst": (290.0, 10.0)}  # chunks of STEPS time steps
STEPS = 4
ZSTD = {"name": "zstd", "configuration": {"level": 3, "checksum": False}}
ZSTD_SUM = {"name": "zstd", "configuration": {"level": 3, "checksum": True}}
BLOSC = {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0}}


def quantise(f):
    lo, hi = float(f.min()), float(f.max())
    scale = 2.0 ** math.ceil(math.log2(max(hi - lo, 1e-30) / 65535))
    k = np.rint((f - np.float32(lo)) / np.float32(scale)).astype(np.float32)
    return (np.float32(lo) + k * np.float32(scale)).astype(np.float32)


def field(t, seed, base, amp):
    lat = np.deg2rad(np.linspace(90, -90, NLAT, dtype=np.float32))[:, None]
    lon = np.deg2rad(np.linspace(0, 360, NLON, endpoint=False, dtype=np.float32))[None, :]
    rng = np.random.default_rng(seed * 1000 + t)
    coarse = rng.standard_normal((NLAT // 16 + 2, NLON // 16 + 2)).astype(np.float32)  # upsampled below
    noise = np.kron(coarse, np.ones((16, 16), np.float32))[:NLAT, :NLON]
    f = base + amp * (np.cos(lat) * np.sin(lon * (2 + seed % 3) + 0.3 * t) + 0.3 * np.sin(3 * lat + seed) + 0.05 * noise)
    return quantise(f.astype(np.float32))


def meta(shape, chunks, dims, codec, attrs, dtype="float32", fill="NaN"):
    return {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": fill, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}] + ([codec] if codec else []),
            "dimension_names": dims, "attributes": attrs}


def write_json(p, d):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        json.dump(d, f)


CODECS = "mixed"


def blosc():
    return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)


def encode(args):
    store, name, t = args
    if name in STEPPED:
        base, amp = STEPPED[name]  # t is the chunk's index
        arr = np.stack([field(STEPS * t + k, hash(name) % 97, base, amp) for k in range(STEPS)])
        blob = blosc().encode(np.ascontiguousarray(arr))
        path = os.path.join(store, name, "c", str(t), "0", "0")
    elif name in UPPER:
        base, amp = UPPER[name]
        arr = np.stack([field(t, hash(name) % 97 + k, base * (1 - 0.1 * k), amp) for k in range(NLEV)])
        enc = numcodecs.Zstd(level=3) if CODECS == "mixed" else blosc()
        blob = enc.encode(np.ascontiguousarray(arr))
        path = os.path.join(store, name, "c", str(t), "0", "0", "0")
    else:
        base, amp = SURFACE[name]
        blob = blosc().encode(field(t, hash(name) % 97, base, amp))
        path = os.path.join(store, name, "c", str(t), "0", "0")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(blob)
    return len(blob)


def copy(args):
    store, name, t, unique = args
    tail = ["0", "0", "0"] if name in UPPER else ["0", "0"]
    src = os.path.join(store, name, "c", str(t % unique), *tail)
    dst = os.path.join(store, name, "c", str(t), *tail)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)
    return os.path.getsize(dst)


def main():
    global NLAT, NLON, CODECS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--unique", type=int, default=24)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--lat", type=int, default=NLAT)
    ap.add_argument("--lon", type=int, default=NLON)
    ap.add_argument("--codecs", choices=["mixed", "blosc"], default="mixed")
    a = ap.parse_args()
    NLAT, NLON, CODECS = a.lat, a.lon, a.codecs
    store = os.path.join(a.outdir, "era5.zarr")
    done = os.path.join(store, ".complete")
    # The marker names the layout too: stores from before the blosc store's
    # lsm had a checksum are written again.
    marker = f"{a.steps} {NLAT} {NLON} {CODECS} lsm-sum sst"
    if os.path.exists(done) and open(done).read() == marker:
        print(f"{store}: up to date ({a.steps} steps)")
        return
    shutil.rmtree(store, ignore_errors=True)
    write_json(os.path.join(store, "zarr.json"), {"zarr_format": 3, "node_type": "group", "attributes": {"title": "ERA5-like"}})
    for n in UPPER:
        write_json(os.path.join(store, n, "zarr.json"), meta([a.steps, NLEV, NLAT, NLON], [1, NLEV, NLAT, NLON],
                                                            ["time", "level", "latitude", "longitude"], ZSTD if CODECS == "mixed" else BLOSC, {"long_name": n}))
    for n in SURFACE:
        write_json(os.path.join(store, n, "zarr.json"), meta([a.steps, NLAT, NLON], [1, NLAT, NLON],
                                                            ["time", "latitude", "longitude"], BLOSC, {"long_name": n}))
    lsm_sum = CODECS == "blosc"
    for n in STEPPED:
        write_json(os.path.join(store, n, "zarr.json"), meta([a.steps, NLAT, NLON], [STEPS, NLAT, NLON],
                                                            ["time", "latitude", "longitude"], BLOSC, {"long_name": n}))
    write_json(os.path.join(store, "lsm", "zarr.json"), meta([NLAT, NLON], [NLAT, NLON], ["latitude", "longitude"],
                                                             ZSTD_SUM if lsm_sum else ZSTD, {"long_name": "land-sea mask"}))
    lsm = (field(0, 5, 0.0, 1.0) > 0.2).astype(np.float32)
    os.makedirs(os.path.join(store, "lsm", "c", "0"), exist_ok=True)
    with open(os.path.join(store, "lsm", "c", "0", "0"), "wb") as f:
        f.write(numcodecs.Zstd(level=3, checksum=lsm_sum).encode(lsm))
    coords = {"time": ("int64", np.arange(a.steps, dtype="<i8") * 6 + 700000, {"units": "hours since 1940-01-01"}),
              "level": ("int64", np.array(LEVELS, dtype="<i8"), {"units": "hPa"}),
              "latitude": ("float32", np.linspace(90, -90, NLAT, dtype="<f4"), {"units": "degrees_north"}),
              "longitude": ("float32", np.linspace(0, 360, NLON, endpoint=False, dtype="<f4"), {"units": "degrees_east"})}
    for n, (dt, v, attrs) in coords.items():
        write_json(os.path.join(store, n, "zarr.json"), meta([len(v)], [len(v)], [n], None, attrs, dtype=dt, fill=0))
        os.makedirs(os.path.join(store, n, "c"), exist_ok=True)
        with open(os.path.join(store, n, "c", "0"), "wb") as f:
            f.write(v.tobytes())
    unique = min(a.unique, a.steps)
    names = list(UPPER) + list(SURFACE)
    with mp.get_context("fork").Pool(a.jobs) as pool:
        enc = sum(pool.imap_unordered(encode, [(store, n, t) for n in names for t in range(unique)]))
        cp = sum(pool.imap_unordered(copy, [(store, n, t, unique) for n in names for t in range(unique, a.steps)]))
        # A chunk of STEPS steps a file: the first unique // STEPS encoded.
        chunks, uc = -(-a.steps // STEPS), max(1, unique // STEPS)
        enc += sum(pool.imap_unordered(encode, [(store, n, c) for n in STEPPED for c in range(min(uc, chunks))]))
        cp += sum(pool.imap_unordered(copy, [(store, n, c, uc) for n in STEPPED for c in range(uc, chunks)]))
    # train.yaml selects every level with "all"; train-levels.yaml lists
    # them, for zarrfs versions from before "all".
    for name, sel in (("train.yaml", "all"), ("train-levels.yaml", str(list(range(NLEV))))):
        with open(os.path.join(a.outdir, name), "w") as f:
            f.write("views:\n  - name: train\n    dtype: float32\n    channels:\n")
            for n in UPPER:
                f.write(f"      - var: {n}\n        select: {{level: {sel}}}\n")
            for n in list(SURFACE) + ["lsm"]:
                f.write(f"      - var: {n}\n")
    with open(done, "w") as f:
        f.write(marker)
    print(f"{store}: {a.steps} steps, {(enc + cp * 1.0) / 1e9:.2f} GB compressed; view {a.outdir}/train.yaml (21 channels)")


if __name__ == "__main__":
    main()
