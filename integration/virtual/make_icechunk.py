"""Writes an Icechunk repository with the icechunk package, for the
virtual-store tests: python3 make_icechunk.py KERCHUNK_OUT REPO [commit]

Commit 1: group attributes; t(time, lat, lon) float32 native chunks
(zstd, written by zarr through icechunk); small (lat) int16 inline; x
virtual: the chunks of KERCHUNK_OUT/nc/f32.h5 (shuffle, gzip, fletcher32)
as VirtualiZarr finds them. Commit 2 appends two time steps to t. Tag v1
names commit 1. With "commit" as third argument, only one more commit is
made (t grows by one step), for a mount that follows the branch.
Prints "snapshot ID" for each commit.
"""
import os
import sys
import warnings

import icechunk as ic
import numpy as np
import zarr

warnings.simplefilter("ignore")
src, path = sys.argv[1], sys.argv[2]
more = len(sys.argv) > 3 and sys.argv[3] == "commit"
nc = os.path.abspath(os.path.join(src, "nc"))


def step(k):
    rng = np.random.default_rng(1000 + k)
    return rng.standard_normal((1, 12, 16)).astype("f4") * 10 + 280


config = ic.RepositoryConfig.default()
config.set_virtual_chunk_container(ic.VirtualChunkContainer("file://" + nc + "/", ic.local_filesystem_store(nc)))
storage = ic.local_filesystem_storage(path)
if more:
    repo = ic.Repository.open(storage, config=config)
    s = repo.writable_session("main")
    t = zarr.open_group(s.store)["t"]
    n = t.shape[0]
    t.resize((n + 1, 12, 16))
    t[n:] = step(n)
    print("snapshot", s.commit(f"append step {n}"))
    sys.exit(0)

repo = ic.Repository.create(storage, config=config)
s = repo.writable_session("main")
g = zarr.group(store=s.store, attributes={"title": "icechunk fixture"})
t = g.create_array("t", shape=(4, 12, 16), chunks=(1, 12, 16), dtype="f4", dimension_names=["time", "lat", "lon"])
t[:] = np.concatenate([step(k) for k in range(4)])
small = g.create_array("small", shape=(12,), chunks=(12,), dtype="i2", dimension_names=["lat"])
small[:] = np.arange(12, dtype="i2") * 3

from obstore.store import LocalStore
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser
from virtualizarr.registry import ObjectStoreRegistry

reg = ObjectStoreRegistry({"file://": LocalStore()})
vds = open_virtual_dataset("file://" + os.path.join(nc, "f32.h5"), registry=reg, parser=HDFParser())
vds.vz.to_icechunk(s.store, group="v")
first = s.commit("first")
print("snapshot", first)
repo.create_tag("v1", first)
s = repo.writable_session("main")
t = zarr.open_group(s.store)["t"]
t.resize((6, 12, 16))
t[4:] = np.concatenate([step(k) for k in (4, 5)])
print("snapshot", s.commit("append two steps"))
