"""ERA5-like NetCDF4 files for the virtual-store benchmark, and what the
peers read: python3 make_era5_nc.py DIR [--files 3] [--steps 8]

DIR/nc/era5_MM.nc: one file a month, t and q (time, lat, lon) float32 on
the 0.25 degree grid (721 x 1440), chunked per time step, zlib level 1 +
shuffle, written by netCDF4; DIR/refs.json: kerchunk references of all of
them (SingleHdf5ToZarr + MultiZarrToZarr along time); DIR/plain.zarr: the
same arrays as plain Zarr v2, same chunks and codecs (shuffle filter, zlib
1); DIR/view.yaml: a two-channel view of t and q. Skips work already done.
"""
import argparse
import json
import os
import warnings

import netCDF4
import numpy as np

warnings.simplefilter("ignore")
ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--files", type=int, default=3)
ap.add_argument("--steps", type=int, default=8)
a = ap.parse_args()
os.makedirs(os.path.join(a.dir, "nc"), exist_ok=True)
os.chdir(a.dir)
NY, NX = 721, 1440
lat = np.linspace(90, -90, NY, dtype="f4")
lon = np.linspace(0, 359.75, NX, dtype="f4")
yy, xx = np.meshgrid(np.radians(lat), np.radians(lon), indexing="ij")
files = []
for m in range(1, a.files + 1):
    fn = f"nc/era5_{m:02d}.nc"
    files.append(fn)
    if os.path.exists(fn):
        continue
    rng = np.random.default_rng(m)
    with netCDF4.Dataset(fn + ".tmp", "w") as ds:
        ds.createDimension("time", a.steps)
        ds.createDimension("lat", NY)
        ds.createDimension("lon", NX)
        ds.createVariable("time", "f8", ("time",))[:] = np.arange(a.steps) + (m - 1) * a.steps
        ds.createVariable("lat", "f4", ("lat",))[:] = lat
        ds.createVariable("lon", "f4", ("lon",))[:] = lon
        for name, base in (("t", 280.0), ("q", 0.01)):
            v = ds.createVariable(name, "f4", ("time", "lat", "lon"), zlib=True, complevel=1, shuffle=True,
                                  chunksizes=(1, NY, NX))
            for k in range(a.steps):
                field = base * (1 + 0.1 * np.cos(yy) * np.sin(xx + k / 4)) + rng.standard_normal((NY, NX)) * base * 0.01
                v[k] = field.astype("f4")
    os.rename(fn + ".tmp", fn)

if not os.path.exists("refs.json"):
    import kerchunk.hdf
    from kerchunk.combine import MultiZarrToZarr
    singles = [kerchunk.hdf.SingleHdf5ToZarr(f, inline_threshold=100).translate() for f in files]
    refs = MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["lat", "lon"]).translate()
    with open("refs.json.tmp", "w") as f:
        json.dump(refs, f)
    os.rename("refs.json.tmp", "refs.json")

if not os.path.exists("plain.zarr/.zmetadata"):
    import xarray as xr
    import zarr
    from numcodecs import Shuffle, Zlib
    ds = xr.open_mfdataset(files, engine="h5netcdf", combine="nested", concat_dim="time", data_vars="minimal",
                           coords="minimal", compat="override")
    enc = {v: {"compressors": [Zlib(level=1)], "filters": [Shuffle(elementsize=4)], "chunks": (1, NY, NX)} for v in ("t", "q")}
    ds.load().to_zarr("plain.zarr", mode="w", encoding=enc, zarr_format=2, consolidated=True)

with open("view.yaml", "w") as f:
    f.write("views:\n  - name: train\n    channels:\n      - var: t\n      - var: q\n")
