"""Writes arrays whose shapes do not divide into their chunks, and the
reference sets of them, for the uneven-grid tests: python3 make_uneven.py OUT

OUT/u.nc (netCDF4): a(time 7, lon 3) float32 in chunks (2, 2);
b(time 7, lat 5, lon 3) int16 in chunks (3, 2, 2), only time steps 0-3
written (the chunks of step 6 are never stored: the fill value);
c(lat 5, lon 3) float64 in chunks (2, 2), no time; the time coordinate.
OUT/u.json: kerchunk SingleHdf5ToZarr of it; OUT/u.parq: the same as
Parquet, three references a record (chunk numbers cross records).
OUT/g.bin, OUT/gen.json: g(time 5, lon 3) float32 in chunks (2, 2), stored
raw, each chunk whole (edges padded, as Zarr v2 stores them), described by
one kerchunk generator whose offsets are grid arithmetic.
OUT/want.npz: every array as the writers hold it (b's unwritten steps as
its fill value), for the checker.
"""
import json
import os
import sys

import netCDF4
import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
os.chdir(out)
rng = np.random.default_rng(47)
want = {}
with netCDF4.Dataset("u.nc", "w") as ds:
    ds.createDimension("time", 7)
    ds.createDimension("lat", 5)
    ds.createDimension("lon", 3)
    tm = ds.createVariable("time", "f8", ("time",))
    tm[:] = np.arange(7) * 6.0
    a = ds.createVariable("a", "f4", ("time", "lon"), chunksizes=(2, 2), zlib=True, shuffle=True)
    a[:] = (rng.standard_normal((7, 3)) * 10).astype("f4")
    b = ds.createVariable("b", "i2", ("time", "lat", "lon"), chunksizes=(3, 2, 2), zlib=True, fill_value=-9)
    b[0:4] = rng.integers(-300, 300, (4, 5, 3), dtype="i2")
    c = ds.createVariable("c", "f8", ("lat", "lon"), chunksizes=(2, 2))
    c[:] = rng.random((5, 3))
with netCDF4.Dataset("u.nc") as ds:
    for name in ("a", "b", "c", "time"):
        v = ds[name]
        v.set_auto_maskandscale(False)
        want[name] = np.asarray(v[:])

import kerchunk.df
import kerchunk.hdf

refs = kerchunk.hdf.SingleHdf5ToZarr("u.nc", inline_threshold=0).translate()
with open("u.json", "w") as f:
    json.dump(refs, f)
kerchunk.df.refs_to_dataframe(refs, "u.parq", record_size=3)

g = (np.arange(15, dtype="<f4").reshape(5, 3) * 1.5 + 0.25)
with open("g.bin", "wb") as f:
    for i in range(3):
        for j in range(2):
            chunk = np.zeros((2, 2), "<f4")
            part = g[i * 2:i * 2 + 2, j * 2:j * 2 + 2]
            chunk[:part.shape[0], :part.shape[1]] = part
            f.write(chunk.tobytes())
want["g"] = g
gen = {
    "version": 1,
    "refs": {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "g/.zarray": json.dumps({"shape": [5, 3], "chunks": [2, 2], "dtype": "<f4", "fill_value": 0, "order": "C",
                                 "compressor": None, "filters": None, "zarr_format": 2}),
        "g/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time", "lon"]}),
    },
    "gen": [{"key": "g/{{i}}.{{j}}", "url": "g.bin", "offset": "{{ (i * 2 + j) * 16 }}", "length": "16",
             "dimensions": {"i": {"stop": 3}, "j": {"stop": 2}}}],
}
with open("gen.json", "w") as f:
    json.dump(gen, f)
np.savez("want.npz", **want)
# The unwritten steps must be missing chunks, or the test proves nothing.
missing = [k for k in ("b/2.0.0", "b/2.2.1") if k not in refs["refs"]]
assert missing == ["b/2.0.0", "b/2.2.1"], sorted(k for k in refs["refs"] if k.startswith("b/"))
