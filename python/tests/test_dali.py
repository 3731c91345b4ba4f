import collections
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, need_gpu, need_module, sample_blobs

dali = need_module("nvidia.dali")
need_module("torch")  # DALI's PyTorch iterator, as training uses it

from nvidia.dali import pipeline_def  # noqa: E402
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy  # noqa: E402

import zarrfs  # noqa: E402
import zarrfs.dali  # noqa: E402

N = 23  # samples in index_store: uneven shards, partial last batches


def epochs(sample_dir, n_epochs=2, batch_size=4, **reader):
    """The global indices each epoch of one reader yields (sample k holds k)."""

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None, seed=5)
    def pipe():
        return zarrfs.dali.numpy_reader(sample_dir, **reader)

    p = pipe()
    it = DALIGenericIterator([p], ["x"], reader_name=os.path.basename(sample_dir),
                             last_batch_policy=LastBatchPolicy.PARTIAL)
    out = []
    for _ in range(n_epochs):
        got = []
        for b in it:
            got += [int(round(float(v))) for v in b[0]["x"][:, 0, 0]]
        it.reset()
        out.append(got)
    return out


def check_cover(per_rank, world, shuffle):
    """Each epoch of each rank reads its contiguous block once; together every sample once."""
    for rank, eps in enumerate(per_rank):
        first, step, count = zarrfs.shard_of(N, rank, world)
        block = list(range(first, first + count))
        for e, got in enumerate(eps):
            assert sorted(got) == block, (rank, e, got)
            if not shuffle:
                assert got == block
    for e in range(len(per_rank[0])):
        counts = collections.Counter(k for eps in per_rank for k in eps[e])
        assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_plain_mount(mount, index_store, world, shuffle):
    m = mount(index_store)
    x = os.path.join(m.path, "x")
    per_rank = [epochs(x, rank=r, world=world, shuffle=shuffle) for r in range(world)]
    check_cover(per_rank, world, shuffle)
    if shuffle and N // world > 3:
        assert per_rank[0][0] != per_rank[0][1], "shuffle=True gives each epoch its own order"


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_per_rank_direct_mounts(mount, index_store, world, shuffle):
    per_rank = []
    for r in range(world):
        m = mount(index_store, rank=r, world=world, direct=True, readahead=0)
        x = os.path.join(m.path, "x")
        assert os.path.islink(os.path.join(x, zarrfs.SampleDir(x).names[0]))
        per_rank.append(epochs(x, shuffle=shuffle))
    check_cover(per_rank, world, shuffle)


def test_building_fills_nothing(mount, index_store):
    """On a direct mount, building the pipeline resolves no link; reading fills what it reads."""
    m = mount(index_store, direct=True, readahead=0)
    x = os.path.join(m.path, "x")

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def pipe():
        return zarrfs.dali.numpy_reader(x, rank=1, world=2)

    p = pipe()
    p.build()
    assert p.reader_meta("x")["epoch_size"] == 12  # rank 1 of 2 holds samples 11..22
    assert sample_blobs(m.cache, "x") == []
    out = p.run()[0].as_array()
    assert [int(v) for v in out[:, 0, 0]] == [11, 12, 13, 14]
    filled = sample_blobs(m.cache, "x")
    assert {"11.npy", "12.npy", "13.npy", "14.npy"} <= set(filled) and "00.npy" not in filled


def test_rank_files(mount, index_store):
    m = mount(index_store)
    x = os.path.join(m.path, "x")
    assert zarrfs.dali.rank_files(x) == [f"{k:02d}.npy" for k in range(N)]
    assert zarrfs.dali.rank_files(x, 0, 2) == [f"{k:02d}.npy" for k in range(11)]
    assert zarrfs.dali.rank_files(x, 1, 2) == [f"{k:02d}.npy" for k in range(11, N)]
    assert zarrfs.dali.rank_files(x, 1, 3, "interleaved") == [f"{k:02d}.npy" for k in range(1, N, 3)]
    r = mount(index_store, rank=1, world=3, shard="interleaved")
    rx = os.path.join(r.path, "x")
    assert zarrfs.dali.rank_files(rx) == [f"{k:02d}.npy" for k in range(1, N, 3)]
    assert zarrfs.dali.rank_files(rx, 1, 3) == zarrfs.dali.rank_files(rx)
    with pytest.raises(ValueError, match="lists the samples of rank 1 of 3"):
        zarrfs.dali.rank_files(rx, 0, 2)


def test_gpu_needs_a_direct_mount(mount, index_store):
    m = mount(index_store)

    @pipeline_def(batch_size=2, num_threads=1, device_id=0)
    def pipe():
        return zarrfs.dali.numpy_reader(os.path.join(m.path, "x"), device="gpu")

    with pytest.raises(ValueError, match="cuFile, which cannot read files on FUSE; mount with --direct"):
        pipe()


def test_reader_refuses_its_own_arguments(mount, index_store):
    m = mount(index_store)

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe():
        return zarrfs.dali.numpy_reader(os.path.join(m.path, "x"), num_shards=2)

    with pytest.raises(TypeError, match="sets num_shards itself"):
        pipe()


@pytest.mark.parametrize("ring", [False, True], ids=["files", "ring"])
def test_example_pipeline(mount, index_store, ring):
    m = mount(index_store, delivery="host" if ring else None)
    ex = os.path.join(REPO, "python", "examples", "dali_training.py")
    env = dict(os.environ, RANK="1", WORLD_SIZE="2")
    # -W error::UserWarning: the example must run without a warning of its
    # own (float() of a tensor that requires grad warned once per epoch).
    out = subprocess.run([sys.executable, "-W", "error::UserWarning:__main__", ex, os.path.join(m.path, "x"), "--cpu",
                          "--epochs", "2", "--batch-size", "4"] + (["--ring"] if ring else []),
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr
    lines = [l for l in out.stdout.splitlines() if l.startswith("rank 1/2 epoch")]
    assert len(lines) == 2 and all(": 12 samples in" in l for l in lines), out.stdout


@pytest.mark.gpu
def test_gpu_reader_on_direct_mount(mount, index_store):
    need_gpu()
    m = mount(index_store, direct=True)
    x = os.path.join(m.path, "x")

    @pipeline_def(batch_size=4, num_threads=1, device_id=0)
    def pipe():
        return zarrfs.dali.numpy_reader(x, device="gpu", pad_last_batch=False)

    p = pipe()
    p.build()
    got = []
    while len(got) < N:
        got += [int(v) for v in p.run()[0].as_cpu().as_array()[:, 0, 0]]
    assert got[:N] == list(range(N))
    np.testing.assert_array_equal(np.load(os.path.join(x, "05.npy"))[0, 0], 5)


# The ring reader: batches from the mount's ring (decode="device"), here
# in the mount's test mode (--delivery host: a ring in host memory the CPU
# decodes into), through DALI CPU pipelines.

def ring_epochs(sample_dir, n_epochs=2, batch_size=4, **reader):
    """Each epoch of a ring_reader pipeline: its batches' bytes."""

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None)
    def pipe():
        return zarrfs.dali.ring_reader(sample_dir, device="cpu", **reader)

    p = pipe()
    it = DALIGenericIterator([p], ["x"])
    out = []
    for _ in range(n_epochs):
        out.append([b[0]["x"].numpy().copy() for b in it])
        it.reset()
    return out


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_ring_reader_equals_files_in_the_loaders_order(mount, index_store, world, shuffle):
    """Every batch equals numpy.load of the files zarrfs.torch.Loader reads
    for the same rank, epoch and seed (the share warm --rank/--world fills),
    and each epoch is reshuffled."""
    from zarrfs.loader import Loader

    m = mount(index_store, delivery="host")
    x = os.path.join(m.path, "x")
    per_rank = []
    for rank in range(world):
        got = ring_epochs(x, rank=rank, world=world, shuffle=shuffle, seed=3)
        ref = Loader(x, 4, device="cpu", decode="host", rank=rank, world=world, shuffle=shuffle, seed=3)
        eps = []
        for e, batches in enumerate(got):
            ref.set_epoch(e)
            want = [c["file"] for _, c in ref]
            assert [len(b) for b in batches] == [len(f) for f in want], (rank, e)
            for b, files in zip(batches, want):
                assert b.dtype == np.float32 and b.shape[1:] == (2, 3)
                assert b.tobytes() == np.stack([np.load(f) for f in files]).tobytes(), (rank, e, files)
            eps.append([int(round(float(v))) for b in batches for v in b[:, 0, 0]])
        per_rank.append(eps)
    check_cover(per_rank, world, shuffle)
    if shuffle:
        assert per_rank[0][0] != per_rank[0][1], "each epoch has its own order"
    doc = json.loads(subprocess.run([os.environ["ZARRFS_BIN"], "status", m.path, "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    doc = doc[0] if isinstance(doc, list) else doc
    # Through the ring: decoded into it, or copied from the files the
    # cache held (np.load above read them).
    d = doc["delivery"]
    assert d["device_samples"] + d["host_samples"] >= 2 * N and d["device_samples"] > 0, "the batches came through the ring"


def test_ring_source_in_external_source(mount, index_store):
    """ring_source is the iterable for a user's own fn.external_source;
    DALI's outputs are its copies, not the ring's memory."""
    m = mount(index_store, delivery="host")
    x = os.path.join(m.path, "x")
    src = zarrfs.dali.ring_source(x, 4, device="cpu", rank=1, world=2)
    assert len(src) == 3 and src.ndim == 2 and src.cuda_stream is None  # samples 11..22

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def pipe():
        from nvidia.dali import fn
        return fn.external_source(source=src, batch=True, cycle="raise", dtype=src.dtype, ndim=src.ndim)

    p = pipe()
    p.build()
    ring = src.loader._dring
    lo, hi = ring.host.ctypes.data, ring.host.ctypes.data + ring.ring_bytes
    got = []
    for _ in range(3):
        out, = p.run()
        assert not any(lo <= out[i].data_ptr() < hi for i in range(len(out)))
        got += [int(round(float(v))) for v in out.as_array()[:, 0, 0]]
    assert got == list(range(11, 23))
    with pytest.raises(StopIteration):
        p.run()
    src.close()


def test_ring_reader_raises_naming_the_file(mount, index_store, tmp_path):
    """A sample the mount cannot fill ends the epoch with an OSError naming
    its file and chunk, as the Loader's does."""
    store = tmp_path / "broken.zarr"
    shutil.copytree(index_store, store)
    (store / "x" / "c" / "1" / "0" / "0").write_bytes(b"garbage!" * 8)  # samples 4..7
    m = mount(str(store), delivery="host")
    with pytest.raises(OSError, match=r"x/0[4-7]\.npy: .*x/c/1/0/0"):
        ring_epochs(os.path.join(m.path, "x"), n_epochs=1)


def test_ring_reader_refuses_what_breaks_the_ring(mount, index_store):
    m = mount(index_store, delivery="host")
    x = os.path.join(m.path, "x")
    for bad in ("no_copy", "parallel", "cuda_stream", "cycle"):
        @pipeline_def(batch_size=2, num_threads=1, device_id=None)
        def pipe():
            return zarrfs.dali.ring_reader(x, device="cpu", **{bad: True})

        with pytest.raises(TypeError, match=f"sets {bad} itself"):
            pipe()

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def gpu_without_a_gpu():
        return zarrfs.dali.ring_reader(x, device="gpu")

    with pytest.raises(ValueError, match="the pipeline has no GPU"):
        gpu_without_a_gpu()
    plain = mount(index_store)  # no GPU here, so no ring
    with pytest.raises(RuntimeError, match="decode='device'"):
        zarrfs.dali.ring_source(os.path.join(plain.path, "x"), 2, device="cpu")
    with pytest.raises(RuntimeError, match="inside a pipeline definition"):
        zarrfs.dali.ring_reader(x, device="cpu")


@pytest.mark.gpu
def test_gpu_ring_reader_equals_files(mount, index_store):
    """A GPU pipeline fed by the mount's ring in device memory: every batch
    equals numpy.load of the Loader's files, over two shuffled epochs."""
    need_gpu()
    from zarrfs.loader import Loader

    m = mount(index_store)
    x = os.path.join(m.path, "x")

    @pipeline_def(batch_size=4, num_threads=1, device_id=0)
    def pipe():
        return zarrfs.dali.ring_reader(x, device="gpu", shuffle=True, seed=2) * 1  # a GPU operator reads it

    p = pipe()
    it = DALIGenericIterator([p], ["x"])
    ref = Loader(x, 4, device="cpu", decode="host", shuffle=True, seed=2)
    for e in range(2):
        ref.set_epoch(e)
        want = [c["file"] for _, c in ref]
        got = [b[0]["x"] for b in it]
        it.reset()
        assert len(got) == len(want)
        for b, files in zip(got, want):
            assert b.is_cuda
            assert b.cpu().numpy().tobytes() == np.stack([np.load(f) for f in files]).tobytes(), (e, files)
