#!/usr/bin/env python3
"""Compare every file of a zarrfs mount of a replica with zarr-python.

    check_mount.py STORE MOUNT [VIEW.yaml ...] [--sample-dim time]
                   [--samples N] [--rank R --world W]

STORE is the replica on disk (make_replica.py), read with zarr-python;
MOUNT is zarrfs's mount of the same store from wherever it was served.
Every array file (one per sample along the sample dimension, or the whole
array), every sidecar's shape, dtype, dims and attributes, and every
sample of every view of the YAML files (channels selected by index or by
coordinate value, static channels repeated, cast to the view's dtype) must
equal what zarr-python reads. --samples N checks only the first N samples
of each (benchmark-sized replicas). Prints one JSON line:
{"files": N, "bad": [...]}.
"""
import argparse
import json
import os
import sys

import numpy as np
import yaml
import zarr


def sample_names(n):
    width = len(str(n - 1)) if n > 1 else 1
    return [str(i).zfill(width) + ".npy" for i in range(n)]


def dims_of(arr):
    """Dimension names: v3 metadata's, or v2's _ARRAY_DIMENSIONS attribute."""
    names = getattr(arr.metadata, "dimension_names", None)
    if names is not None:
        return [n or "" for n in names]
    return list(arr.attrs.get("_ARRAY_DIMENSIONS", []))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("mount")
    p.add_argument("views", nargs="*")
    p.add_argument("--sample-dim", default="time")
    p.add_argument("--samples", type=int, default=0)
    a = p.parse_args()
    g = zarr.open_group(a.store, mode="r")
    bad, n = [], 0

    def check(f, want, what):
        nonlocal n
        try:
            got = np.load(f)
        except Exception as ex:
            bad.append(f"{f}: {ex!r}")
            return
        n += 1
        want = np.ascontiguousarray(want)
        if got.dtype != want.dtype.newbyteorder("<") or got.shape != want.shape:
            bad.append(f"{f}: {got.dtype} {got.shape}, want {want.dtype} {want.shape} ({what})")
        elif got.tobytes() != want.astype(want.dtype.newbyteorder("<")).tobytes():
            diff = np.argwhere(~((got == want) | (np.isnan(got) & np.isnan(want)) if got.dtype.kind == "f" else got == want))
            bad.append(f"{f}: {len(diff)} values differ from zarr-python ({what}), first at {diff[0].tolist() if len(diff) else '?'}")
        if os.path.getsize(f) != 4096 + got.nbytes:
            bad.append(f"{f}: size {os.path.getsize(f)}, want {4096 + got.nbytes}")

    for name, arr in sorted(g.arrays()):
        dims = dims_of(arr)
        side = json.load(open(os.path.join(a.mount, name + ".json")))
        if side["shape"] != list(arr.shape) or side["dims"] != dims or side["dtype"] != arr.dtype.newbyteorder("<").str:
            bad.append(f"{name}.json: shape {side['shape']} dims {side['dims']} dtype {side['dtype']}")
        want_attrs = {k: v for k, v in arr.attrs.items() if k != "_ARRAY_DIMENSIONS"}
        if side.get("attributes") != want_attrs:
            bad.append(f"{name}.json: attributes {side.get('attributes')}, want {want_attrs}")
        if len(dims) >= 2 and a.sample_dim in dims:
            ax = dims.index(a.sample_dim)
            count = arr.shape[ax]
            names = sample_names(count)
            listed = sorted(os.listdir(os.path.join(a.mount, name)))
            if listed != names:
                bad.append(f"{name}/ lists {listed[:3]}..., want {names[:3]}...")
            for i in range(min(count, a.samples or count)):
                sel = [slice(None)] * len(dims)
                sel[ax] = i
                check(os.path.join(a.mount, name, names[i]), arr[tuple(sel)], f"{name} sample {i}")
        else:
            check(os.path.join(a.mount, name + ".npy"), arr[...], name)

    for vf in a.views:
        for v in yaml.safe_load(open(vf))["views"]:
            sd = v.get("sample_dim", a.sample_dim)
            chans = []  # (array, dims, {dim: index}) per channel
            for ch in v["channels"]:
                arr = g[ch["var"]]
                dims = dims_of(arr)
                if "select" in ch:
                    (dim, idx), = ch["select"].items()
                    idxs = range(arr.shape[dims.index(dim)]) if idx == "all" else idx
                elif "select_values" in ch:
                    (dim, vals), = ch["select_values"].items()
                    coord = list(np.asarray(g[dim][...]))
                    idxs = [coord.index(x) for x in vals]
                else:
                    dim, idxs = None, [None]
                for i in idxs:
                    chans.append((arr, dims, {dim: i} if dim else {}))
            count = max(arr.shape[dims.index(sd)] for arr, dims, _ in chans if sd in dims)
            side = json.load(open(os.path.join(a.mount, v["name"] + ".json")))
            if side["kind"] != "view" or side["shape"][:2] != [count, len(chans)]:
                bad.append(f"{v['name']}.json: kind {side['kind']} shape {side['shape']}, want [{count}, {len(chans)}, ...]")
            names = sample_names(count)
            for k in range(min(count, a.samples or count)):
                planes = []
                for arr, dims, picks in chans:
                    sel = []
                    for d in dims:
                        if d == sd:
                            sel.append(k)
                        elif d in picks:
                            sel.append(picks[d])
                        else:
                            sel.append(slice(None))
                    planes.append(np.asarray(arr[tuple(sel)]).astype(v.get("dtype", "float32")))
                check(os.path.join(a.mount, v["name"], names[k]), np.stack(planes), f"view {v['name']} sample {k}")
    print(json.dumps({"files": n, "bad": bad[:50]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
