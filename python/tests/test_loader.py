import os
import threading
import time

import numpy as np
import pytest

import zarrfs
from conftest import need_gpu, need_module, write_view

torch = need_module("torch")

from zarrfs.loader import Loader  # noqa: E402
from zarrfs.torch import Loader as TorchLoader  # noqa: E402

N = 23  # index_store: sample k of x is filled with k + (0..5)/10


def value(x):
    """The sample index a batch row holds (its first element's integer part)."""
    return int(round(float(x.reshape(-1)[0])))


def epoch_indices(loader):
    got = []
    for batch, coords in loader:
        got += [value(b) for b in batch]
        assert [value(b) for b in batch] == coords["index"].tolist()
    return got


def test_exported_from_zarrfs_torch():
    assert TorchLoader is Loader


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_once_per_epoch(mount, index_store, world, shuffle):
    m = mount(index_store)
    d = os.path.join(m.path, "x")
    epochs = []
    for epoch in range(2):
        per_rank = []
        for rank in range(world):
            l = Loader(d, 4, device="cpu", rank=rank, world=world, shuffle=shuffle, seed=11, threads=3)
            l.set_epoch(epoch)
            assert len(l) == -(-len(l.order()) // 4)
            per_rank.append(epoch_indices(l))
        flat = [i for r in per_rank for i in r]
        assert sorted(flat) == list(range(N)), f"world {world}: {per_rank}"
        sizes = [len(r) for r in per_rank]
        assert max(sizes) - min(sizes) <= 1
        epochs.append(per_rank)
        # Rank r reads its contiguous block, the one warm --rank r fills,
        # every epoch: in order, or permuted with seed + epoch.
        for rank in range(world):
            first, _, count = zarrfs.shard_of(N, rank, world)
            block = np.arange(first, first + count)
            if shuffle:
                block = block[np.random.default_rng(11 + epoch).permutation(count)]
            assert per_rank[rank] == block.tolist()
    if shuffle:
        assert epochs[0] != epochs[1]
    else:
        assert epochs[0] == epochs[1]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_even_batches(mount, index_store, world):
    m = mount(index_store)
    d = os.path.join(m.path, "x")
    per_rank = []
    for rank in range(world):
        l = Loader(d, 2, device="cpu", rank=rank, world=world, shuffle=True, seed=3, even_batches=True)
        assert len(l.order()) == N // world and len(l) == -(-(N // world) // 2)
        per_rank.append(epoch_indices(l))
    flat = [i for r in per_rank for i in r]
    assert len(flat) == len(set(flat)) == N - N % world
    for rank, got in enumerate(per_rank):
        first, _, count = zarrfs.shard_of(N, rank, world)
        block = np.arange(first, first + count)[np.random.default_rng(3).permutation(count)]
        assert got == block[:N // world].tolist()


def test_bytes_equal_numpy_and_coords(mount, index_store):
    m = mount(index_store)
    d = os.path.join(m.path, "x")
    l = Loader(d, 5, device="cpu", drop_last=True, threads=2, prefetch=1)
    assert len(l) == N // 5
    n = 0
    for batch, coords in l:
        assert batch.dtype == torch.float32 and batch.shape[1:] == (2, 3)
        for row, f, k, t in zip(batch, coords["file"], coords["index"].tolist(), coords["time"]):
            ref = np.load(f)
            assert row.numpy().tobytes() == ref.tobytes()
            assert os.path.basename(f) == f"{k:02d}.npy"
            assert t == np.datetime64("2000-01-01T00", "ns") + np.timedelta64(6 * k, "h")
            n += 1
    assert n == N // 5 * 5
    assert "path='pread'" in repr(l) and "samples=23" in repr(l)


def test_view_and_rank_directory(mount, index_store, tmp_path):
    view = write_view(tmp_path / "v.yaml", "views:\n  - name: train\n    channels:\n      - var: x\n        select: {a: all}\n")
    seen = []
    for rank in range(2):
        m = mount(index_store, view=[view], rank=rank, world=2)
        l = Loader(os.path.join(m.path, "train"), 3, device="cpu")
        for batch, coords in l:
            assert batch.shape[1:] == (2, 3)
            seen += coords["index"].tolist()
            for row, k in zip(batch, coords["index"].tolist()):
                assert value(row) == k
    assert sorted(seen) == list(range(N))


def test_unreadable_sample_names_its_file(mount, index_store, tmp_path):
    store = tmp_path / "broken.zarr"
    import shutil
    shutil.copytree(index_store, store)
    # Samples 4..7 live in chunk 1 along time.
    chunk = store / "x" / "c" / "1" / "0" / "0"
    chunk.write_bytes(b"garbage!" * 8)
    m = mount(str(store))
    base = threading.active_count()
    l = Loader(os.path.join(m.path, "x"), 2, device="cpu", threads=2)
    with pytest.raises(OSError, match=r"x/0[4-7]\.npy"):
        for _ in l:
            pass
    deadline = time.time() + 10
    while threading.active_count() > base and time.time() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= base, "loader threads still running after the error"


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_pieces_share_one_open_per_sample(mount, index_store, monkeypatch):
    """A sample read in several pieces is opened once for them (an open of
    a mount's file is a round trip to its daemon), and every file is
    closed once its batch is read."""
    import zarrfs.loader as zl

    m = mount(index_store)
    d = os.path.join(m.path, "x")
    monkeypatch.setattr(zl, "_PIECE", 8)  # 24-byte samples: 3 pieces each
    opened = []
    real_open = os.open

    def counting_open(path, *args, **kw):
        if str(path).startswith(d + "/"):
            opened.append(os.path.basename(path))
        return real_open(path, *args, **kw)

    monkeypatch.setattr(zl.os, "open", counting_open)
    fds = open_fds()
    l = Loader(d, 4, device="cpu", threads=3, open_ahead=0)
    assert epoch_indices(l) == list(range(N))
    assert sorted(opened) == sorted(zarrfs.SampleDir(d).names), "each sample opened once"
    assert open_fds() <= fds, "sample files left open"


def test_close_with_pieces_queued(mount, index_store, monkeypatch):
    """Closing a loader while pieces of the next batches wait in its pool
    (cancelled by the pool's shutdown) returns, and leaves no file open."""
    import zarrfs.loader as zl

    m = mount(index_store)
    monkeypatch.setattr(zl, "_PIECE", 4)  # 6 pieces a sample
    slow = zl._Producer._read

    def read(self, *args):
        time.sleep(0.01)
        slow(self, *args)

    monkeypatch.setattr(zl._Producer, "_read", read)
    fds = open_fds()
    l = Loader(os.path.join(m.path, "x"), 4, device="cpu", threads=1, prefetch=2, open_ahead=0)
    it = iter(l)
    next(it)
    t = threading.Thread(target=l.close, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "close() hangs"
    del it
    assert open_fds() <= fds, "sample files left open"


def test_profile_stages(mount, index_store):
    """profile=True says where an epoch went; without it, nothing."""
    m = mount(index_store)
    d = os.path.join(m.path, "x")
    l = Loader(d, 4, device="cpu", threads=2, profile=True)
    assert l.stages() == {}
    assert len(epoch_indices(l)) == N
    st = l.stages()
    assert st["samples"] == N and st["batches"] == -(-N // 4) and st["threads"] == 2
    assert st["bytes"] == N * zarrfs.SampleDir(d).sample_nbytes
    assert st["pread"] > 0 and st["open"] > 0 and st["epoch"] > 0
    assert st["consumer_wait"] <= st["epoch"]
    plain = Loader(d, 4, device="cpu")
    assert len(epoch_indices(plain)) == N and plain.stages() == {}


def test_threads_stop_when_abandoned(mount, index_store):
    m = mount(index_store)
    base = threading.active_count()
    l = Loader(os.path.join(m.path, "x"), 1, device="cpu", threads=4, prefetch=3)
    it = iter(l)
    next(it)
    assert threading.active_count() > base
    del it
    import gc
    gc.collect()
    deadline = time.time() + 10
    while threading.active_count() > base and time.time() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= base, "loader threads still running after the iterator was dropped"


def test_bad_arguments(mount, index_store):
    m = mount(index_store)
    d = os.path.join(m.path, "x")
    for kw in ({"rank": 2, "world": 2}, {"world": 0}, {"prefetch": 0}, {"shard": "random"}, {"rank": 1, "world": 2, "shard": "Interleaved"},
               {"threads": 0}, {"threads": -2}, {"open_ahead": -1}):
        with pytest.raises(ValueError):
            Loader(d, 2, device="cpu", **kw)
    with pytest.raises(ValueError):
        Loader(d, 0, device="cpu")
    with pytest.raises(ValueError, match="sidecar"):
        Loader(m.path, 2, device="cpu")


@pytest.mark.gpu
def test_cuda_batches_equal_numpy(mount, index_store):
    need_gpu()
    m = mount(index_store)
    d = os.path.join(m.path, "x")
    seen = []
    for rank in range(2):
        # The host path: with a mount that decodes on the GPU, 'auto' would
        # take the ring (test_deliver.py).
        l = Loader(d, 4, device="cuda", rank=rank, world=2, shuffle=True, seed=5, decode="host")
        assert "pinned" in repr(l)
        for batch, coords in l:
            assert batch.is_cuda and batch.dtype == torch.float32
            host = batch.cpu().numpy()
            for row, f in zip(host, coords["file"]):
                assert row.tobytes() == np.load(f).tobytes()
            seen += coords["index"].tolist()
    assert sorted(seen) == list(range(N))


@pytest.mark.gpu
def test_cuda_second_iteration_stops_the_first(mount, index_store):
    need_gpu()
    m = mount(index_store)
    # copy=True: the batches are kept, which on a ring path (a mount that
    # decodes on the GPU) needs copies of the slots.
    l = Loader(os.path.join(m.path, "x"), 2, device="cuda", prefetch=2, copy=True)
    first = iter(l)
    next(first)
    second = list(l)
    assert sum(len(b) for b, _ in second) == N
    for batch, coords in second:
        for row, f in zip(batch.cpu().numpy(), coords["file"]):
            assert row.tobytes() == np.load(f).tobytes()
    with pytest.raises(RuntimeError, match="another iteration"):
        for _ in first:
            pass


@pytest.mark.parametrize("open_ahead", [0, 5])
def test_open_ahead_starts_fills(mount, index_store, open_ahead):
    """On a cold mount the loader opens the samples after the batch it reads,
    so that they fill at once, whatever the batch size (the mount's own
    readahead, which would fill these sequential samples too, is off)."""
    m = mount(index_store, readahead=0)
    cache = m.cache

    def filled():
        return sum(f.endswith(".npy") for _, _, fs in os.walk(cache) for f in fs)

    l = Loader(os.path.join(m.path, "x"), 1, device="cpu", threads=2, prefetch=1, open_ahead=open_ahead)
    base = filled()  # the coordinates the loader read
    it = iter(l)
    batch, coords = next(it)
    assert coords["index"].tolist() == [0]
    # The producer reads batches 0-2 (one handed out, one queued, one
    # waiting to be queued); open_ahead more samples follow the last.
    want = base + 3 + open_ahead
    deadline = time.time() + 10
    while filled() < want and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert filled() == want
    assert epoch_indices_rest(it) == list(range(1, N))
    assert filled() == base + N


def test_first_fills_start_before_the_producer(mount, index_store, monkeypatch):
    """The first batch and the open_ahead samples after it start filling
    when the epoch is made, before the producer runs (on the GPU, while the
    ring is pinned): here the producer never runs, and they fill."""
    import zarrfs.loader as zl

    m = mount(index_store, readahead=0)
    cache = m.cache

    def filled():
        return sum(f.endswith(".npy") for _, _, fs in os.walk(cache) for f in fs)

    monkeypatch.setattr(zl._Producer, "run", lambda self: None)
    l = Loader(os.path.join(m.path, "x"), 2, device="cpu", threads=2, prefetch=1, open_ahead=3)
    base = filled()
    it = iter(l)
    want = base + 2 + 3
    deadline = time.time() + 10
    while filled() < want and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert filled() == want
    it.close()


def epoch_indices_rest(it):
    got = []
    for batch, coords in it:
        got += [value(b) for b in batch]
    return got


class _FakeCudart:
    """Stands in for torch.cuda.cudart(): records what is registered."""

    def __init__(self, err=0):
        self.err = err
        self.registered = []
        self.unregistered = []

    def cudaHostRegister(self, ptr, n, flags):
        self.registered.append((ptr, n, flags))
        return self.err

    def cudaHostUnregister(self, ptr):
        self.unregistered.append(ptr)
        return 0


def test_pinned_ring_buffer_registered_then_unregistered(monkeypatch):
    """A ring slot is anonymous memory registered whole with
    cudaHostRegister (portable), writable through the tensor, and
    unregistered when the tensor goes, before its memory is unmapped."""
    import gc

    import torch

    import zarrfs.loader as zl

    fake = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    n = 3 << 20
    t = zl._pinned(n)
    assert t.dtype == torch.uint8 and t.numel() == n
    assert fake.registered == [(t.data_ptr(), n, 1)]
    assert t.data_ptr() % 4096 == 0  # O_DIRECT reads may land there
    t[:] = 7
    assert int(t[n - 1]) == 7
    ptr = t.data_ptr()
    view = t.numpy()[:16]  # a view keeps the memory registered
    del t
    gc.collect()
    assert fake.unregistered == []
    del view
    gc.collect()
    assert fake.unregistered == [ptr]


def test_pinned_falls_back_to_torch(monkeypatch):
    """A registration that fails leaves the slot to torch's pinned
    allocation."""
    import torch

    import zarrfs.loader as zl

    fake = _FakeCudart(err=1)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    calls = []
    real_empty = torch.empty

    def empty(*a, **kw):
        calls.append(kw.get("pin_memory"))
        kw.pop("pin_memory", None)
        return real_empty(*a, **kw)

    monkeypatch.setattr(torch, "empty", empty)
    t = zl._pinned(1 << 20)
    assert len(fake.registered) == 1 and calls == [True] and t.numel() == 1 << 20


def test_fault_in_touches_every_page():
    """Every 4 KiB page of a ring slot is touched, by threads that split it
    in whole huge pages, up to an uneven end; nothing else is written."""
    import zarrfs.loader as zl

    for n in (4096, (40 << 20) + 12345):
        arr = np.full(n, 7, dtype=np.uint8)
        zl._fault_in(arr)
        assert not arr[::4096].any()
        rest = np.ones(n, dtype=bool)
        rest[::4096] = False
        assert (arr[rest] == 7).all()
