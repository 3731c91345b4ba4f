#!/usr/bin/env python3
"""Read a view's samples the way a zarr-python or tensorstore user would.

The peer of `zarrfs warm --view V.yaml`: for every time step, each channel
of the view (a variable, with `select_values` by coordinate value where the
view has them) is read into memory from the same store, and the channels
are stacked into one float32 sample. zarr-python (through gcsfs) and
tensorstore (its own GCS driver) read and decode whole chunks.

    read_view.py --reader zarr|tensorstore --bucket B --path P \
        --endpoint URL --view V.yaml [--steps N]

prints one JSON line: the reader, samples read, seconds, samples/s.
"""
import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import yaml


def channels_of(view_file):
    spec = yaml.safe_load(open(view_file))
    return spec["views"][0]["channels"]


def open_zarr(a):
    # gcsfs would first ask, over gRPC, whether the bucket is hierarchical,
    # which an emulator does not answer (a minute's timeout per bucket).
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs
    import zarr
    from zarr.storage import FsspecStore

    fs = gcsfs.GCSFileSystem(endpoint_url=a.endpoint, token="anon", asynchronous=True)
    store = FsspecStore(fs, path=f"{a.bucket}/{a.path}", read_only=True)
    g = zarr.open_consolidated(store, mode="r")

    def array(name):
        return g[name]

    def read(arr, sel):
        return np.asarray(arr.oindex[sel])

    return array, read


def open_tensorstore(a):
    import tensorstore as ts

    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", a.endpoint)
    ctx = ts.Context()

    def array(name):
        spec = {"driver": "zarr", "kvstore": {"driver": "gcs", "bucket": a.bucket, "path": f"{a.path}/{name}/"}}
        return ts.open(spec, read=True, context=ctx).result()

    def read(arr, sel):
        return arr.oindex[sel].read().result()

    return array, read


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reader", choices=["zarr", "tensorstore"], required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--endpoint", required=True)
    p.add_argument("--view", required=True)
    p.add_argument("--steps", type=int, default=0)
    a = p.parse_args()
    array, read = (open_zarr if a.reader == "zarr" else open_tensorstore)(a)
    chans = channels_of(a.view)
    levels = np.asarray(read(array("level"), (slice(None),)))
    arrays = {c["var"]: array(c["var"]) for c in chans}
    steps = a.steps or arrays[chans[0]["var"]].shape[0]
    plan = []  # (array, selection builder, channels it gives)
    for c in chans:
        arr = arrays[c["var"]]
        sel = c.get("select_values", {}).get("level")
        if sel is not None:
            idx = [int(np.nonzero(levels == v)[0][0]) for v in sel]
            plan.append((arr, lambda t, idx=idx: (t, idx, slice(None), slice(None))))
        elif arr.ndim == 3:
            plan.append((arr, lambda t: (t, slice(None), slice(None))))
        else:  # a static field, the same in every sample
            plan.append((arr, lambda t: (slice(None), slice(None))))
    pool = ThreadPoolExecutor(len(plan))
    start = time.perf_counter()
    nbytes = 0
    for t in range(steps):
        parts = list(pool.map(lambda pa: read(pa[0], pa[1](t)), plan))
        sample = np.concatenate([np.asarray(x, dtype=np.float32).reshape(-1, *x.shape[-2:]) for x in parts])
        nbytes += sample.nbytes
    secs = time.perf_counter() - start
    print(json.dumps({"reader": a.reader, "samples": steps, "channels": int(sample.shape[0]),
                      "seconds": secs, "samples_per_s": steps / secs, "bytes": nbytes}))


if __name__ == "__main__":
    sys.exit(main())
