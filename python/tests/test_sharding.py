"""One split across ranks: every reader of the package reads, by default,
exactly the files ``zarrfs warm --rank R --world W`` filled on rank R's node,
and with shard="interleaved" what ``warm --shard interleaved`` filled.

Each rank warms its own cache, then a mount on that cache (no readahead)
serves the readers: a reader that strays outside the warmed share makes
the mount fill a file, which the cache's contents show.
"""

import os
import subprocess

import numpy as np
import pytest

import zarrfs
import zarrfs.dali
from conftest import need_module, sample_blobs

N_INDEX = 23  # index_store's samples
WORLD = 3  # shares of 7 and 8: uneven on purpose


def warm(zarrfs_bin, store, cache, rank, shard):
    args = [zarrfs_bin, "warm", store, "--cache", str(cache), "--rank", str(rank), "--world", str(WORLD)]
    if shard is not None:
        args += ["--shard", shard]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return set(sample_blobs(str(cache), "x"))


def basenames(paths):
    return {os.path.basename(p) for p in paths}


# None: neither warm nor the readers are told a mode (contiguous both).
@pytest.mark.parametrize("shard", [None, "contiguous", "interleaved"], ids=["default", "contiguous", "interleaved"])
def test_readers_read_what_warm_filled(zarrfs_bin, fuse, index_store, tmp_path, shard):
    torch = need_module("torch")  # noqa: F841
    from zarrfs.torch import Loader, SampleDataset

    mode = {} if shard is None else {"shard": shard}
    union = []
    for rank in range(WORLD):
        cache = tmp_path / f"cache{rank}"
        warmed = warm(zarrfs_bin, index_store, cache, rank, shard)
        first, step, count = zarrfs.shard_of(N_INDEX, rank, WORLD, shard or "contiguous")
        assert warmed == {f"{k:02d}.npy" for k in range(first, first + step * count, step)}
        union += sorted(warmed)

        with zarrfs.Mount(index_store, str(tmp_path / f"mnt{rank}"), cache=str(cache), readahead=0) as m:
            d = os.path.join(m.path, "x")
            # Loader: two epochs, shuffled, with opens ahead.
            l = Loader(d, 3, device="cpu", rank=rank, world=WORLD, shuffle=True, seed=4, threads=2, **mode)
            for epoch in range(2):
                l.set_epoch(epoch)
                read = [f for _, c in l for f in c["file"]]
                assert len(read) == len(warmed) and basenames(read) == warmed, (rank, epoch)
            # SampleDataset: every item.
            ds = SampleDataset(d, rank=rank, world=WORLD, **mode)
            assert len(ds) == len(warmed) and basenames(ds.files) == warmed
            for i in range(len(ds)):
                x, _ = ds[i]
                assert int(round(float(x[0, 0]))) == int(ds.indices[i])
            # DALI's file list (the same split; no DALI needed to compute it).
            assert set(zarrfs.dali.rank_files(d, rank, WORLD, **mode)) == warmed
            assert set(sample_blobs(str(cache), "x")) == warmed, "a reader filled a file its rank did not warm"

        # A per-rank mount of the same split lists exactly the warmed files,
        # and the readers given no rank read them all.
        flags = {"rank": rank, "world": WORLD, "readahead": 0}
        flags.update(mode)
        with zarrfs.Mount(index_store, str(tmp_path / f"rmnt{rank}"), cache=str(cache), **flags) as m:
            d = os.path.join(m.path, "x")
            assert set(os.listdir(d)) == warmed
            read = [f for _, c in Loader(d, 4, device="cpu") for f in c["file"]]
            assert basenames(read) == warmed and len(read) == len(warmed)
            assert basenames(SampleDataset(d).files) == warmed
            assert set(sample_blobs(str(cache), "x")) == warmed
    assert sorted(union) == [f"{k:02d}.npy" for k in range(N_INDEX)]


def test_other_split_fills_what_was_not_warmed(zarrfs_bin, fuse, index_store, tmp_path):
    """The check above can fail: a reader of the other split makes the mount
    fill files its rank's warm left out."""
    need_module("torch")
    from zarrfs.torch import Loader

    cache = tmp_path / "cache"
    warmed = warm(zarrfs_bin, index_store, cache, 1, None)
    with zarrfs.Mount(index_store, str(tmp_path / "mnt"), cache=str(cache), readahead=0) as m:
        d = os.path.join(m.path, "x")
        for _ in Loader(d, 4, device="cpu", rank=1, world=WORLD, shard="interleaved", open_ahead=0):
            pass
    assert set(sample_blobs(str(cache), "x")) > warmed


def test_per_rank_directory_refuses_another_share(mount, index_store):
    need_module("torch")
    from zarrfs.torch import Loader, SampleDataset

    m = mount(index_store, rank=1, world=2)
    d = os.path.join(m.path, "x")
    for make in (lambda **kw: Loader(d, 2, device="cpu", **kw), lambda **kw: SampleDataset(d, **kw)):
        with pytest.raises(ValueError, match="lists the samples of rank 1 of 2"):
            make(rank=0, world=2)
        assert len(make(rank=1, world=2)) > 0


def test_even_batches_on_uneven_shares(mount, index_store):
    need_module("torch")
    from zarrfs.torch import Loader

    m = mount(index_store)
    d = os.path.join(m.path, "x")
    for shard in ("contiguous", "interleaved"):
        sizes = {len(Loader(d, 1, device="cpu", rank=r, world=WORLD, shard=shard, even_batches=True).order())
                 for r in range(WORLD)}
        assert sizes == {N_INDEX // WORLD}, shard
        orders = [Loader(d, 1, device="cpu", rank=r, world=WORLD, shard=shard).order() for r in range(WORLD)]
        assert sorted(np.concatenate(orders).tolist()) == list(range(N_INDEX))
