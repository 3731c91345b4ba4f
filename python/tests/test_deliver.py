"""Device delivery end to end, in its test mode: a real mount started with
--delivery host decodes samples into a ring of host shared memory that the
Loader maps, so the protocol, the ring's lifecycle, slot reuse, errors and
the death of either side run here without a GPU (make test-gpu runs the
same Loader against device memory)."""

import contextlib
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import zarrfs
from conftest import need_module, write_view

torch = need_module("torch")

from zarrfs._deliver import DeliveryError, recv_line, socket_path  # noqa: E402
from zarrfs.loader import Loader  # noqa: E402

N = 23  # index_store: sample k of x is filled with k + (0..5)/10


def status(m):
    out = subprocess.run([os.environ["ZARRFS_BIN"], "status", m.path, "--json"], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    return doc[0] if isinstance(doc, list) else doc


def in_ring(t, ring):
    base = ring.host.ctypes.data
    return base <= t.data_ptr() < base + ring.ring_bytes


def epochs(loader, n=2):
    got = []
    for e in range(n):
        loader.set_epoch(e)
        got.append([(b.clone(), c["index"].tolist()) for b, c in loader])
    return got


@pytest.mark.parametrize("shuffle", [False, True])
def test_ring_batches_equal_files(mount, index_store, tmp_path, shuffle):
    view = write_view(tmp_path / "v.yaml", "views:\n  - name: train\n    channels:\n      - var: x\n        select: {a: all}\n")
    m = mount(index_store, delivery="host", view=[view])
    for sub in ("x", "train"):
        d = os.path.join(m.path, sub)
        dev = Loader(d, 4, device="cpu", decode="device", shuffle=shuffle, seed=5, prefetch=2)
        host = Loader(d, 4, device="cpu", decode="host", shuffle=shuffle, seed=5)
        assert dev.path_kind == "ring-host" and host.path_kind == "pread"
        assert "decode='device'" in repr(dev)
        a, b = epochs(dev), epochs(host)
        assert [idx for _, idx in a[0]] == [idx for _, idx in b[0]]
        for ea, eb in zip(a, b):
            for (ta, ia), (tb, ib) in zip(ea, eb):
                assert ia == ib
                assert ta.dtype == torch.float32 and ta.shape[1:] == (2, 3)
                assert ta.numpy().tobytes() == tb.numpy().tobytes()
        dev.close()
    doc = status(m)["delivery"]
    assert doc["rings_opened"] == 2 and doc["device_samples"] == 2 * 2 * N and doc["errors"] == 0
    assert doc["compressed_bytes"] > 0


def test_batches_backed_by_slots_reused_after_the_next(mount, index_store):
    m = mount(index_store, delivery="host")
    d = os.path.join(m.path, "x")
    l = Loader(d, 2, device="cpu", decode="device", prefetch=1)  # two slots
    it = iter(l)
    b0, _ = next(it)
    assert in_ring(b0, l._dring)
    first = b0.clone()
    b1, _ = next(it)  # b0's slot is given back now...
    b2, c2 = next(it)  # ...and holds batch 2
    assert b2.data_ptr() == b0.data_ptr()
    assert b0.numpy().tobytes() == b2.numpy().tobytes() != first.numpy().tobytes()
    assert [int(round(float(x.reshape(-1)[0]))) for x in b2] == c2["index"].tolist() == [4, 5]
    it.close()
    kept = Loader(d, 2, device="cpu", decode="device", prefetch=1, copy=True)
    got = [b for b, _ in kept]
    assert not any(in_ring(b, kept._dring) for b in got)
    assert np.concatenate([b.numpy() for b in got]).tobytes() == np.concatenate(
        [np.load(f) for f in zarrfs.SampleDir(d).files]).tobytes()


def test_auto_and_unavailable(mount, index_store):
    m = mount(index_store, delivery="host")
    d = os.path.join(m.path, "x")
    # auto never takes the test mode: CPU tensors come from the files.
    assert Loader(d, 2, device="cpu").path_kind == "pread"
    off = mount(index_store, delivery="off")
    assert not os.path.exists(socket_path(off.path))
    with pytest.raises(RuntimeError, match=r"decode='device': no delivery socket"):
        Loader(os.path.join(off.path, "x"), 2, device="cpu", decode="device")
    plain = mount(index_store)  # auto: no GPU here, so no ring
    with pytest.raises(RuntimeError, match=r"decode='device': .*delivers into GPU memory, not host"):
        Loader(os.path.join(plain.path, "x"), 2, device="cpu", decode="device")
    with pytest.raises(ValueError, match="decode"):
        Loader(d, 2, device="cpu", decode="gpu")


def test_default_depth_gives_a_slot_back_before_the_ring(mount, tmp_path):
    # Samples of 1.33 MB: a slot of 4 is 6 MiB (slots are 2 MiB-aligned).
    # --memory 128MiB bounds the rings to 20 MiB together: 3 slots, not 4.
    zarr = need_module("zarr")
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    x = g.create_array("x", shape=(8, 1300, 256), chunks=(1, 1300, 256), dtype="f4", dimension_names=["time", "a", "b"])
    x[:] = np.arange(8 * 1300 * 256, dtype="f4").reshape(8, 1300, 256)
    tight = mount(str(tmp_path / "s.zarr"), delivery="host", memory="128MiB")
    d = os.path.join(tight.path, "x")
    # An explicit depth is the user's: the ring it needs or none.
    with pytest.raises(RuntimeError, match=r"decode='device': .*4 slots of 4 samples .* may hold 20971520"):
        Loader(d, 4, device="cpu", decode="device", prefetch=3)
    # The default's depth (3 fills, 4 slots) gives a slot back instead.
    l = Loader(d, 4, device="cpu", decode="device")
    assert l.path_kind == "ring-host" and l._dring.slots == 3 and "prefetch=2," in repr(l)
    got = [(b.clone(), c["file"]) for b, c in l]
    assert len(got) == 2
    for b, files in got:
        assert b.numpy().tobytes() == np.stack([np.load(f) for f in files]).tobytes()
    l.close()
    # Where the mount holds it, the default ring has a slot for each of
    # 3 fills and the one in hand.
    roomy = mount(str(tmp_path / "s.zarr"), delivery="host")
    l = Loader(os.path.join(roomy.path, "x"), 4, device="cpu", decode="device")
    assert l._dring.slots == 4 and "prefetch=3," in repr(l)
    l.close()
    # The files keep 2 batches read ahead by default.
    assert "prefetch=2," in repr(Loader(d, 4, device="cpu", decode="host"))


def test_auto_reads_the_files_the_cache_holds(mount, index_store, monkeypatch):
    """decode="auto" asks whether the cache holds every sample of its share
    before it asks for a ring: where it does (files read before, as after
    zarrfs warm), the loader asks for no ring and reads the files, and asks
    again at each epoch; a share with a sample not held gets its ring. The
    share is the positions rank R of W reads, as the daemon lists them."""
    from zarrfs import _deliver as zd
    from zarrfs._samples import shard_of
    monkeypatch.setattr(Loader, "_AUTO_RINGS", ("cuda", "host"))  # as on a GPU, in the test mode
    asked, rings = [], []
    holds, ring_for = zd.cache_holds, zd.ring_for
    monkeypatch.setattr(zd, "cache_holds", lambda *a: asked.append(a[1]) or holds(*a))
    monkeypatch.setattr(zd, "ring_for", lambda *a: rings.append(a) or ring_for(*a))
    m = mount(index_store, delivery="host")
    d = os.path.join(m.path, "x")
    sd = zarrfs.SampleDir(d)

    def rows_of(l):
        return [t.numpy().tobytes() for b, _ in l for t in b]

    cold = Loader(d, 4, device="cpu", rank=1, world=2)
    assert cold.path_kind == "ring-host" and asked == [shard_of(N, 1, 2)] and len(rings) == 1
    cold.close()
    first, step, count = shard_of(N, 1, 2)
    # Rank 1's share read, into the cache.
    want = [np.load(sd.file(k)).tobytes() for k in range(first, first + step * count, step)]
    asked.clear()
    warm = Loader(d, 4, device="cpu", rank=1, world=2)
    assert warm.path_kind == "pread" and asked == [(first, step, count)]
    for e in range(2):
        warm.set_epoch(e)
        assert rows_of(warm) == want
        assert warm.path_kind == "pread"
    assert len(asked) == 2 and len(rings) == 1  # again at the second epoch, not at the first; no ring
    others = Loader(d, 4, device="cpu", rank=0, world=2)  # not read: a ring
    inter = Loader(d, 4, device="cpu", rank=1, world=2, shard="interleaved")  # some not read
    assert others.path_kind == inter.path_kind == "ring-host"
    assert asked[2:] == [shard_of(N, 0, 2), shard_of(N, 1, 2, "interleaved")]
    assert status(m)["delivery"]["rings_opened"] == 3  # cold, others, inter
    others.close()
    inter.close()


def test_auto_lets_go_of_its_ring_once_the_cache_holds_its_share(mount, index_store, monkeypatch):
    """A decode="auto" loader that took a ring asks, at each later epoch's
    start, whether the cache came to hold its share (a warm that ran
    meanwhile): then it reads the files and its ring is freed once the
    batches over it go; until then, and with decode="device" always, it
    keeps the ring."""
    from zarrfs import _deliver as zd
    monkeypatch.setattr(Loader, "_AUTO_RINGS", ("cuda", "host"))  # as on a GPU, in the test mode
    asked = []
    holds = zd.cache_holds
    monkeypatch.setattr(zd, "cache_holds", lambda *a: asked.append(a[1]) or holds(*a))
    m = mount(index_store, delivery="host")
    d = os.path.join(m.path, "x")
    sd = zarrfs.SampleDir(d)
    share = sd.positions(0, 2)
    auto = Loader(d, 4, device="cpu", rank=0, world=2, shuffle=False)
    dev = Loader(d, 4, device="cpu", rank=0, world=2, shuffle=False, decode="device")
    assert auto.path_kind == dev.path_kind == "ring-host"

    def rows(l, e):
        l.set_epoch(e)
        return [t.numpy().tobytes() for b, _ in l for t in b]

    first = rows(auto, 0)
    assert rows(auto, 1) == first and auto.path_kind == "ring-host"  # not held: the ring stays
    assert len(asked) == 2  # at the open and at the second epoch
    want = [np.load(sd.file(int(k))).tobytes() for k in share]  # rank 0's share into the cache
    assert first == want
    got = rows(auto, 2)
    assert auto.path_kind == "pread" and got == first and len(asked) == 3
    assert rows(dev, 0) == first and dev.path_kind == "ring-host" and len(asked) == 3
    dev.close()
    deadline = time.time() + 10
    while status(m)["delivery"]["rings_open"] and time.time() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert status(m)["delivery"]["rings_open"] == 0  # auto's ring went with its batches
    assert status(m)["delivery"]["rings_opened"] == 2


def test_damaged_chunk_names_its_file(mount, index_store, tmp_path):
    store = tmp_path / "broken.zarr"
    shutil.copytree(index_store, store)
    (store / "x" / "c" / "1" / "0" / "0").write_bytes(b"garbage!" * 8)  # samples 4..7
    m = mount(str(store), delivery="host")
    l = Loader(os.path.join(m.path, "x"), 2, device="cpu", decode="device")
    with pytest.raises(OSError, match=r"x/0[4-7]\.npy: .*x/c/1/0/0"):
        for _ in l:
            pass
    # The ring serves the next epoch; samples before the damage still come.
    got = []
    with pytest.raises(OSError):
        for b, c in l:
            got += c["index"].tolist()
    assert got[:4] == [0, 1, 2, 3]
    assert status(m)["delivery"]["errors"] >= 2
    # A caller that caught the error and dropped the loader and its batches
    # gets the ring freed then, not at the collector's next full pass: the
    # error's traceback holds the caller's frame, and no frame of the
    # loader's may hold the error in turn.
    del l, b, c
    gc.collect()
    deadline = time.time() + 10
    while status(m)["delivery"]["rings_open"] and time.time() < deadline:
        time.sleep(0.05)
    assert status(m)["delivery"]["rings_open"] == 0
    gc.disable()
    try:
        def epoch():
            l = Loader(os.path.join(m.path, "x"), 2, device="cpu", decode="device")
            try:
                for b, c in l:
                    pass
            except OSError:
                pass
        epoch()
        deadline = time.time() + 10
        while status(m)["delivery"]["rings_open"] and time.time() < deadline:
            time.sleep(0.05)
        assert status(m)["delivery"]["rings_open"] == 0, "the ring outlived the loader and its batches"
    finally:
        gc.enable()


_READER = """
import os, sys, time
sys.path.insert(0, {src!r})
from zarrfs.loader import Loader
l = Loader({d!r}, 2, device="cpu", decode="device")
it = iter(l)
next(it)
print("ready", flush=True)
time.sleep(60)
"""


def test_dead_reader_frees_its_ring(mount, index_store):
    m = mount(index_store, delivery="host")
    d = os.path.join(m.path, "x")
    src = os.path.dirname(os.path.dirname(zarrfs.__file__))
    p = subprocess.Popen([sys.executable, "-c", _READER.format(src=src, d=d)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        doc = status(m)["delivery"]
        assert doc["rings_open"] == 1 and doc["ring_bytes"] > 0 and doc["rings"][0]["dir"] == "x"
        p.kill()
        p.wait()
        deadline = time.time() + 10
        while status(m)["delivery"]["rings_open"] and time.time() < deadline:
            time.sleep(0.05)
        doc = status(m)["delivery"]
        assert doc["rings_open"] == 0 and doc["ring_bytes"] == 0 and doc["rings"] == []
    finally:
        p.kill()
    # The next reader starts cleanly.
    assert sum(len(c["index"]) for _, c in Loader(d, 4, device="cpu", decode="device")) == N


def test_dead_daemon_raises(zarrfs_bin, fuse, big_store, tmp_path):
    mnt = str(tmp_path / "mnt")
    try:
        _dead_daemon_raises(big_store, mnt, str(tmp_path / "cache"))
    finally:
        if zarrfs._mount.mount_source(mnt) is not None:  # a failure left the killed daemon's mount
            for cmd in (["fusermount3", "-uz", mnt], ["umount", "-l", mnt]):
                if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True).returncode == 0:
                    break


def _dead_daemon_raises(big_store, mnt, cache):
    m = zarrfs.Mount(big_store, mnt, cache=cache, delivery="host")
    m.start()
    try:
        l = Loader(os.path.join(m.path, "x"), 64, device="cpu", decode="device", timeout=20)
        ring = weakref.ref(l._dring)
        it = iter(l)
        next(it)
        os.kill(m._proc.pid, signal.SIGKILL)
        t0 = time.time()
        with pytest.raises(DeliveryError, match="daemon"):
            for _ in it:
                pass
        assert time.time() - t0 < 15
        # The loader, kept, lets go of the dead daemon's ring: its mapping
        # (device memory on a GPU) goes with the last batch over it.
        del it
        gc.collect()
        assert ring() is None
        with pytest.raises(DeliveryError, match="daemon.*make a new Loader"):
            iter(l)
    finally:
        try:
            m.stop()
        except zarrfs.MountError:
            pass
    # A daemon started again on the same mountpoint (it clears the stale
    # mount and socket) serves a new loader.
    with zarrfs.Mount(big_store, mnt, cache=cache, delivery="host") as m2:
        l2 = Loader(os.path.join(m2.path, "x"), 64, device="cpu", decode="device", timeout=20)
        b, c = next(iter(l2))
        assert c["index"].tolist() == list(range(64))
        assert b.numpy().tobytes() == np.stack([np.load(f) for f in c["file"]]).tobytes()
        l2.close()


def test_threads_stop_when_abandoned(mount, index_store):
    m = mount(index_store, delivery="host")
    base = threading.active_count()
    l = Loader(os.path.join(m.path, "x"), 1, device="cpu", decode="device", prefetch=3)
    it = iter(l)
    next(it)
    assert threading.active_count() > base
    del it
    import gc
    gc.collect()
    deadline = time.time() + 10
    while threading.active_count() > base and time.time() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= base
    # A second iteration stops the first.
    a = iter(l)
    next(a)
    b = iter(l)
    next(b)
    with pytest.raises(RuntimeError, match="another iteration"):
        for _ in a:
            pass


class _FakeLibcuda:
    """Stands in for libcuda.so.1 (as _deliver binds it): records what the
    ring's open hands to the driver, by value, as the driver would read it."""

    RING_PTR = 0x7F0000000000

    def __init__(self):
        self.opened = []  # (handle bytes, flags) of each cuIpcOpenMemHandle_v2
        self.closed = []

    def cuDeviceGet(self, dev, index):
        dev._obj.value = index
        return 0

    def cuDeviceGetPCIBusId(self, buf, n, dev):
        buf.value = b"0000:3B:00.0"
        return 0

    def cuIpcOpenMemHandle_v2(self, ptr, handle, flags):
        self.opened.append((bytes(handle), flags))
        ptr._obj.value = self.RING_PTR
        return 0

    def cuIpcCloseMemHandle(self, ptr):
        self.closed.append(ptr)
        return 0

    def cuGetErrorName(self, r, name):
        return 0


class _FakeEvent:
    """torch.cuda.Event's interprocess half: each event's handle is its
    number, repeated; records lists the numbers of the events recorded."""

    from_handles = []
    made = 0
    records = []

    def __init__(self, enable_timing=False, interprocess=False):
        assert interprocess
        self.n = _FakeEvent.made
        _FakeEvent.made += 1

    def record(self, stream=None):
        _FakeEvent.records.append(self.n)

    def ipc_handle(self):
        return bytes([self.n]) * 64

    @classmethod
    def from_ipc_handle(cls, device, handle):
        cls.from_handles.append(bytes(handle))
        return cls(interprocess=True)


@pytest.fixture
def fake_cuda(monkeypatch):
    """A GPU for the ring's opening only: libcuda, torch.cuda's device
    checks and its interprocess events are stand-ins (_FakeLibcuda,
    _FakeEvent). Returns the libcuda stand-in."""
    import zarrfs._deliver as zd

    lib = _FakeLibcuda()
    monkeypatch.setattr(zd, "_cuda", lambda: lib)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(_FakeEvent, "from_handles", [])
    monkeypatch.setattr(_FakeEvent, "made", 0)
    monkeypatch.setattr(_FakeEvent, "records", [])
    return lib


RING_HANDLE = bytes((7 * i + 3) % 256 for i in range(64))


def cuda_reply(slots):
    """The daemon's answer to an open of a CUDA ring of slots batches of 4
    samples: the handle RING_HANDLE, slot k's event handle k + 1 repeated."""
    return {"ok": True, "memory": "cuda", "handle": RING_HANDLE.hex(), "ring_bytes": slots << 21, "slot_bytes": 2 << 20,
            "sample_bytes": 24, "shape": [2, 3], "dtype": "<f4", "slots": slots, "batch": 4,
            "events": [(bytes([k + 1]) * 64).hex() for k in range(slots)], "device": 0, "decode": "device"}


def _fake_daemon(path, reply, got, conns=None):
    """Answers one open request on a Unix socket with reply, keeps the
    request in got (and the connection in conns), and waits for the reader
    to close."""
    import socket as sk
    srv = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        if conns is not None:
            conns.append(c)
        buf = b""
        while b"\n" not in buf:
            buf += c.recv(1 << 16)
        got.append(json.loads(buf.split(b"\n")[0]))
        c.sendall((json.dumps(reply) + "\n").encode())
        while c.recv(1 << 16):
            pass
        c.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_a_reply_line_survives_a_timeout_mid_line():
    """A reply of which half came before a short wait ran out is read
    whole by the next read, and a line past the limit is refused."""
    import socket
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(0.05)
        buf = bytearray()
        b.sendall(b'{"op":"ready","sl')
        with pytest.raises(socket.timeout):
            recv_line(a, buf)
        b.sendall(b'ot":1}\n{"op"')
        line, fds = recv_line(a, buf)
        assert json.loads(line) == {"op": "ready", "slot": 1} and fds == []
        assert bytes(buf) == b'{"op"'
        b.sendall(b"x" * 64)
        with pytest.raises(ValueError):
            recv_line(a, buf, limit=32)
        b.close()
        with pytest.raises(EOFError):
            recv_line(a, bytearray())


def test_cache_holds_takes_only_a_yes(mount, index_store, tmp_path, monkeypatch):
    """cache_holds sends the share as the daemon reads it, on a connection
    of its own, and takes only a yes for a yes: a daemon from before the
    question (its error reply) or no daemon holds nothing."""
    import zarrfs._deliver as zd
    m = mount(index_store)
    sd = zarrfs.SampleDir(os.path.join(m.path, "x"))
    sock = str(tmp_path / "q.sock")
    monkeypatch.setattr(zd, "socket_path", lambda root: sock)
    old = {"op": "error", "slot": -1, "code": "bad_request", "error": 'op "holds": want open first, then fill'}
    for reply, want in (({"ok": True, "held": True}, True), ({"ok": True, "held": False}, False), (old, False)):
        got = []
        t = _fake_daemon(sock, reply, got)
        assert zd.cache_holds(sd, (1, 2, 3), 10) is want
        t.join(10)
        assert not t.is_alive()
        assert got == [{"op": "holds", "dir": "x", "share": {"first": 1, "step": 2, "count": 3}}]
        os.unlink(sock)
    assert zd.cache_holds(sd, (1, 2, 3), 10) is False  # no socket


def test_cuda_ring_hands_the_daemons_handles_to_the_driver(fake_cuda, tmp_path):
    """The bytes of the IPC handles the daemon sends are what reach
    cuIpcOpenMemHandle and the events' opens, and the reader's own consumer
    events, one per slot, and GPU reach the daemon: a handle lost on the way
    (copied into a temporary, say) would make every open of a real ring
    fail. Letting go of a slot records that slot's event only."""
    import zarrfs._deliver as zd

    lib = fake_cuda
    reply = cuda_reply(2)
    sock = str(tmp_path / "ring.sock")
    got = []
    t = _fake_daemon(sock, reply, got)
    ring = zd.Ring(sock, "train", "cuda", 2, 4, device=torch.device("cuda", 0), timeout=10)
    assert lib.opened == [(RING_HANDLE, 1)]  # first: a handle copied astray may break the interpreter soon after
    assert got[0]["pci_bus_id"] == "0000:3b:00.0"
    # One consumer event per slot, each recorded once to be shared.
    assert [bytes.fromhex(h) for h in got[0]["consumer_events"]] == [bytes([0]) * 64, bytes([1]) * 64]
    assert _FakeEvent.records == [0, 1]
    ring.release(1)
    ring.release_all()
    assert _FakeEvent.records == [0, 1, 1, 0, 1]
    assert ring.ptr == _FakeLibcuda.RING_PTR
    assert _FakeEvent.from_handles == [bytes.fromhex(e) for e in reply["events"]]
    ring.close()
    assert lib.closed == [_FakeLibcuda.RING_PTR]
    t.join(10)
    assert not t.is_alive()


def test_a_batchs_error_comes_in_its_turn(mount, index_store, tmp_path, monkeypatch):
    """Fill replies come in any order, and a fill that fails is quick: the
    error of batch 1, answered before batch 0 is ready, is raised only
    once batch 0 was handed out (a trainer loses no good batch to it)."""
    import socket as sk

    import zarrfs._deliver as zd

    m = mount(index_store)  # the sample directory; the daemon below is a fake
    sock = str(tmp_path / "ring.sock")
    monkeypatch.setattr(zd, "socket_path", lambda root: sock)
    srv = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    srv.bind(sock)
    srv.listen(1)
    slots, slot_bytes = 3, 1 << 12

    def serve():
        c, _ = srv.accept()
        f = c.makefile("rb")
        json.loads(f.readline())
        fd = os.memfd_create("ring")
        os.ftruncate(fd, slots * slot_bytes)
        rep = {"ok": True, "memory": "host", "ring_bytes": slots * slot_bytes, "slot_bytes": slot_bytes,
               "sample_bytes": 24, "shape": [2, 3], "dtype": "<f4", "slots": slots, "batch": 4, "device": 0,
               "decode": "host"}
        sk.send_fds(c, [(json.dumps(rep) + "\n").encode()], [fd])
        os.close(fd)
        fills = [json.loads(f.readline()) for _ in range(slots)]
        assert [q["slot"] for q in fills] == [0, 1, 2]
        err = {"op": "error", "slot": 1, "code": "fill", "file": "x/05.npy", "error": "x/05.npy: chunk x/c/1/0/0: damaged"}
        # The reader may close once it raised batch 1's error.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for r in (err, {"op": "ready", "slot": 0}, {"op": "ready", "slot": 2}):
                c.sendall((json.dumps(r) + "\n").encode())
                time.sleep(0.2)
            while f.readline():
                pass
        c.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    l = Loader(os.path.join(m.path, "x"), 4, device="cpu", decode="device", prefetch=2, timeout=20)
    it = iter(l)
    _, c0 = next(it)
    assert c0["index"].tolist() == [0, 1, 2, 3]
    with pytest.raises(OSError, match=r"x/05\.npy: x/05\.npy: chunk x/c/1/0/0: damaged"):
        next(it)
    l.close()
    t.join(10)
    assert not t.is_alive()


def test_big_endian_sources_equal_files(mount, tmp_path):
    """Big-endian sources, Zarr v3 (byte order from the bytes codec) and v2
    (">f8"), come out of the ring as the mount's files hold them: little
    endian, the values of the source; through an array's sample directory
    and a view alike."""
    zarr = need_module("zarr")
    from zarr.codecs import BytesCodec, ZstdCodec

    n = 6
    data = np.arange(n, dtype="f8")[:, None, None] * 100 + np.arange(12, dtype="f8").reshape(3, 4) / 4
    v3 = zarr.open_group(str(tmp_path / "v3.zarr"), mode="w")
    x = v3.create_array("x", shape=(n, 3, 4), chunks=(1, 3, 4), dtype="f4", dimension_names=["time", "y", "x"],
                        serializer=BytesCodec(endian="big"), compressors=[ZstdCodec(level=3, checksum=True)])
    x[:] = data.astype("f4")
    v2 = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    y = v2.create_array("x", shape=(n, 3, 4), chunks=(1, 3, 4), dtype=">f8", attributes={"_ARRAY_DIMENSIONS": ["time", "y", "x"]})
    y[:] = data
    assert json.loads((tmp_path / "v3.zarr" / "x" / "zarr.json").read_text())["codecs"][0]["configuration"]["endian"] == "big"
    view = write_view(tmp_path / "v.yaml", "views:\n  - name: v\n    channels:\n      - var: x\n")
    for store, dt in (("v3.zarr", "<f4"), ("v2.zarr", "<f8")):
        m = mount(str(tmp_path / store), delivery="host", view=[view])
        for sub in ("x", "v"):
            d = os.path.join(m.path, sub)
            l = Loader(d, 3, device="cpu", decode="device", prefetch=1)
            assert l.path_kind == "ring-host"
            got = np.concatenate([b.numpy().copy() for b, _ in l])
            l.close()
            files = np.stack([np.load(os.path.join(d, f)) for f in sorted(os.listdir(d))])
            assert files.dtype == np.dtype(dt)
            assert got.reshape(files.shape).tobytes() == files.tobytes(), (store, sub)
            np.testing.assert_array_equal(files.reshape(n, 3, 4), data.astype(dt))


def test_a_slot_is_refilled_after_its_own_consumer_event(mount, index_store, monkeypatch):
    """Each slot has a consumer event of its own: letting go of batch j
    records slot j % S's event, and the refill of a slot is asked for only
    after its own event was recorded since its last fill, so the daemon's
    writes into it wait for the kernels that read it and for no others (a
    fill does not serialize behind the trainer's latest kernels). The ring
    is the test mode's; its events are stand-ins, logged in order with the
    fill requests."""
    m = mount(index_store, delivery="host")
    l = Loader(os.path.join(m.path, "x"), 2, device="cpu", decode="device", prefetch=2)  # three slots
    ring = l._dring
    S = ring.slots
    log = []

    class Ev:
        def __init__(self, k):
            self.k = k

        def record(self, stream=None):
            log.append(("record", self.k))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: None)
    ring.consumers = [Ev(k) for k in range(S)]
    send = ring.send

    def logged(msg):
        if msg.get("op") == "fill":
            log.append(("fill", msg["slot"]))
        send(msg)

    ring.send = logged
    n = 0
    for _ in range(2):
        for b, _ in l:
            n += 1
    l.close()
    fills = [e for e in log if e[0] == "fill"]
    assert len(fills) == n == 2 * -(-N // 2)
    last = {}  # slot -> index in log of its last fill
    for i, (what, k) in enumerate(log):
        if what != "fill":
            continue
        if k in last:
            between = [kk for w, kk in log[last[k] + 1:i] if w == "record"]
            assert k in between, f"slot {k} refilled at {i} with no record of its event since its fill at {last[k]}: {log}"
        last[k] = i
    # Every release records the one slot given back: batch j's, j % S.
    records = [k for w, k in log if w == "record"]
    first_epoch = records[:-(-N // 2) - 1]
    assert first_epoch == [j % S for j in range(len(first_epoch))], records


class _RingDaemon:
    """A delivery socket in the test mode's image, for timings a real
    daemon does not make on demand: a memfd ring of slots batches of 4
    samples of (2, 3) float32. The n-th fill request (from 0) is written
    and answered delay(n) seconds after it came (None: never); its sample j
    holds the number of its file j in every element; one that lost(n) is
    answered as a fill into a ring a GPU context rebuild lost. As the
    daemon does, it refuses a fill of a slot still being filled, and
    closes. It starts reading requests read_after seconds after the open,
    and serves conns connections side by side, each its own memfd ring."""

    SLOT_BYTES = 1 << 12

    def __init__(self, path, slots, delay, read_after=0.0, lost=lambda n: False, conns=1):
        import socket as sk
        self.slots, self.delay, self.read_after, self.lost, self.conns = slots, delay, read_after, lost, conns
        self.opened = 0
        self.requests = []
        self.lock = threading.Lock()
        self.srv = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        for _ in range(self.conns):
            c, _ = self.srv.accept()
            self.opened += 1
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()
        self.srv.close()

    def _conn(self, c):
        import mmap
        import socket as sk
        busy = set()  # the connection's slots being filled
        fd = os.memfd_create("ring")
        os.ftruncate(fd, self.slots * self.SLOT_BYTES)
        mem = mmap.mmap(fd, self.slots * self.SLOT_BYTES)
        f = c.makefile("rb")
        json.loads(f.readline())
        rep = {"ok": True, "memory": "host", "ring_bytes": self.slots * self.SLOT_BYTES, "slot_bytes": self.SLOT_BYTES,
               "sample_bytes": 24, "shape": [2, 3], "dtype": "<f4", "slots": self.slots, "batch": 4, "device": 0,
               "decode": "host"}
        sk.send_fds(c, [(json.dumps(rep) + "\n").encode()], [fd])
        os.close(fd)
        time.sleep(self.read_after)
        with contextlib.suppress(OSError):
            for line in f:
                q = json.loads(line)
                k = q["slot"]
                with self.lock:
                    self.requests.append(q)
                    n = len(self.requests) - 1
                    if k in busy:
                        self._send(c, {"op": "error", "slot": k, "code": "bad_request", "error": f"slot {k}: one being filled"})
                        break
                    busy.add(k)
                if self.lost(n):
                    with self.lock:
                        busy.discard(k)
                    self._send(c, {"op": "error", "slot": k, "code": "ring_lost",
                                   "error": f"slot {k}: gpu: ring lost: GPU 0's context was reset after a device error: open a new ring"})
                    continue
                d = self.delay(n)
                if d is not None:
                    threading.Thread(target=self._fill, args=(c, mem, busy, k, q["files"], d), daemon=True).start()
        c.close()

    def _fill(self, c, mem, busy, k, files, delay):
        time.sleep(delay)
        v = np.frombuffer(mem, dtype="<f4", count=self.SLOT_BYTES // 4, offset=k * self.SLOT_BYTES)
        for j, name in enumerate(files):
            v[j * 6:(j + 1) * 6] = int(name.split(".")[0])
        with self.lock:
            busy.discard(k)
        with contextlib.suppress(OSError):
            self._send(c, {"op": "ready", "slot": k})

    def _send(self, c, rep):
        c.sendall((json.dumps(rep) + "\n").encode())


def ring_daemon(mount, index_store, tmp_path, monkeypatch, slots, delay, read_after=0.0, **kw):
    """A _RingDaemon serving the sample directory x of a mount of index_store."""
    import zarrfs._deliver as zd
    m = mount(index_store)
    sock = str(tmp_path / "ring.sock")
    monkeypatch.setattr(zd, "socket_path", lambda root: sock)
    return _RingDaemon(sock, slots, delay, read_after, **kw), os.path.join(m.path, "x")


def rows(batch):
    """The sample numbers a batch of the ring daemon holds."""
    return [int(x) for x in batch[:, 0, 0].tolist()]


def test_a_dropped_epochs_late_replies_are_not_the_next_ones(mount, index_store, tmp_path, monkeypatch):
    """An epoch dropped with fills under way stops at once, and the next
    epoch reads and drops their replies before asking for their slots
    again, however late they come (here past the loader's timeout): each
    batch is handed out on its own fill's reply, never on an older one
    over other samples. The dropped epoch's last two fills take 1.5 s; the
    next epoch's first 0.1 s, the others 0.8 s, so that a batch handed out
    on a stale reply holds the dropped epoch's samples."""
    daemon, d = ring_daemon(mount, index_store, tmp_path, monkeypatch, 3,
                            lambda n: 0 if n == 0 else 1.5 if n < 3 else 0.1 if n == 3 else 0.8)
    l = Loader(d, 4, device="cpu", decode="device", prefetch=2, timeout=1, shuffle=True, seed=3)
    it = iter(l)
    b, c = next(it)
    assert rows(b) == c["index"].tolist()
    t0 = time.monotonic()
    it.close()
    assert time.monotonic() - t0 < 0.5
    time.sleep(2)  # the dropped fills are answered
    l.set_epoch(1)
    n = 0
    for b, c in l:
        assert rows(b) == c["index"].tolist(), f"batch {n}"
        n += 1
    assert n == -(-N // 4)
    l.close()


def test_a_lost_ring_is_replaced_within_the_epoch(mount, index_store, tmp_path, monkeypatch, caplog):
    """A fill into a ring the daemon lost (a GPU context it rebuilt after a
    device error freed the ring) is not an error of the batch's files, nor
    the end of the epoch: the daemon lives, so the loader opens a new ring
    and goes on from the batch in turn, every batch in order, while the
    batch in hand still reads the old ring."""
    daemon, d = ring_daemon(mount, index_store, tmp_path, monkeypatch, 3, lambda n: 0, lost=lambda n: n == 1, conns=2)
    l = Loader(d, 4, device="cpu", decode="device", prefetch=2, timeout=5)
    got = []
    with caplog.at_level(logging.WARNING, logger="zarrfs"):
        for b, c in l:
            assert rows(b) == c["index"].tolist(), f"batch {len(got)}"
            got.append((b, c["index"].tolist()))
            if len(got) == 2:
                # The lost ring's batch, in hand while the new ring was
                # opened and filled. (A later batch's slot may be refilled
                # once the next is taken, as the loader documents.)
                assert rows(got[0][0]) == got[0][1], "the lost ring's batch, while the next was read"
    assert len(got) == -(-N // 4) and daemon.opened == 2
    assert "ring lost" in caplog.text and "going on from batch 1 over a new ring" in caplog.text
    assert rows(got[0][0]) == got[0][1]  # the lost ring's batch, kept
    del got
    l.close()


def test_auto_reads_the_files_past_a_lost_ring_it_cannot_replace(mount, index_store, tmp_path, monkeypatch, caplog):
    """decode="auto" with no new ring to be had for a lost one (here: auto
    on the CPU takes no ring) reads the rest of the epoch from the files:
    every batch in order, the batch in hand still readable; the next epoch
    tries for a ring again."""
    daemon, d = ring_daemon(mount, index_store, tmp_path, monkeypatch, 3, lambda n: 0, lost=lambda n: n == 1, conns=2)
    l = Loader(d, 4, device="cpu", decode="device", prefetch=2, timeout=5)
    l.decode = "auto"  # as a CUDA loader's, whose ring could not be replaced
    got = []
    with caplog.at_level(logging.WARNING, logger="zarrfs"):
        for b, c in l:
            assert rows(b) == c["index"].tolist(), f"batch {len(got)}"
            got.append((b, c["index"].tolist()))
    assert [i for _, idx in got for i in idx] == list(range(N))
    assert rows(got[0][0]) == got[0][1]  # the lost ring's batch, kept
    assert "no new ring: reading the files from batch 1" in caplog.text
    assert l.path_kind == "pread" and daemon.opened == 1
    del got
    l.close()


def test_auto_reads_the_files_past_a_ring_lost_again_at_once(mount, index_store, tmp_path, monkeypatch, caplog):
    """decode="auto" whose new ring is lost before it filled a batch (a
    device that keeps failing) reads the rest of the epoch from the files."""
    from zarrfs._deliver import ring_for
    # Fills 0-2 go to the first ring; 3 is the second ring's first.
    daemon, d = ring_daemon(mount, index_store, tmp_path, monkeypatch, 3, lambda n: 0, lost=lambda n: n in (1, 3), conns=2)
    l = Loader(d, 4, device="cpu", decode="device", prefetch=2, timeout=5)
    l.decode = "auto"  # as a CUDA loader's, which may open rings
    monkeypatch.setattr(l, "_open_ring", lambda: ring_for(l.dir, "host", 3, 4, None, 5))
    n = 0
    with caplog.at_level(logging.WARNING, logger="zarrfs"):
        for b, c in l:
            assert rows(b) == c["index"].tolist(), f"batch {n}"
            n += 1
    assert n == -(-N // 4) and daemon.opened == 2
    assert "going on from batch 1 over a new ring" in caplog.text
    assert "no new ring: reading the files from batch 1" in caplog.text
    l.close()


def test_a_ring_lost_again_at_once_ends_the_epoch(mount, index_store, tmp_path, monkeypatch):
    """A new ring lost before it filled a batch (the device fails again)
    raises RingLost in the batch's turn; the next epoch opens a new ring
    and reads every batch."""
    from zarrfs._deliver import RingLost
    # Fills 0-2 go to the first ring; 3 is the second ring's first.
    daemon, d = ring_daemon(mount, index_store, tmp_path, monkeypatch, 3, lambda n: 0, lost=lambda n: n in (1, 3), conns=3)
    l = Loader(d, 4, device="cpu", decode="device", prefetch=2, timeout=5)
    it = iter(l)
    b, c = next(it)
    assert rows(b) == c["index"].tolist()
    with pytest.raises(RingLost, match="ring lost.*open a new ring"):
        next(it)
    assert daemon.opened == 2
    n = 0
    for b, c in l:
        assert rows(b) == c["index"].tolist(), f"batch {n}"
        n += 1
    assert n == -(-N // 4) and daemon.opened == 3
    l.close()


def test_replies_owed_past_the_timeout_lose_the_ring(mount, index_store, tmp_path, monkeypatch):
    """Fills of a dropped epoch that are never answered: the next epoch
    waits for them for the loader's timeout, hands out nothing, and
    raises; the loader lets go of the ring."""
    daemon, d = ring_daemon(mount, index_store, tmp_path, monkeypatch, 3, lambda n: 0 if n == 0 else None)
    l = Loader(d, 4, device="cpu", decode="device", prefetch=2, timeout=1)
    it = iter(l)
    next(it)
    it.close()
    t0 = time.monotonic()
    with pytest.raises(DeliveryError, match=r"did not answer the fills of slots \[1, 2\] of an epoch stopped before in 1 s"):
        next(iter(l))
    assert 1 <= time.monotonic() - t0 < 3
    assert len(daemon.requests) == 3  # the next epoch asked for nothing
    with pytest.raises(DeliveryError, match="make a new Loader"):
        iter(l)


def test_a_request_waits_for_the_daemon_to_read_it(mount, index_store, tmp_path, monkeypatch):
    """A request longer than the socket's buffer waits for the daemon to
    read it (for up to timeout), whatever short wait for a reply came
    before it."""
    import zarrfs._deliver as zd
    daemon, d = ring_daemon(mount, index_store, tmp_path, monkeypatch, 2, lambda n: None, read_after=0.5)
    ring = zd.ring_for(zarrfs.SampleDir(d), "host", 2, 4, None, 10)
    assert ring.recv(timeout=0.05) is None
    ring.send({"op": "fill", "slot": 0, "files": ["0" * (4 << 20)]})
    deadline = time.time() + 10
    while not daemon.requests and time.time() < deadline:
        time.sleep(0.05)
    assert daemon.requests[0]["slot"] == 0 and len(daemon.requests[0]["files"][0]) == 4 << 20
    ring.close()


def test_a_refused_request_raises_the_daemons_reason(mount, index_store):
    """The daemon closes a connection whose request it refuses, after
    saying why: a request cut off by that close raises the daemon's reason,
    not the broken pipe (the daemon lives)."""
    m = mount(index_store, delivery="host")
    l = Loader(os.path.join(m.path, "x"), 2, device="cpu", decode="device")
    with pytest.raises(DeliveryError, match=r"refused a request: request longer than 1 MiB"):
        l._dring.send({"op": "fill", "slot": 0, "files": ["0" * (4 << 20)]})
    assert m.running
    l.close()


def test_fill_requests_fit_the_daemons_line(mount, big_store):
    """A fill request is one line, which the daemon reads up to 1 MiB:
    it names a batch's files in compact JSON (each file costs its quoted
    name and a comma), the largest batch that fits is filled, and a larger
    one is refused at the ring's open, as unavailable (decode="auto" reads
    the files then)."""
    from zarrfs._deliver import MAX_LINE, DeliveryUnavailable, longest_fill, ring_for
    m = mount(big_store, delivery="host")
    d = os.path.join(m.path, "x")
    sd = zarrfs.SampleDir(d)
    names = sd.names
    lo, hi = 1, len(names)  # the largest batch that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if longest_fill(names, 2, mid) <= MAX_LINE else (lo, mid - 1)
    fits = lo
    assert fits >= (MAX_LINE - 64) // (len(json.dumps(names[0])) + 1)
    l = Loader(d, fits, device="cpu", decode="device", prefetch=1, timeout=60)
    b, c = next(iter(l))
    assert c["index"].tolist() == list(range(fits))
    assert b[-1].numpy().tobytes() == np.load(c["file"][-1]).tobytes()
    l.close()
    with pytest.raises(RuntimeError, match=rf"decode='device': a batch of {fits + 1} samples makes fill requests of up to "
                                           r"\d+ bytes, over the delivery socket's 1 MiB a request"):
        Loader(d, fits + 1, device="cpu", decode="device", prefetch=1)
    with pytest.raises(DeliveryUnavailable):
        ring_for(sd, "host", 2, fits + 1, None, 10)


@pytest.mark.parametrize("decode", ["host", "device"])
def test_a_closed_loader_says_so(mount, index_store, decode):
    """After close, the epoch under way and the loader raise saying it was
    closed, on either read path (not handing out what was read ahead); a
    ring, which no batch holds, is freed at once."""
    m = mount(index_store, delivery="host")
    l = Loader(os.path.join(m.path, "x"), 4, device="cpu", decode=decode, copy=True, prefetch=2)
    assert l.path_kind == ("ring-host" if decode == "device" else "pread")
    it = iter(l)
    next(it)
    l.close()
    with pytest.raises(RuntimeError, match="the Loader was closed"):
        next(it)
    with pytest.raises(RuntimeError, match="the Loader was closed"):
        iter(l)
    deadline = time.time() + 10
    while status(m)["delivery"]["rings_open"] and time.time() < deadline:
        time.sleep(0.05)
    assert status(m)["delivery"]["rings_open"] == 0


def test_close_leaves_the_ring_mapped_under_a_batch_in_hand(fake_cuda, mount, index_store, tmp_path, monkeypatch):
    """Loader.close() lets go of its ring and the last batch over it unmaps
    it: a batch in hand would otherwise read unmapped device memory (an
    illegal address, which poisons the CUDA context). The batch here is the
    slot's device array, which torch.as_tensor keeps as the tensor's owner."""
    import zarrfs._deliver as zd
    m = mount(index_store)
    sock = str(tmp_path / "ring.sock")
    monkeypatch.setattr(zd, "socket_path", lambda root: sock)
    t = _fake_daemon(sock, cuda_reply(3), [])
    monkeypatch.setattr(torch, "as_tensor", lambda a, device=None: a)
    l = Loader(os.path.join(m.path, "x"), 4, device="cuda", decode="device", prefetch=2, timeout=10)
    assert l.path_kind == "ring-cuda"
    batch = l._dring.slot(1, 4)
    assert batch.__cuda_array_interface__["data"][0] == _FakeLibcuda.RING_PTR + (2 << 20)
    l.close()
    assert fake_cuda.closed == []
    del batch
    assert fake_cuda.closed == [_FakeLibcuda.RING_PTR]
    t.join(10)
    assert not t.is_alive()


def _scripted_daemon(path, answer, got):
    """Answers each connection's requests on a Unix socket with
    answer(request) until the reader closes it, and keeps the requests in
    got; stop() ends it."""
    import socket as sk
    srv = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    srv.settimeout(0.1)
    done = threading.Event()

    def conn(c):
        with c, c.makefile("rb") as f:
            for line in f:
                q = json.loads(line)
                got.append(q)
                c.sendall((json.dumps(answer(q)) + "\n").encode())

    def serve():
        while not done.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=conn, args=(c,), daemon=True).start()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return done.set


def test_a_ring_without_room(fake_cuda, mount, index_store, tmp_path, monkeypatch, caplog):
    """A mount that refuses a ring for room alone (its --gpu-memory): the
    default depth asks again with one slot fewer, and decode="auto" that
    gets no ring at all reads the files saying which bound kept the ring
    from it; a refusal for another reason is not asked again, nor warned of."""
    import zarrfs._deliver as zd
    m = mount(index_store)
    d = os.path.join(m.path, "x")
    sock = str(tmp_path / "ring.sock")
    monkeypatch.setattr(zd, "socket_path", lambda root: sock)
    monkeypatch.setattr(torch, "as_tensor", lambda a, device=None: a)
    full = {"ok": False, "code": "unavailable", "full": True,
            "error": "x: ring of 8388608 bytes: delivery unavailable: gpu: over the memory budget: a ring of 8388608 bytes "
                     "beside 0 held, budget 6291456 (--gpu-memory)"}
    other = {"ok": False, "code": "unavailable", "error": "x: ring of 8388608 bytes: delivery unavailable: no GPU 0000:3b:00.0"}

    def run(room, **kw):
        """The Loader against a daemon with room for rings of up to room
        slots (room -1: a refusal for another GPU)."""
        def answer(q):
            if q["op"] == "holds":
                return {"ok": True, "held": False}
            if room < 0:
                return other
            return cuda_reply(q["slots"]) if q["slots"] <= room else full

        got = []
        stop = _scripted_daemon(sock, answer, got)
        caplog.clear()
        try:
            with caplog.at_level(logging.WARNING, logger="zarrfs"):
                l = Loader(d, 4, device="cuda", timeout=10, **kw)
            kind, slots = l.path_kind, l._dring.slots if l._dring is not None else None
            l.close()
        finally:
            stop()
            os.unlink(sock)
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        return kind, slots, [q.get("slots") for q in got if q["op"] == "open"], warned

    assert run(4) == ("ring-cuda", 4, [4], [])
    assert run(3) == ("ring-cuda", 3, [4, 3], [])
    kind, slots, opens, warned = run(2)
    assert (kind, slots, opens) == ("pread-pinned-h2d", None, [4, 3])
    assert len(warned) == 1 and "reads the files of" in warned[0] and "(--gpu-memory)" in warned[0] and "larger --gpu-memory" in warned[0]
    # A prefetch the user passed gets its ring or none.
    kind, slots, opens, warned = run(3, prefetch=3)
    assert (kind, opens, len(warned)) == ("pread-pinned-h2d", [4], 1)
    # Another GPU: no second ask, no warning (auto reads the files, as it
    # must where the mount cannot deliver).
    assert run(-1) == ("pread-pinned-h2d", None, [4], [])


def test_cuda_setup_failure_reads_files(fake_cuda, mount, index_store, monkeypatch):
    """Where torch cannot make interprocess events (a RuntimeError, as on
    WSL2) the ring is unavailable: decode="auto" reads the files, "device"
    says why, and no connection is left open."""
    class NoIPC:
        def __init__(self, **kw):
            raise RuntimeError("CUDA error: operation not supported")

    monkeypatch.setattr(torch.cuda, "Event", NoIPC)
    m = mount(index_store, delivery="host")
    d = os.path.join(m.path, "x")
    fds = sorted(os.listdir("/proc/self/fd"))
    assert Loader(d, 2, device="cuda").path_kind == "pread-pinned-h2d"
    with pytest.raises(RuntimeError, match=r"decode='device': CUDA interprocess events do not work here: .*not supported"):
        Loader(d, 2, device="cuda", decode="device")
    assert sorted(os.listdir("/proc/self/fd")) == fds


def test_a_ring_whose_events_fail_is_unmapped_before_its_socket_closes(fake_cuda, tmp_path, monkeypatch):
    """The ring's memory opened and its events not: the open raises
    DeliveryUnavailable, with the mapping closed, and closed before the
    socket (the daemon frees the ring once the socket closes)."""
    import socket as sk

    import zarrfs._deliver as zd

    def no_event(device, handle):
        raise RuntimeError("CUDA error: invalid resource handle")

    monkeypatch.setattr(_FakeEvent, "from_ipc_handle", staticmethod(no_event))
    sock, conns = str(tmp_path / "ring.sock"), []
    t = _fake_daemon(sock, cuda_reply(2), [], conns)
    socket_open = []

    def unmap(ptr):
        try:
            socket_open.append(conns[0].recv(1, sk.MSG_PEEK | sk.MSG_DONTWAIT) != b"")
        except BlockingIOError:  # nothing to read, and no end either
            socket_open.append(True)
        fake_cuda.closed.append(ptr)
        return 0

    monkeypatch.setattr(fake_cuda, "cuIpcCloseMemHandle", unmap)
    with pytest.raises(zd.DeliveryUnavailable, match="invalid resource handle"):
        zd.Ring(sock, "x", "cuda", 2, 4, device=torch.device("cuda", 0), timeout=10)
    assert fake_cuda.closed == [_FakeLibcuda.RING_PTR] and socket_open == [True]
    t.join(10)
    assert not t.is_alive()
