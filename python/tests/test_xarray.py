import os
import sys
import time
import types
import warnings

import numpy as np
import pytest

from conftest import need_gpu, need_module, sample_blobs, write_view

xr = need_module("xarray")
zarr = need_module("zarr")

from zarrfs import xarray_backend  # noqa: E402


def open_zarr(src, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "no consolidated metadata"
        return xr.open_zarr(src, **kw)


def assert_same(got, want, group=True):
    """Identical dims, coords, variables, attrs and values. A group has its
    attributes (group=True); a view or one array opened alone has none."""
    got, want = got.load(), want.load()
    if not group:
        assert got.attrs == {}
        want = want.copy()
        want.attrs = {}
    xr.testing.assert_identical(got, want)
    for k in want.variables:
        assert got[k].dtype == want[k].dtype, k
        assert got[k].attrs == want[k].attrs, k
        assert got[k].encoding.get("_FillValue") == want[k].encoding.get("_FillValue") or (
            np.isnan(got[k].encoding.get("_FillValue")) and np.isnan(want[k].encoding.get("_FillValue"))), k


@pytest.mark.parametrize("store", ["public_a.zarr", "public_b.zarr"])
def test_mount_matches_open_zarr(mount, fixtures_dir, store):
    src = os.path.join(fixtures_dir, store)
    m = mount(src)
    got = xr.open_dataset(m.path, engine="zarrfs")
    want = open_zarr(src)
    assert set(got.data_vars) == set(want.data_vars) and set(got.coords) == set(want.coords)
    assert_same(got, want)


def test_guess_engine(mount, fixtures_dir):
    m = mount(os.path.join(fixtures_dir, "public_a.zarr"))
    assert "t" in xr.open_dataset(m.path)  # engine guessed from the mount
    assert "t" in xr.open_dataset(os.path.join(m.path, "t"))
    assert "lsm" in xr.open_dataset(os.path.join(m.path, "lsm.npy"))


def test_group_and_one_array(mount, fixtures_dir):
    src = os.path.join(fixtures_dir, "public_a.zarr")
    m = mount(src)
    assert_same(xr.open_dataset(m.path, engine="zarrfs", group="sub"), open_zarr(src, group="sub"))
    assert_same(xr.open_dataset(os.path.join(m.path, "sub"), engine="zarrfs"), open_zarr(src, group="sub"))
    assert_same(xr.open_dataset(os.path.join(m.path, "t"), engine="zarrfs", threads=1), open_zarr(src)[["t"]], group=False)
    assert_same(xr.open_dataset(os.path.join(m.path, "lsm.npy"), engine="zarrfs"), open_zarr(src)[["lsm"]], group=False)


def test_group_attributes(mount, tmp_path):
    """ds.attrs holds the group's attributes, as xr.open_zarr gives them,
    from the group directory's unlisted .zattrs."""
    import json

    src = str(tmp_path / "g.zarr")
    root = zarr.open_group(src, mode="w", attributes={"title": "ERA5 <subset>", "version": 2, "levels": [850, 500]})
    x = root.create_array("x", shape=(3, 2), chunks=(1, 2), dtype="f4", dimension_names=["time", "y"])
    x[:] = 1
    sub = root.create_group("sub", attributes={"source": "zarr-python"})
    s = sub.create_array("s", shape=(2,), chunks=(2,), dtype="i4", dimension_names=["y"])
    s[:] = [1, 2]
    m = mount(src)
    assert ".zattrs" not in os.listdir(m.path)
    with open(os.path.join(m.path, ".zattrs")) as f:
        assert json.load(f) == {"title": "ERA5 <subset>", "version": 2, "levels": [850, 500]}
    got = xr.open_dataset(m.path, engine="zarrfs")
    want = open_zarr(src)
    assert got.attrs == want.attrs == {"title": "ERA5 <subset>", "version": 2, "levels": [850, 500]}
    assert_same(got, want)
    assert_same(xr.open_dataset(m.path, engine="zarrfs", group="sub"), open_zarr(src, group="sub"))
    assert xr.open_dataset(os.path.join(m.path, "sub"), engine="zarrfs").attrs == {"source": "zarr-python"}
    assert xr.open_dataset(os.path.join(m.path, "x"), engine="zarrfs").attrs == {}


@pytest.mark.parametrize("small", [True, False], ids=["read", "mmap"])
def test_indexing(mount, fixtures_dir, monkeypatch, small):
    if not small:
        monkeypatch.setattr(xarray_backend, "SMALL_SAMPLE", 0)  # every partial read memory-maps
    src = os.path.join(fixtures_dir, "public_a.zarr")
    m = mount(src)
    got = xr.open_dataset(m.path, engine="zarrfs")
    want = open_zarr(src)
    for name in ("t", "z", "q", "u10", "lsm"):
        g, w = got[name], want[name]
        sel = [
            {},
            {"time": 3},
            {"time": -1, "latitude": slice(2, 9, 3)},
            {"time": slice(10, 2, -3), "longitude": [5, 1, 7]},
            {"time": [11, 0, 4], "latitude": 4},
            {"latitude": slice(None, None, 5), "longitude": -2},
            {"time": slice(4, 4)},
        ]
        for s in sel:
            s = {k: v for k, v in s.items() if k in g.dims}
            a, b = g.isel(s).values, w.isel(s).values
            assert a.shape == b.shape and a.dtype == b.dtype, (name, s)
            np.testing.assert_array_equal(a, b, err_msg=f"{name} {s}")
    # Vectorized (pointwise) indexing goes through xarray's adapter.
    pts = {"time": xr.DataArray([1, 5, 9], dims="p"), "latitude": xr.DataArray([0, 7, 15], dims="p")}
    np.testing.assert_array_equal(got.t.isel(pts).values, want.t.isel(pts).values)


VIEW = """views:
  - name: train
    samples: {start: 1, stop: 11, step: 2}
    dtype: float32
    channels:
      - var: t
        select: {level: all}
      - var: z
        select_values: {level: [850]}
      - var: u10
      - var: lsm
"""


def test_view(mount, fixtures_dir, tmp_path):
    src = os.path.join(fixtures_dir, "public_a.zarr")
    m = mount(src, view=[write_view(tmp_path / "v.yaml", VIEW)])
    ds = xr.open_dataset(os.path.join(m.path, "train"), engine="zarrfs")
    ref = open_zarr(src)
    assert ds.train.dims == ("time", "channel", "latitude", "longitude")
    assert ds.train.shape == (5, 6, 16, 24) and ds.train.dtype == np.float32
    assert list(ds.channel.values) == ["t:level=500", "t:level=850", "t:level=1000", "z:level=850", "u10", "lsm"]
    assert list(ds["var"].values) == ["t", "t", "t", "z", "u10", "lsm"]
    np.testing.assert_array_equal(ds.level.values, [500, 850, 1000, 850, np.nan, np.nan])
    np.testing.assert_array_equal(ds.time.values, ref.time.values[1:11:2])
    xr.testing.assert_identical(ds.latitude, ref.latitude)
    xr.testing.assert_identical(ds.longitude, ref.longitude)
    g = zarr.open_group(src, mode="r")
    for k, t in enumerate(range(1, 11, 2)):
        want = np.stack([g["t"][t, 0], g["t"][t, 1], g["t"][t, 2], g["z"][t, 1], g["u10"][t], g["lsm"][:]])
        np.testing.assert_array_equal(ds.train[k].values, want.astype(np.float32))
    np.testing.assert_array_equal(ds.train.sel(channel="z:level=850").values,
                                  ref.z.isel(time=slice(1, 11, 2)).sel(level=850).values)


def test_open_is_lazy(mount, big_store, tmp_path):
    """Opening a 100k-sample store or view reads no sample; indexing reads only what it takes."""
    view = write_view(tmp_path / "v.yaml", "views:\n  - name: train\n    channels:\n      - var: x\n")
    m = mount(big_store, view=[view], readahead=0)
    t0 = time.perf_counter()
    ds = xr.open_dataset(m.path, engine="zarrfs")
    vs = xr.open_dataset(os.path.join(m.path, "train"), engine="zarrfs")
    took = time.perf_counter() - t0
    assert ds.x.shape == (100_000, 4, 8) and vs.train.shape == (100_000, 1, 4, 8)
    assert ds.time.values[-1] == np.datetime64("1979-01-01") + np.timedelta64(99_999, "h")
    np.testing.assert_array_equal(vs.time.values, ds.time.values)
    assert sample_blobs(m.cache, "x") == [] and sample_blobs(m.cache, "train") == []
    assert took < 30, f"opening took {took:.1f}s"
    a = ds.x.isel(time=[5, 99_999], lat=1).values
    np.testing.assert_allclose(a[:, 0], [5.08, 99_999.08])
    assert sample_blobs(m.cache, "x") == ["00005.npy", "99999.npy"]
    b = vs.train.isel(time=42).values
    assert b.shape == (1, 4, 8) and b[0, 0, 0] == 42
    assert sample_blobs(m.cache, "train") == ["00042.npy"]


def test_rank_mount(mount, index_store):
    """On a --rank/--world mount the sample dimension is the rank's share, coordinates cut to match."""
    full = xr.open_dataset(mount(index_store).path, engine="zarrfs")
    seen = []
    for rank in range(3):
        for direct in (False, True):
            m = mount(index_store, rank=rank, world=3, direct=direct)
            ds = xr.open_dataset(m.path, engine="zarrfs")
            sl = slice(rank * 23 // 3, (rank + 1) * 23 // 3)
            xr.testing.assert_identical(ds.load(), full.isel(time=sl).load())
            if not direct:
                seen += list(ds.time.values)
    assert seen == list(full.time.values)


def test_direct_mount(mount, fixtures_dir):
    src = os.path.join(fixtures_dir, "public_b.zarr")
    m = mount(src, direct=True)
    assert os.path.islink(os.path.join(m.path, "t2m", "0.npy"))
    assert_same(xr.open_dataset(m.path, engine="zarrfs"), open_zarr(src))


class _FakeCuFile:
    """kvikio.CuFile reading with os.pread, so the device="cuda" path runs on the CPU."""

    def __init__(self, path, mode):
        assert mode == "r" and not os.path.islink(path)
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def read(self, buf, file_offset=0):
        from zarrfs._samples import read_into

        read_into(self.path, file_offset, buf)
        return buf.nbytes


def test_cuda_path_with_stand_ins(mount, fixtures_dir, monkeypatch):
    """device="cuda" code, with NumPy standing in for CuPy and os.pread for kvikio."""
    cupy = types.SimpleNamespace(empty=np.empty, take=np.take, moveaxis=np.moveaxis, asarray=np.asarray)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "kvikio", types.SimpleNamespace(CuFile=_FakeCuFile))
    src = os.path.join(fixtures_dir, "public_a.zarr")
    m = mount(src, direct=True)
    got = xr.open_dataset(m.path, engine="zarrfs", device="cuda")
    want = open_zarr(src, mask_and_scale=False)
    for name in ("t", "z", "q", "lsm"):
        np.testing.assert_array_equal(got[name].values, want[name].values)
        np.testing.assert_array_equal(got[name].isel(latitude=3, longitude=[1, 4]).values,
                                      want[name].isel(latitude=3, longitude=[1, 4]).values)


@pytest.mark.gpu
def test_cuda_returns_cupy(mount, fixtures_dir):
    need_gpu()
    import cupy

    src = os.path.join(fixtures_dir, "public_a.zarr")
    m = mount(src, direct=True)
    ds = xr.open_dataset(m.path, engine="zarrfs", device="cuda").load()
    want = open_zarr(src, mask_and_scale=False).load()
    for name in ("t", "z", "q", "u10", "lsm"):
        assert isinstance(ds[name].data, cupy.ndarray), name
        np.testing.assert_array_equal(cupy.asnumpy(ds[name].data), want[name].values)
    assert isinstance(ds.latitude.values, np.ndarray)


def test_dask_chunks_one_sample_each(mount, fixtures_dir):
    need_module("dask")
    src = os.path.join(fixtures_dir, "public_a.zarr")
    m = mount(src)
    ds = xr.open_dataset(m.path, engine="zarrfs", chunks={})
    assert ds.t.chunks == ((1,) * 12, (3,), (16,), (24,))
    assert ds.lsm.chunks == ((16,), (24,))
    want = open_zarr(src)
    np.testing.assert_array_equal(ds.t.mean("time").values, want.t.mean("time").values)


def test_bad_threads_refused(mount, index_store):
    m = mount(index_store)
    for t in (0, -1):
        with pytest.raises(ValueError, match="threads"):
            xr.open_dataset(m.path, engine="zarrfs", threads=t)
    with pytest.raises(ValueError, match="threads"):
        xarray_backend.SampleArray(lambda i: "", (2, 3), "f4", 0, 4096, threads=0)
