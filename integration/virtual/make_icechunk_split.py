"""Writes an Icechunk repository whose manifests are split by extent
(icechunk >= 1.1 ManifestSplittingConfig), for the split-manifest tests:
python3 make_icechunk_split.py REPO VDATA, or python3
make_icechunk_split.py check MOUNT REPO VDATA [REF].

Splits: two chunks along time, two along lat, so that an array's chunks
lie in several manifests whose extents end inside its grid.
Commit 1: t(time 7, lat 5, lon 3) float32 native chunks (1, 2, 2), shapes
that do not divide into chunks, time step 5 never written (the fill
value -1); x(time 7, n 4) float32 virtual, uncompressed, each chunk a
16-byte range of VDATA/x.bin. Commit 2 rewrites t's step 3 (its split's
manifest is written anew) and appends step 7 (a new split). Prints
"snapshot ID" per commit and "manifests N" (their count).

check compares every array of a mount with icechunk's own reader (zarr
over a readonly session of REF, default main), one line per array.
"""
import os
import sys
import warnings

import icechunk as ic
import numpy as np
import zarr

warnings.simplefilter("ignore")


def open_repo(path, vdir, create=False):
    split = ic.ManifestSplittingConfig.from_dict({
        ic.ManifestSplitCondition.AnyArray(): {
            ic.ManifestSplitDimCondition.DimensionName("time"): 2,
            ic.ManifestSplitDimCondition.DimensionName("lat"): 2,
        }
    })
    config = ic.RepositoryConfig.default()
    config.manifest = ic.ManifestConfig(splitting=split)
    prefix = "file://" + vdir + "/"
    config.set_virtual_chunk_container(ic.VirtualChunkContainer(prefix, ic.local_filesystem_store(vdir)))
    storage = ic.local_filesystem_storage(path)
    if create:
        return ic.Repository.create(storage, config=config)
    return ic.Repository.open(storage, config=config, authorize_virtual_chunk_access={prefix: None})


def step(k):
    return (np.arange(15, dtype="f4").reshape(5, 3) + 100 * k).astype("f4")


if sys.argv[1] == "check":
    mnt, path, vdir = sys.argv[2], sys.argv[3], os.path.abspath(sys.argv[4])
    ref = sys.argv[5] if len(sys.argv) > 5 else "main"
    repo = open_repo(path, vdir)
    try:
        session = repo.readonly_session(branch=ref)
    except Exception:
        session = repo.readonly_session(snapshot_id=ref)
    g = zarr.open_group(session.store, mode="r")
    for name in ("t", "x"):
        want = g[name][...]
        d = os.path.join(mnt, name)
        files = sorted(f for f in os.listdir(d) if f.endswith(".npy"))
        got = np.stack([np.load(os.path.join(d, f)) for f in files])
        assert got.shape == want.shape, (name, got.shape, want.shape)
        bad = np.argwhere(got != want)
        assert len(bad) == 0, f"{name}: {len(bad)} of {want.size} values differ, first at {bad[0].tolist()}: {got[tuple(bad[0])]} for {want[tuple(bad[0])]}"
        print(f"{name}: {want.size} values equal (icechunk)")
    sys.exit(0)

path, vdir = sys.argv[1], os.path.abspath(sys.argv[2])
os.makedirs(vdir, exist_ok=True)
xv = (np.arange(28, dtype="<f4").reshape(7, 4) * 0.5 - 3).astype("<f4")
with open(os.path.join(vdir, "x.bin"), "wb") as f:
    f.write(b"\0" * 8)  # the chunks do not start at 0
    f.write(xv.tobytes())

repo = open_repo(path, vdir, create=True)
s = repo.writable_session("main")
g = zarr.group(store=s.store)
t = g.create_array("t", shape=(7, 5, 3), chunks=(1, 2, 2), dtype="f4", fill_value=-1,
                   dimension_names=["time", "lat", "lon"])
for k in (0, 1, 2, 3, 4, 6):
    t[k] = step(k)
x = g.create_array("x", shape=(7, 4), chunks=(1, 4), dtype="<f4", compressors=None, fill_value=0,
                   dimension_names=["time", "n"])
for k in range(7):
    s.store.set_virtual_ref(f"x/c/{k}/0", "file://" + vdir + "/x.bin", offset=8 + 16 * k, length=16)
print("snapshot", s.commit("split manifests"))
s = repo.writable_session("main")
t = zarr.open_group(s.store)["t"]
t[3] = step(3) + 0.5
t.resize((8, 5, 3))
t[7] = step(7)
print("snapshot", s.commit("rewrite step 3, append step 7"))
print("manifests", len(os.listdir(os.path.join(path, "manifests"))))
