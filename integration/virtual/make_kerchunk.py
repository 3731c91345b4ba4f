"""Writes NetCDF4/HDF5 files and the reference sets of them that kerchunk
and VirtualiZarr make, for the virtual-store tests: python3 make_kerchunk.py OUT

OUT/nc/m01.nc, m02.nc: NetCDF4 (netCDF4 library), t(time, lat, lon)
float32 chunked per time step with zlib + shuffle, q likewise in float64,
lsm(lat, lon) int16, time and lat coordinates; OUT/nc/f32.h5 (h5py):
x(time, y) with shuffle, gzip and fletcher32.
OUT/kerchunk.json: kerchunk SingleHdf5ToZarr + MultiZarrToZarr along time,
targets relative to OUT; OUT/kerchunk.parq: the same refs as Parquet;
OUT/virtualizarr.json: VirtualiZarr (absolute paths) of the fletcher32
file; OUT/grib.json: kerchunk.json with a GRIB-backed array added.
"""
import json
import os
import sys
import warnings

import h5py
import netCDF4
import numpy as np

warnings.simplefilter("ignore")
out = sys.argv[1]
os.makedirs(os.path.join(out, "nc"), exist_ok=True)
os.chdir(out)
rng = np.random.default_rng(28)
NT, NY, NX = 5, 12, 16
for m in (1, 2):
    with netCDF4.Dataset(f"nc/m{m:02d}.nc", "w") as ds:
        ds.createDimension("time", NT)
        ds.createDimension("lat", NY)
        ds.createDimension("lon", NX)
        tv = ds.createVariable("time", "f8", ("time",))
        tv.units = "hours since 2020-01-01"
        tv[:] = np.arange(NT) + (m - 1) * NT
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat[:] = np.linspace(-90, 90, NY)
        t = ds.createVariable("t", "f4", ("time", "lat", "lon"), zlib=True, shuffle=True, complevel=4, chunksizes=(1, NY, NX))
        t.units = "K"
        t[:] = (rng.standard_normal((NT, NY, NX)) * 10 + 280).astype("f4")
        q = ds.createVariable("q", "f8", ("time", "lat", "lon"), zlib=True, shuffle=True, chunksizes=(1, NY // 2, NX))
        q[:] = rng.random((NT, NY, NX))
        lsm = ds.createVariable("lsm", "i2", ("lat", "lon"), zlib=True, shuffle=True)
        lsm[:] = (rng.random((NY, NX)) > 0.5).astype("i2")
with h5py.File("nc/f32.h5", "w") as f:
    x = f.create_dataset("x", data=rng.standard_normal((6, 40)).astype("f4"), chunks=(1, 40),
                         compression="gzip", shuffle=True, fletcher32=True)
    x.dims[0].label = "time"

import kerchunk.df
import kerchunk.hdf
from kerchunk.combine import MultiZarrToZarr

singles = [kerchunk.hdf.SingleHdf5ToZarr(f"nc/m{m:02d}.nc", inline_threshold=100).translate() for m in (1, 2)]
combined = MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["lat", "lsm"]).translate()
with open("kerchunk.json", "w") as f:
    json.dump(combined, f)
kerchunk.df.refs_to_dataframe(combined, "kerchunk.parq", record_size=4)

grib = json.loads(json.dumps(combined))
grib["refs"]["g/.zarray"] = json.dumps({"shape": [2, 3], "chunks": [1, 3], "dtype": "<f8", "fill_value": None,
    "order": "C", "compressor": None, "filters": [{"id": "grib", "var": "2t"}], "zarr_format": 2})
grib["refs"]["g/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["time", "x"]})
grib["refs"]["g/0.0"] = ["nc/m01.nc", 0, 10]
with open("grib.json", "w") as f:
    json.dump(grib, f)

from obstore.store import LocalStore
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser
from virtualizarr.registry import ObjectStoreRegistry

reg = ObjectStoreRegistry({"file://": LocalStore()})
vds = open_virtual_dataset("file://" + os.path.abspath("nc/f32.h5"), registry=reg, parser=HDFParser())
vds.vz.to_kerchunk("virtualizarr.json", format="json")
