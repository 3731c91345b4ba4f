#!/usr/bin/env python3
"""Write Zarr stores with zarr-python, view files over them, and the samples every view must hold.

Usage: make_view_stores.py OUTDIR

For each store S and view V it writes OUTDIR/S.zarr, OUTDIR/S.yaml (all the store's views) and
OUTDIR/expect/S/V/K.bin: the raw C-order bytes of sample K, computed from zarr-python's own reads
as np.stack([selection of each channel]).astype(dtype). OUTDIR/manifest.json lists, per view, the
expected shape, descr, channels (var, per selected dim the index and coordinate value) and
sample_coords. The view test (view_zarrpy_test.go) mounts nothing: it builds the layout, fills
every view file and compares.
"""

import itertools
import json
import os
import sys

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, ShardingCodec, ZstdCodec

RNG = np.random.default_rng(11)


def field(shape, dtype, scale=100.0):
    """Smooth-ish values plus noise, in dtype."""
    x = RNG.standard_normal(shape) * scale
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.rint(x), info.min, info.max).astype(dtype)
    return x.astype(dtype)


def store_hourly(path):
    """v3, one time step per chunk; float32 t, float64 z, int16 u10, float32 static lsm."""
    g = zarr.open_group(path, mode="w", zarr_format=3)
    T, L, Y, X = 10, 3, 7, 9
    dims4 = ["time", "level", "latitude", "longitude"]
    a = g.create_array("t", shape=(T, L, Y, X), chunks=(1, 1, Y, X), dtype="float32", dimension_names=dims4, fill_value=np.nan)
    a[:] = field((T, L, Y, X), "float32") + 250
    a = g.create_array("z", shape=(T, L, Y, X), chunks=(1, 3, 4, X), dtype="float64", dimension_names=dims4,
                       compressors=BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"))
    a[:] = field((T, L, Y, X), "float64", 5000)
    a = g.create_array("u10", shape=(T, Y, X), chunks=(1, Y, X), dtype="int16", dimension_names=["time", "latitude", "longitude"])
    a[:] = field((T, Y, X), "int16", 3000)
    a = g.create_array("lsm", shape=(Y, X), chunks=(Y, X), dtype="float32", dimension_names=["latitude", "longitude"])
    a[:] = (RNG.random((Y, X)) > 0.6).astype("float32")
    coords(g, {"time": np.arange(T, dtype="int64") * 3600, "level": np.array([1000, 850, 500], dtype="int32"),
               "latitude": np.linspace(90, -90, Y, dtype="float32"), "longitude": np.linspace(0, 320, X, dtype="float32")})
    views = [
        {"name": "stack", "dtype": "float32", "channels": [
            {"var": "t", "select": {"level": [0, 2]}},
            {"var": "z", "select_values": {"level": [850]}},
            {"var": "u10"},
            {"var": "lsm"}]},
        {"name": "half", "dtype": "float16", "samples": {"start": 1, "stop": 9, "step": 3}, "channels": [
            {"var": "t", "select": {"level": [1]}},
            {"var": "z", "select": {"level": [2, 0]}},
            {"var": "u10"},
            {"var": "lsm"}]},
        {"name": "wide", "dtype": "float64", "samples": {"step": 4}, "channels": [
            {"var": "u10"},
            {"var": "t", "select_values": {"level": [500, 1000]}}]},
        {"name": "raw", "channels": [
            {"var": "t", "select": {"level": [2, 0]}},
            {"var": "lsm"}]},
    ]
    return views


def store_chunked(path):
    """v3, chunks of 4 time steps x 3 levels, a missing (fill) chunk, a sharded array,
    bool static mask, float32 level coordinate with a fractional value."""
    g = zarr.open_group(path, mode="w", zarr_format=3)
    T, L, Y, X = 13, 3, 8, 10
    dims4 = ["time", "level", "latitude", "longitude"]
    a = g.create_array("t", shape=(T, L, Y, X), chunks=(4, 3, Y, X), dtype="float32", dimension_names=dims4,
                       fill_value=np.nan, compressors=ZstdCodec(level=3))
    data = field((T, L, Y, X), "float32") + 250
    data[4:8] = np.nan  # a whole chunk of fill values: zarr-python does not write it
    a[:] = data
    a = g.create_array("q", shape=(T, L, Y, X), chunks=(4, 3, Y, X), shards=(4, 3, Y, X), dtype="float64",
                       dimension_names=dims4, fill_value=0.0)
    a[:] = field((T, L, Y, X), "float64", 0.01)
    a = g.create_array("u10", shape=(T, Y, X), chunks=(4, 3, 5), dtype="int16", dimension_names=["time", "latitude", "longitude"],
                       fill_value=-1)
    a[:] = field((T, Y, X), "int16", 20000)
    a = g.create_array("lsm", shape=(Y, X), chunks=(4, 5), dtype="bool", dimension_names=["latitude", "longitude"])
    a[:] = RNG.random((Y, X)) > 0.5
    coords(g, {"time": np.arange(T, dtype="float64") * 0.25, "level": np.array([1000, 925.5, 850], dtype="float32")})
    views = [
        {"name": "train", "dtype": "float32", "channels": [
            {"var": "t", "select": {"level": [0, 2]}},
            {"var": "t", "select_values": {"level": [925.5]}},
            {"var": "q", "select": {"level": [1]}},
            {"var": "u10"},
            {"var": "lsm"}]},
        {"name": "train16", "dtype": "float16", "samples": {"start": 2, "stop": 13, "step": 2}, "channels": [
            {"var": "q", "select_values": {"level": [850, 1000]}},
            {"var": "t", "select": {"level": [1]}},
            {"var": "lsm"}]},
        {"name": "ints", "channels": [{"var": "u10"}]},
        {"name": "ints64", "dtype": "float64", "channels": [{"var": "u10"}, {"var": "lsm"}]},
    ]
    return views


def store_v2(path):
    """Zarr v2: big-endian float64, F order, int16 coordinate, sample dimension not first."""
    g = zarr.open_group(path, mode="w", zarr_format=2)
    Y, T, X = 6, 5, 4
    a = g.create_array("sst", shape=(Y, T, X), chunks=(3, 2, X), dtype=">f8", order="F",
                       compressors=None, fill_value=np.nan, attributes={"_ARRAY_DIMENSIONS": ["y", "time", "x"]})
    a[:] = field((Y, T, X), ">f8")
    a = g.create_array("mask", shape=(Y, X), chunks=(Y, X), dtype="<i2", attributes={"_ARRAY_DIMENSIONS": ["y", "x"]})
    a[:] = field((Y, X), "<i2", 10)
    c = g.create_array("time", shape=(T,), chunks=(T,), dtype="<i2", attributes={"_ARRAY_DIMENSIONS": ["time"]})
    c[:] = np.arange(T, dtype="<i2") * 6
    views = [{"name": "ocean", "dtype": "float32", "channels": [{"var": "sst"}, {"var": "mask"}]}]
    return views


def coords(g, values):
    for name, v in values.items():
        a = g.create_array(name, shape=v.shape, chunks=v.shape, dtype=v.dtype, dimension_names=[name])
        a[:] = v


def dims_of(a):
    if a.metadata.zarr_format == 3:
        return list(a.metadata.dimension_names)
    return list(a.attrs["_ARRAY_DIMENSIONS"])


def jsonable(x):
    x = x.item() if hasattr(x, "item") else x
    if isinstance(x, float) and np.isnan(x):
        return "NaN"
    return x


def expected(g, view):
    """Samples of a view, from zarr-python reads: (sample list, channel descriptions, coords)."""
    sd = view.get("sample_dim", "time")
    plan = []  # (array, index template with None at the sample axis, description)
    for c in view["channels"]:
        a = g[c["var"]]
        dims = dims_of(a)
        sel = {d: list(ix) for d, ix in c.get("select", {}).items()}
        for d, vals in c.get("select_values", {}).items():
            coord = g[d][:]
            sel[d] = [int(np.flatnonzero(coord == np.asarray(v).astype(coord.dtype))[0]) for v in vals]
        sel_dims = [d for d in dims if d in sel]  # the product runs in the array's dimension order
        for combo in itertools.product(*[sel[d] for d in sel_dims]):
            chosen = dict(zip(sel_dims, combo))
            index = [chosen.get(d, slice(None)) for d in dims]
            desc = {"var": c["var"], "static": sd not in dims, "select": {
                d: {"index": i, "value": jsonable(g[d][i]) if d in g else None} for d, i in chosen.items()}}
            plan.append((a, index, dims.index(sd) if sd in dims else -1, desc))
    n_total = min(a.shape[ax] for a, _, ax, _ in plan if ax >= 0)
    s = view.get("samples", {})
    rng = range(s.get("start", 0), s.get("stop", n_total), s.get("step", 1))
    dtype = view.get("dtype")
    if dtype is None:
        dtype = plan[0][0].dtype.newbyteorder("<")
    samples = []
    for t in rng:
        chans = []
        for a, index, ax, _ in plan:
            ix = list(index)
            if ax >= 0:
                ix[ax] = t
            chans.append(np.asarray(a[tuple(ix)]))  # zarr-python's own read
        samples.append(np.stack(chans).astype(np.dtype(dtype).newbyteorder("<")))
    sample_coords = [jsonable(v) for v in g[sd][:][list(rng)]] if sd in g else None
    return samples, [p[3] for p in plan], sample_coords


def yaml_text(views):
    """Block-style YAML (no PyYAML needed)."""
    out = ["# written by make_view_stores.py", "views:"]
    for v in views:
        out.append(f"  - name: {v['name']}")
        for k in ("sample_dim", "dtype"):
            if k in v:
                out.append(f"    {k}: {v[k]}")
        if "samples" in v:
            out.append("    samples:")
            out += [f"      {k}: {x}" for k, x in v["samples"].items()]
        out.append("    channels:")
        for c in v["channels"]:
            out.append(f"      - var: {c['var']}")
            for k in ("select", "select_values"):
                if k in c:
                    out.append(f"        {k}:")
                    out += [f"          {d}: {json.dumps(x)}" for d, x in c[k].items()]
    return "\n".join(out) + "\n"


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    manifest = {}
    for name, make in (("hourly", store_hourly), ("chunked", store_chunked), ("v2", store_v2)):
        path = os.path.join(out, name + ".zarr")
        views = make(path)
        with open(os.path.join(out, name + ".yaml"), "w") as f:
            f.write(yaml_text(views))
        g = zarr.open_group(path, mode="r")
        manifest[name] = {}
        for v in views:
            samples, chans, sc = expected(g, v)
            d = os.path.join(out, "expect", name, v["name"])
            os.makedirs(d, exist_ok=True)
            for k, s in enumerate(samples):
                s.tofile(os.path.join(d, f"{k}.bin"))
            manifest[name][v["name"]] = {
                "files": len(samples), "sample_shape": list(samples[0].shape), "descr": samples[0].dtype.str,
                "channels": chans, "sample_coords": sc}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
