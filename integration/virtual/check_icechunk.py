"""Compares a zarrfs mount of an Icechunk repository with icechunk's own
reader (zarr over a readonly session) and, for the virtual array, with
xarray reading the HDF5 file (engine="h5netcdf"):
python3 check_icechunk.py MOUNT REPO KERCHUNK_OUT REF. Prints one line per
array checked."""
import os
import sys
import warnings

import icechunk as ic
import numpy as np
import xarray as xr
import zarr

warnings.simplefilter("ignore")
mnt, path, src, ref = sys.argv[1:5]
nc = os.path.abspath(os.path.join(src, "nc"))
config = ic.RepositoryConfig.default()
config.set_virtual_chunk_container(ic.VirtualChunkContainer("file://" + nc + "/", ic.local_filesystem_store(nc)))
repo = ic.Repository.open(ic.local_filesystem_storage(path), config=config,
                          authorize_virtual_chunk_access={"file://" + nc + "/": None})
try:
    session = repo.readonly_session(branch=ref)
except Exception:
    try:
        session = repo.readonly_session(tag=ref)
    except Exception:
        session = repo.readonly_session(snapshot_id=ref)
g = zarr.open_group(session.store, mode="r")


def mounted(name):
    d = os.path.join(mnt, name)
    if os.path.isdir(d):
        files = sorted(f for f in os.listdir(d) if f.endswith(".npy"))
        return np.stack([np.load(os.path.join(d, f)) for f in files])
    return np.load(d + ".npy")


for name in ["t", "small", "v/x"]:
    want = g[name][...]
    got = mounted(name)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    np.testing.assert_array_equal(got, want, err_msg=name)
    print(f"{name}: {want.size} values equal (icechunk)")
orig = xr.open_dataset(os.path.join(nc, "f32.h5"), engine="h5netcdf", phony_dims="access")["x"].values
np.testing.assert_array_equal(mounted("v/x"), orig)
print(f"v/x: {orig.size} values equal (h5netcdf)")
