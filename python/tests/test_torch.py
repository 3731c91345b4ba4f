import os

import numpy as np

from conftest import need_module, write_view

torch = need_module("torch")

from torch.utils.data import DataLoader  # noqa: E402

from zarrfs.torch import SampleDataset  # noqa: E402

N = 23


def test_items(mount, index_store):
    m = mount(index_store)
    ds = SampleDataset(os.path.join(m.path, "x"))
    assert len(ds) == N
    x, c = ds[7]
    assert isinstance(x, torch.Tensor) and x.shape == (2, 3) and x.dtype == torch.float32
    np.testing.assert_allclose(x.numpy(), 7 + np.arange(6).reshape(2, 3) / 10, rtol=1e-6)
    assert np.datetime64(int(c), "ns") == np.datetime64("2000-01-02T18:00")  # 7 * 6 hours
    assert ds.coords[7] == np.datetime64("2000-01-02T18:00")
    x[0, 0] = -1  # writable, and not the file
    assert float(ds[-1][0][0, 0]) == N - 1
    assert list(ds.indices) == list(range(N))


def test_dataloader_two_workers(mount, index_store):
    m = mount(index_store)
    ds = SampleDataset(os.path.join(m.path, "x"))
    dl = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    seen, times = [], []
    for epoch in range(2):
        got = []
        for x, c in dl:
            assert x.shape[1:] == (2, 3) and c.dtype == torch.int64
            got += [int(round(float(v))) for v in x[:, 0, 0]]
            times += [np.datetime64(int(v), "ns") for v in c]
        assert sorted(got) == list(range(N))
        seen.append(got)
    assert seen[0] != seen[1]
    for k, t in zip(seen[0] + seen[1], times):
        assert t == np.datetime64("2000-01-01T00", "ns") + np.timedelta64(6 * k, "h")


def test_rank_mount_and_view(mount, index_store, tmp_path):
    view = write_view(tmp_path / "v.yaml", "views:\n  - name: train\n    samples: {start: 2, stop: 20, step: 3}\n"
                      "    channels:\n      - var: x\n        select: {a: all}\n")
    m = mount(index_store, view=[view], rank=1, world=2)
    ds = SampleDataset(os.path.join(m.path, "train"))
    # The view has 6 samples (2, 5, ..., 17); rank 1 of 2 lists view samples 3, 4, 5.
    assert len(ds) == 3 and list(ds.indices) == [3, 4, 5]
    x, c = ds[0]
    assert x.shape == (2, 3) and float(x[0, 0]) == 11 and float(x[1, 0]) == np.float32(11.3)
    assert np.datetime64(int(c), "ns") == np.datetime64("2000-01-01T00") + np.timedelta64(66, "h")
    dl = DataLoader(ds, batch_size=2, num_workers=2)
    assert [float(v) for x, _ in dl for v in x[:, 0, 0]] == [11, 14, 17]


def test_transform_gets_a_memory_map(mount, index_store):
    m = mount(index_store)
    seen = []

    def crop(a):
        seen.append(type(a))
        return a[1, ::2]

    ds = SampleDataset(os.path.join(m.path, "x"), transform=crop, coords=False)
    x = ds[3]
    assert seen == [np.memmap] and x.shape == (2,)
    np.testing.assert_allclose(x.numpy(), [3.3, 3.5], rtol=1e-6)


def test_without_coordinate_array(mount, fixtures_dir):
    m = mount(os.path.join(fixtures_dir, "public_a.zarr"))
    ds = SampleDataset(os.path.join(m.path, "sub", "sp"))
    # sub/ has no time array, so the coordinate is looked up at the top: time.
    x, c = ds[4]
    assert x.dtype == torch.int16 and x.shape == (16, 24) and int(c) == 24
