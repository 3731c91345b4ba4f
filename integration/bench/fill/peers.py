#!/usr/bin/env python3
"""Read every array a view uses into RAM with a peer reader; print one JSON line.

Usage: peers.py STORE VIEW.yaml --reader zarr-python|zarrs|tensorstore [--samples N]

Each array the view's channels name is read whole along its sample dimension
(the first N samples; static arrays once), one call per array, as a job that
rechunks a store into training samples would: zarr-python 3 with its default
pipeline, zarr-python 3 with the zarrs codec pipeline (pip install zarrs), and
tensorstore. Output: reader, bytes (decoded), seconds, gbps (10^9 bytes/s),
peak_rss_bytes, and a sha256 of every array's first sample, so that runs can
be checked to read the same values.
"""

import argparse
import hashlib
import json
import os
import resource
import time

import numpy as np
import yaml


def arrays_of(view_file):
    with open(view_file) as f:
        spec = yaml.safe_load(f)
    names = []
    for v in spec["views"]:
        for ch in v["channels"]:
            if ch["var"] not in names:
                names.append(ch["var"])
    return names


def first(x):
    x = np.asarray(x)
    return hashlib.sha256(np.ascontiguousarray(x[0] if x.ndim > 2 else x).tobytes()).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("view")
    ap.add_argument("--reader", choices=["zarr-python", "zarrs", "tensorstore"], required=True)
    ap.add_argument("--samples", type=int, default=0, help="read only the first N samples (0: all)")
    a = ap.parse_args()
    names = arrays_of(a.view)
    store = os.path.abspath(a.store)
    opened = []
    if a.reader == "tensorstore":
        import tensorstore as ts

        with open(os.path.join(store, "zarr.json")) as f:
            fmt = json.load(f).get("zarr_format", 3)
        for n in names:
            spec = {"driver": "zarr3" if fmt == 3 else "zarr", "kvstore": {"driver": "file", "path": os.path.join(store, n)}}
            opened.append(ts.open(spec, read=True).result())
    else:
        import zarr

        if a.reader == "zarrs":
            import zarrs  # noqa: F401 (registers the pipeline)

            zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
        g = zarr.open_group(store, mode="r")
        opened = [g[n] for n in names]
    total, sums = 0, {}
    t0 = time.perf_counter()
    for n, arr in zip(names, opened):
        many = len(arr.shape) > 2
        stop = min(a.samples, arr.shape[0]) if a.samples and many else arr.shape[0]
        if a.reader == "tensorstore":
            x = arr[:stop].read().result() if many else arr.read().result()
        else:
            x = arr[:stop] if many else arr[...]
        total += x.nbytes
        sums[n] = first(x)
        del x
    secs = time.perf_counter() - t0
    print(json.dumps({"what": "peer", "reader": a.reader, "bytes": total, "seconds": round(secs, 4),
                      "gbps": round(total / secs / 1e9, 4),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "sha256_first": sums}), flush=True)


if __name__ == "__main__":
    main()
