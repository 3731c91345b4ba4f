"""The xarray + kerchunk (fsspec) peer: reads every sample of the view as a
training loader would, one (2, lat, lon) stack per time step, from the
reference set: python3 xarray_kerchunk.py DIR. Prints seconds and bytes."""
import json
import os
import sys
import time

import numpy as np
import xarray as xr

d = os.path.abspath(sys.argv[1])
os.chdir(d)  # kerchunk wrote the targets relative to the folder
start = time.perf_counter()
ds = xr.open_dataset("reference://", engine="zarr", chunks=None,
                     backend_kwargs={"consolidated": False, "storage_options": {"fo": f"{d}/refs.json", "remote_protocol": "file"}})
n = ds.sizes["time"]
total = 0
for k in range(n):
    x = ds[["t", "q"]].isel(time=k).to_array().values.astype("f4")
    total += x.nbytes
print(json.dumps({"reader": "xarray+kerchunk", "samples": n, "seconds": time.perf_counter() - start, "bytes": total}))
