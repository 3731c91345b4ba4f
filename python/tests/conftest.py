"""Shared fixtures: the zarrfs binary, real mounts, stores written with zarr-python.

A test that needs a tool (FUSE, the binary, zarr-python, DALI, PyTorch)
skips without it on a developer's machine and fails under CI=true; only GPU
tests skip everywhere (they run in `make test-gpu`).
"""

import importlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import zarrfs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# As Go's strconv.ParseBool reads $CI (internal/testenv), so both halves agree.
CI = os.environ.get("CI", "") in ("1", "t", "T", "true", "TRUE", "True")


def need(what: str, ok: bool, why: str):
    if ok:
        return
    if CI:
        pytest.fail(f"{what} is needed ({why}) and CI=true")
    # allow_module_level: a test module may need a tool at import (DALI
    # for test_dali.py); inside a test it changes nothing.
    pytest.skip(f"{what} is needed ({why})", allow_module_level=True)


def need_module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        need(name, False, f"import failed: {e}")


def need_gpu():
    """Skip (also in CI) unless cupy, kvikio and a CUDA device are there."""
    try:
        import cupy
        import kvikio  # noqa: F401

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return
        why = "no CUDA device"
    except Exception as e:  # ImportError, or the CUDA runtime refusing
        why = f"{type(e).__name__}: {e}"
    # The test's name in the reason: pytest's summary groups skips of one
    # place and reason into one line, which would hide which tests skipped.
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    pytest.skip(f"{test}: needs an NVIDIA GPU with cupy and kvikio (make test-gpu): {why}")


@pytest.fixture(scope="session")
def zarrfs_bin():
    try:
        p = zarrfs.find_binary()  # as Mount finds it
    except FileNotFoundError as e:
        need("the zarrfs binary", False, str(e))
    os.environ["ZARRFS_BIN"] = p
    return p


@pytest.fixture(scope="session")
def fuse():
    need("/dev/fuse", os.path.exists("/dev/fuse"), "mounts are real FUSE mounts")
    need("root or fusermount3", os.geteuid() == 0 or shutil.which("fusermount3") is not None, "to mount")


@pytest.fixture
def mount(zarrfs_bin, fuse, tmp_path):
    """mount(source, **flags) -> a started zarrfs.Mount, stopped after the test.

    Each mount gets its own mountpoint and, unless cache= is given, cache.
    """
    started = []

    def start(source, **flags):
        i = len(started)
        flags.setdefault("cache", str(tmp_path / f"cache{i}"))
        m = zarrfs.Mount(str(source), str(tmp_path / f"mnt{i}"), **flags)
        m.start()
        m.cache = flags["cache"]
        started.append(m)
        return m

    yield start
    for m in reversed(started):
        m.stop()


@pytest.fixture(scope="session")
def fixtures_dir():
    """The stores tensorstore wrote (internal/fixtures/make_tensorstore.py),
    in .cache/fixtures of the checkout; the script makes them when they are
    missing or stale, and does nothing otherwise."""
    out = os.path.join(REPO, ".cache", "fixtures", "tensorstore")
    script = os.path.join(REPO, "internal", "fixtures", "make_tensorstore.py")
    r = subprocess.run([sys.executable, script, out], capture_output=True, text=True)
    if r.returncode == 3:  # numpy or tensorstore missing
        need("tensorstore", False, r.stderr.strip())
    if r.returncode != 0:
        pytest.fail(f"{script} {out}: exit {r.returncode}\n{r.stderr}")
    return out


def sample_blobs(cache_dir, name):
    """Sample files of directory name filled into the cache so far."""
    out = []
    root = os.path.join(cache_dir, "blobs")
    if not os.path.isdir(root):
        return out
    for layout in os.listdir(root):
        d = os.path.join(root, layout, name)
        if os.path.isdir(d):
            out += sorted(os.listdir(d))
    return out


def write_index_store(path, n, hours=6):
    """A Zarr v3 store (zarr-python) whose sample k of x is filled with k.

    x is (time, a, b) float32 in chunks of 4 steps, time is int64 hours
    since 2000-01-01 (CF units, so it decodes to datetime64).
    """
    zarr = need_module("zarr")
    g = zarr.open_group(str(path), mode="w", attributes={"title": "index store"})
    x = g.create_array("x", shape=(n, 2, 3), chunks=(4, 2, 3), dtype="f4",
                       dimension_names=["time", "a", "b"], attributes={"units": "1"})
    x[:] = np.arange(n, dtype="f4")[:, None, None] + np.arange(6, dtype="f4").reshape(2, 3) / 10
    t = g.create_array("time", shape=(n,), chunks=(n,), dtype="i8", dimension_names=["time"],
                       attributes={"units": "hours since 2000-01-01"})
    t[:] = np.arange(n) * hours
    a = g.create_array("a", shape=(2,), chunks=(2,), dtype="i4", dimension_names=["a"])
    a[:] = [10, 20]
    return str(path)


@pytest.fixture(scope="session")
def index_store(tmp_path_factory):
    """23 samples: uneven shards for 2 ranks and a partial last batch."""
    return write_index_store(tmp_path_factory.mktemp("stores") / "index.zarr", 23)


@pytest.fixture(scope="session")
def big_store(tmp_path_factory):
    """100,000 tiny time steps (zarr-python), chunks of 1,000 steps."""
    zarr = need_module("zarr")
    n = 100_000
    path = tmp_path_factory.mktemp("stores") / "big.zarr"
    g = zarr.open_group(str(path), mode="w")
    t = g.create_array("time", shape=(n,), chunks=(n,), dtype="i8", dimension_names=["time"],
                       attributes={"units": "hours since 1979-01-01"})
    t[:] = np.arange(n)
    lat = g.create_array("lat", shape=(4,), chunks=(4,), dtype="f8", dimension_names=["lat"])
    lat[:] = [10, 20, 30, 40]
    x = g.create_array("x", shape=(n, 4, 8), chunks=(1000, 4, 8), dtype="f4",
                       dimension_names=["time", "lat", "lon"], attributes={"units": "K"})
    x[:] = np.arange(n, dtype="f4")[:, None, None] + np.arange(32, dtype="f4").reshape(4, 8) / 100
    return str(path)


def write_view(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)
