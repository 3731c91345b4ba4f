"""Writes testdata/v2: a spec version 2 repository made by icechunk 2.x
(which needs Python 3.12 or later): t (time, y, x) float32 = arange,
native chunks, one per time step; small int16 [1, 2, 3], an inline chunk
(chunks under 64 bytes are inlined);
commit "first" tagged v1 (4 steps), then commit "second" on main appends
step 4, all -1. Run from this folder: python3.12 make_v2.py"""
import shutil

import icechunk as ic
import numpy as np
import zarr

shutil.rmtree("v2", ignore_errors=True)
repo = ic.Repository.create(ic.local_filesystem_storage("v2"), config=ic.RepositoryConfig(inline_chunk_threshold_bytes=64))
s = repo.writable_session("main")
g = zarr.group(store=s.store)
a = g.create_array("t", shape=(4, 20, 10), chunks=(1, 20, 10), dtype="f4", dimension_names=["time", "y", "x"])
a[:] = np.arange(4 * 20 * 10, dtype="f4").reshape(4, 20, 10)
b = g.create_array("small", shape=(3,), chunks=(3,), dtype="i2")
b[:] = [1, 2, 3]
repo.create_tag("v1", s.commit("first"))
s = repo.writable_session("main")
t = zarr.open_group(s.store)["t"]
t.resize((5, 20, 10))
t[4] = -1
s.commit("second")
