"""Compares a zarrfs mount of a virtual store with xarray reading the
original NetCDF4/HDF5 files (engine="h5netcdf"), value for value:
python3 check.py MOUNT OUT [vars...]. Prints one line per array checked."""
import os
import sys

import numpy as np
import xarray as xr

mnt, out = sys.argv[1], sys.argv[2]
names = sys.argv[3:]
if names == ["x"]:
    orig = xr.open_dataset(os.path.join(out, "nc", "f32.h5"), engine="h5netcdf", phony_dims="access")
else:
    orig = xr.open_mfdataset([os.path.join(out, "nc", f"m{m:02d}.nc") for m in (1, 2)], engine="h5netcdf",
                             combine="nested", concat_dim="time", data_vars="minimal", coords="minimal",
                             compat="override", decode_times=False)
for name in names:
    want = orig[name].values
    d = os.path.join(mnt, name)
    if os.path.isdir(d):
        files = sorted(f for f in os.listdir(d) if f.endswith(".npy"))
        assert len(files) == want.shape[0], (name, len(files), want.shape)
        got = np.stack([np.load(os.path.join(d, f)) for f in files])
    else:
        got = np.load(d + ".npy")
    assert got.dtype == want.dtype.newbyteorder("<") or got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    np.testing.assert_array_equal(got, want, err_msg=name)
    print(f"{name}: {want.size} values equal")
