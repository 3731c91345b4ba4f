"""zarrfs.torch.Loader: batches of samples from a mount straight into GPU memory.

A sample directory of a zarrfs mount holds files of one fixed size whose data
starts at a known aligned offset (the sidecar says where, and the shape and
dtype), so a loader needs no parsing: parallel preads into a ring of pinned
host buffers, asynchronous copies (one per sample) to the GPU on a stream of its
own, with batches read ahead while the previous ones train.
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import threading
import time
import weakref
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from ._samples import SampleDir

if TYPE_CHECKING:  # torch is imported when a Loader is made, not with the package
    import torch

log = logging.getLogger("zarrfs")

# What an epoch yields: a batch and its coordinates.
Batch = Tuple["torch.Tensor", Dict[str, Any]]

# Reads of a large sample are cut into pieces of this size, so that a small
# batch still keeps every reading thread busy.
_PIECE = 8 << 20
_ALIGN = 4096


class Loader:
    """An iterable of ``(batch, coords)`` over a sample directory.

    ``batch`` is a ``torch.Tensor`` of shape ``(B, *sample_shape)`` with the
    sidecar's dtype, on ``device`` ("cuda", "cuda:N", or "cpu" for CPU tensors,
    pinned with ``pin_memory=True``). ``coords`` is a dict: ``index`` (the global
    sample indices, an int64 tensor), ``file`` (the paths) and, when the mount
    knows the sample coordinate, its values under the sample dimension's name
    (a NumPy array, datetime64 for times).

    Sharding: rank ``rank`` of ``world`` reads the samples ``zarrfs warm
    --rank R --world W`` fills, so a node reads what it warmed: with
    ``shard="contiguous"`` (the default, as warm's) the block
    ``[R*n//W, (R+1)*n//W)`` of the directory, with ``shard="interleaved"``
    (as ``warm --shard interleaved``) samples R, R+W, R+2W, ... Every epoch
    reads that same share, each sample once, in order or, with ``shuffle``,
    permuted anew with ``seed + epoch``; the ranks together read every
    sample once. On a per-rank directory (``zarrfs mount --rank/--world``)
    the directory is the share: leave rank and world out (or give the
    mount's). Shares differ by one sample when W does not divide n, and so
    may the number of batches: under DistributedDataParallel, where every
    rank must run the same number of steps, pass ``even_batches=True``,
    which reads ``n // W`` samples of the share each epoch (with ``shuffle``
    a different few are left out each epoch). Call ``set_epoch(n)`` before
    each epoch to reshuffle. ``drop_last`` drops a last, smaller batch.

    Reading: ``threads`` preads at once (default: the CPUs, at most 16) into
    ``prefetch + 1`` pinned buffers; ``prefetch`` batches are read ahead
    (default 2; on a ring of the mount's, ``decode=``, the fills in flight,
    default 3).
    Besides, the ``open_ahead`` samples (default 16) that follow the batch
    being read are opened (and closed) in the background: on a cold mount
    an open starts the sample's fill, so that many fill at once whatever
    the batch size; on a warm one an open costs a lookup. The
    loader's threads stop when an epoch's iteration ends, is abandoned, or
    fails; a sample that cannot be read (EIO from the mount: a corrupt chunk)
    raises an ``OSError`` naming its file. On a GPU one epoch reads at a
    time (the epochs share the pinned buffers): starting another iteration
    stops the one before, whose next ``next()`` raises ``RuntimeError``.
    ``close()`` stops the epoch under way and lets go of the mount's ring
    (the batches in hand stay valid); iterating after it raises
    ``RuntimeError``.

    ``profile=True`` times where an epoch's time goes, for
    ``stages()`` (the host path: decode="host", or files read): the reader
    threads' opens, preads and closes, the producer's waits, the copies'
    time on the GPU, and the consumer's wait for batches.
    """

    # The ring memories decode="auto" takes: device memory only (the host
    # ring is the test mode's).
    _AUTO_RINGS: Tuple[str, ...] = ("cuda",)

    # prefetch=None: batches read ahead from the files, and fills in flight
    # on a ring. A ring's fill reads its chunks and then decodes them, so
    # one fill more keeps the GPU (or the daemon's cores) busy through the
    # reads: on an H100, 3 against 2 ran first epochs a median 1.19x
    # faster on both ERA5-like stores, and 4 no faster than 3
    # (BENCHMARKS.md).
    _FILES_AHEAD, _RING_AHEAD = 2, 3

    def __init__(self, sample_dir: Union[str, os.PathLike[str]], batch_size: int, *,
                 device: Union[str, torch.device] = "cuda", rank: int = 0, world: int = 1,
                 shard: str = "contiguous", shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                 threads: Optional[int] = None, prefetch: Optional[int] = None, odirect: bool = False,
                 even_batches: bool = False, open_ahead: int = 16, pin_memory: bool = False,
                 decode: str = "auto", copy: bool = False, timeout: float = 300.0,
                 profile: bool = False) -> None:
        import torch

        self.dir = SampleDir(sample_dir)
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: want 1 or more")
        # The rank's share, as warm fills it (ValueError for a bad split).
        self._share = self.dir.positions(rank, world, shard)
        self._even = self.dir.min_share(world)
        if prefetch is not None and prefetch < 1:
            raise ValueError(f"prefetch {prefetch}: want 1 or more (or None: 2 batches read ahead, 3 fills of a ring)")
        if open_ahead < 0:
            raise ValueError(f"open_ahead {open_ahead}: want 0 or more")
        if threads is not None and threads < 1:
            raise ValueError(f"threads {threads}: want 1 or more (or None: the CPUs, at most 16)")
        self.batch_size = batch_size
        self.rank, self.world, self.shard = rank, world, shard
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.even_batches = even_batches
        self.threads = threads or min(os.cpu_count() or 1, 16)
        self.prefetch = prefetch
        self.open_ahead = open_ahead
        self.odirect = odirect
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r}: CUDA is not available (use device='cpu')")
        # CPU batches are pinned only when asked (pinning starts CUDA).
        self.pinned = pin_memory and torch.cuda.is_available()
        self.epoch = 0
        self._coords = self.dir.coords()
        self._torch_dtype = _torch_dtype(self.dir.dtype)
        self._buffers: List[Optional[torch.Tensor]] = []  # the ring, each slot pinned at its first use
        self._events: List[Optional[torch.cuda.Event]] = []  # per ring slot: the copy that last read it
        self._active: Optional[Any] = None
        if decode not in ("auto", "host", "device"):
            raise ValueError(f"decode {decode!r}: want auto, host or device")
        if timeout <= 0:
            raise ValueError(f"timeout {timeout}: want a positive number of seconds")
        self.decode, self.copy, self.timeout = decode, copy, timeout
        self.profile = profile
        self._stages: Optional[_Stages] = None  # the last epoch's, with profile
        self._lost: Optional[str] = None  # why the ring was let go (its daemon is gone)
        self._reopen = False  # the ring was lost, its daemon lives: the next epoch opens another
        self._held = False  # "auto" reads files: the cache held every sample of its share when asked
        self._fresh = False  # the ring was asked for since the last epoch started
        self._closed = False
        self._dring = self._open_ring()
        self.path_kind = self._path_kind()

    def _open_ring(self) -> Optional[Any]:
        """The mount's ring for this loader, when it decodes into this
        process's memory (docs/python.md): decode="device" insists, "auto"
        takes it on a GPU the mount decodes on and reads files otherwise,
        and where the cache holds every sample of the loader's share (a
        warm mount: reading the files is as fast as the ring's copies of
        them, with no ring nor daemon CPU), until an epoch starts with one
        of them not held."""
        self._held, self._fresh = False, True
        memory = "cuda" if self.device.type == "cuda" else "host"
        if self.decode == "host" or (self.decode == "auto" and memory not in self._AUTO_RINGS):
            return None
        import torch
        from ._deliver import DeliveryError, DeliveryUnavailable, ring_for
        if memory == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self._cache_holds_share():
            log.debug("zarrfs Loader reads files: the cache holds its share")
            self._held = True
            return None
        try:
            try:
                return ring_for(self.dir, memory, self._ahead(True) + 1, self.batch_size, self.device, self.timeout)
            except DeliveryUnavailable as e:
                if self.prefetch is not None or not e.full:
                    raise
                # The default's extra fill is worth a slot, not the ring: a
                # ring the mount's bounds (--gpu-memory, its rings' bytes)
                # hold with one slot fewer is still faster than the files.
                return ring_for(self.dir, memory, self._RING_AHEAD, self.batch_size, self.device, self.timeout)
        except (DeliveryUnavailable, DeliveryError, OSError) as e:
            if self.decode == "device":
                raise RuntimeError(f"{self.dir.path}: decode='device': {e}") from None
            if isinstance(e, DeliveryUnavailable) and e.full:
                # The mount decodes on this GPU, and would deliver but for
                # its bounds: a user who left decode="auto" expects the
                # ring, and is told which flag keeps it from them.
                log.warning("zarrfs Loader reads the files of %s: the mount has no room for its ring (%s); "
                            "a larger --gpu-memory on the mount gives it one, decode='host' reads the files without this warning",
                            self.dir.path, e)
            else:
                log.debug("zarrfs Loader reads files: %s", e)
            return None

    def _ahead(self, ring: bool) -> int:
        """prefetch, or its default for a ring or the files."""
        if self.prefetch is not None:
            return self.prefetch
        return self._RING_AHEAD if ring else self._FILES_AHEAD

    def _path_kind(self) -> str:
        dring = getattr(self, "_dring", None)
        if dring is not None:
            return "ring-" + str(dring.memory)
        if self.device.type != "cuda":
            return "pread"
        return "pread-pinned-h2d"

    def _ring(self, n: int) -> List[Optional[torch.Tensor]]:
        """The loader's ring of pinned buffers, each pinned by the producer
        at its first use (_Producer._slot), so that the first batch waits
        for one buffer, not the whole ring. One epoch reads at a time:
        starting another stops the one before."""
        self._stop_active(_SUPERSEDED)
        # The epoch before may have left copies from the ring in flight.
        for ev in self._events:
            if ev is not None:
                ev.synchronize()
        if not self._buffers:
            self._buffers = [None] * n
        self._events = [None] * len(self._buffers)
        return self._buffers

    def stages(self) -> Dict[str, float]:
        """Where the last (or current) epoch's time went, with
        ``profile=True``: seconds by stage, summed over the threads that
        spent them, and counts. Empty without profile or on the ring path
        (``zarrfs status`` has the daemon's stages there).

        - ``epoch``: from the epoch's start to its last batch handed out;
          ``consumer_wait``: the part of it the consumer waited for batches
        - the producer thread's: ``slot_wait`` (for a ring buffer's copy to
          the GPU to finish), ``pin`` (pinning a ring buffer at its first
          use), ``submit`` (queueing a batch's reads and the opens ahead),
          ``read_wait`` (for a batch's reads, once the next batch's are
          queued), ``close`` (its files), ``h2d_issue`` (queueing the copies), ``put_wait`` (for
          room among the batches read ahead: the consumer is the slower)
        - the reader threads', summed: ``open``, ``pread``
        - ``h2d_gpu``: the copies' time on the GPU
        - ``threads``, ``batches``, ``samples``, ``bytes``
        """
        st = self._stages
        return st.snapshot() if st is not None else {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self, epoch: Optional[int] = None) -> np.ndarray:
        """The positions (in the directory's listing) this rank reads in an epoch, in reading order."""
        pos = self._share
        if self.shuffle:
            rng = np.random.default_rng(self.seed + (self.epoch if epoch is None else epoch))
            pos = pos[rng.permutation(len(pos))]
        if self.even_batches:
            pos = pos[:self._even]
        return pos

    def __len__(self) -> int:
        n = len(self.order())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __repr__(self) -> str:
        return (f"Loader({self.dir.path!r}, batch_size={self.batch_size}, device={str(self.device)!r}, "
                f"rank={self.rank}, world={self.world}, shard={self.shard!r}, shuffle={self.shuffle}, even_batches={self.even_batches}, "
                f"threads={self.threads}, decode={self.decode!r}, "
                f"prefetch={self._dring.slots - 1 if self._dring is not None else self._ahead(False)}, open_ahead={self.open_ahead}, path={self.path_kind!r}, samples={len(self.order())}, "
                f"sample={self.dir.sample_shape} {self.dir.dtype.str})")

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError(f"{self.dir.path}: {_CLOSED}")
        if self._lost is not None:
            from ._deliver import DeliveryError
            raise DeliveryError(f"{self.dir.path}: {self._lost}; this loader's ring is gone with it: make a new Loader")
        if self._reopen or (self._held and not self._fresh):
            # A lost ring, or the files of a share the cache held an epoch
            # ago: another ring, unless the cache still holds them.
            self._reopen = False
            self._dring = self._open_ring()
            self.path_kind = self._path_kind()
        elif self._dring is not None and not self._fresh and self._cache_holds_share():
            # The cache came to hold the share since the ring was opened (a
            # warm ran meanwhile): the files, as a new "auto" loader would.
            # Batches still over the ring keep its mapping until they go.
            self._stop_active(_SUPERSEDED)
            self._dring = None
            self._held = True
            self.path_kind = self._path_kind()
        self._fresh = False
        if self._dring is not None:
            from ._ringloader import RingEpoch
            self._stop_active(_SUPERSEDED)
            # The batches of the epoch before are done with, as of now on
            # the current stream.
            self._dring.release_all()
            r = RingEpoch(self, self.order())
            self._active = weakref.proxy(r)
            return r
        self._stages = _Stages(self.threads) if self.profile else None
        e = _Epoch(self, self.order(), self._stages)
        self._active = weakref.proxy(e)
        return e

    def _cache_holds_share(self) -> bool:
        """Whether "auto" reads the files: the cache holds every sample of its
        share, named to the daemon as (first, step, count) of the directory's
        positions. Never for the other modes, nor a share of no samples."""
        p = self._share
        if self.decode != "auto" or not len(p):
            return False
        from ._deliver import cache_holds
        return cache_holds(self.dir, (int(p[0]), int(p[1] - p[0]) if len(p) > 1 else 1, len(p)), self.timeout)

    def _stop_active(self, why: str) -> None:
        """Stops the epoch under way, whose next next() raises RuntimeError(why)."""
        if self._active is not None:
            try:
                self._active.stopped = f"zarrfs Loader: {why}"
                self._active.close()
            except ReferenceError:  # that epoch is gone, and its threads with it
                pass

    def _lose_ring(self, err: BaseException) -> None:
        """The ring's daemon is gone (or stopped answering), or lost the
        ring (RingLost): the ring takes no more batches. The loader lets go
        of it, so that its mapping closes as soon as the batches over it
        are gone, even while the loader is kept; every later epoch raises
        err, or, for a lost ring, opens a new one (or reads the files, as
        decode allows). Its text alone is kept: its traceback holds the
        epoch, which holds the ring."""
        from ._deliver import RingLost
        self._dring = None
        if isinstance(err, RingLost):
            # The daemon lives: the next epoch opens a new ring.
            self._reopen = True
            return
        self._lost = str(err)

    def close(self) -> None:
        """Stops the epoch under way and lets go of the mount's ring: its
        mapping and connection close with the last batch over it (at once
        if none is kept), as a batch in hand still reads the ring's memory.
        Iterating after close raises RuntimeError."""
        self._closed = True
        self._stop_active(_CLOSED)
        self._dring = None


# Why a stopped epoch's next() raises.
_SUPERSEDED = "this epoch was stopped when another iteration over the same Loader started (one epoch reads at a time)"
_CLOSED = "the Loader was closed"


def _pinned(nbytes: int) -> "torch.Tensor":
    """A uint8 tensor of nbytes in page-locked memory, for the current CUDA
    device's copies.

    Anonymous memory backed by transparent huge pages where the kernel
    gives them, its pages faulted in on several threads (_fault_in), then
    registered with cudaHostRegister: on the h200 a 348 MB ring slot is
    pinned in 20-35 ms this way, against 180 ms through
    torch.empty(pin_memory=True) (cudaHostAlloc, 4 KiB pages), and while a
    pinning runs the process's reads into pinned memory and its copies to
    the GPU stall. Without huge pages the registration is slower but still
    works; where it fails, torch's pinned allocation is used instead. The
    memory is unregistered when the tensor is freed, before it is unmapped.
    """
    import torch
    try:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError, RuntimeError, ValueError):
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # transparent huge pages off: 4 KiB pages, pinned all the same
    arr = np.frombuffer(mm, dtype=np.uint8)
    _fault_in(arr)
    ptr = arr.ctypes.data
    err = cudart.cudaHostRegister(ptr, nbytes, 1)  # cudaHostRegisterPortable: every device's context
    if int(err) != 0:  # cudaError: 0 is success
        del arr
        mm.close()
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    # The array holds the mapping, the tensor the array: the finalizer runs
    # as the array goes, while the memory is still mapped.
    weakref.finalize(arr, cudart.cudaHostUnregister, ptr)
    return torch.from_numpy(arr)


def _fault_in(arr: np.ndarray) -> None:
    """Touches every page of fresh anonymous memory on several threads
    (numpy's stores release the GIL), so that the kernel zeroes the pages
    in parallel rather than on the one thread that registers them."""
    n = len(arr)
    workers = max(1, min(8, os.cpu_count() or 1, n >> 22))
    step = -(-n // workers)
    step = -(-step // (2 << 20)) * (2 << 20)  # whole huge pages per thread

    def touch(lo: int) -> None:
        arr[lo:min(lo + step, n):4096] = 0

    if workers == 1:
        touch(0)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="zarrfs-pin") as ex:
        list(ex.map(touch, range(0, n, step)))


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    import torch
    table = {"f2": torch.float16, "f4": torch.float32, "f8": torch.float64, "i1": torch.int8, "i2": torch.int16,
             "i4": torch.int32, "i8": torch.int64, "u1": torch.uint8, "b1": torch.bool}
    if hasattr(torch, "uint16"):
        table.update({"u2": torch.uint16, "u4": torch.uint32, "u8": torch.uint64})
    key = dt.kind + str(dt.itemsize)
    if key not in table:
        raise ValueError(f"dtype {dt.str}: no torch dtype for it")
    return table[key]


class _Stages:
    """An epoch's time by stage (Loader(profile=True)): seconds summed over
    the threads that spent them, and counts. The copies' time on the GPU
    is read from timing events once they are done."""

    def __init__(self, threads: int) -> None:
        self.lock = threading.Lock()
        self.s: Dict[str, float] = {"threads": float(threads)}
        self.copies: List[Tuple[Any, Any]] = []  # (start, end) CUDA timing events of each batch's copies

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            self.s[name] = self.s.get(name, 0.0) + seconds

    def set(self, name: str, value: float) -> None:
        with self.lock:
            self.s[name] = value

    def since(self, name: str, t0: float) -> float:
        """Adds the time since t0 to name; returns now."""
        t = time.perf_counter()
        self.add(name, t - t0)
        return t

    def snapshot(self) -> Dict[str, float]:
        with self.lock:
            out = dict(self.s)
            copies = list(self.copies)
        h2d = 0.0
        for start, end in copies:
            end.synchronize()
            h2d += start.elapsed_time(end) / 1e3
        if copies:
            out["h2d_gpu"] = h2d
        return out


class _NoStages(_Stages):
    """What a loader without profile times: nothing."""

    def __init__(self) -> None:
        super().__init__(0)

    def add(self, name: str, seconds: float) -> None:
        pass

    def set(self, name: str, value: float) -> None:
        pass

    def since(self, name: str, t0: float) -> float:
        return 0.0


_NO_STAGES = _NoStages()


class _Epoch:
    """One pass over the loader's order, as the consumer sees it: a
    producer thread (_Producer) reads batches ahead into a ring of host
    buffers and copies each to the device; ``__next__`` hands them out in
    order. The producer holds no reference to this object, so dropping it
    stops the producer."""

    def __init__(self, loader: Loader, order: np.ndarray, stages: Optional[_Stages] = None) -> None:
        self.st = stages or _NO_STAGES
        self.t0 = time.perf_counter()
        p = _Producer(loader, order, self.st)
        self.out, self.batches = p.out, p.batches
        self.stopped: Optional[str] = None  # why the loader stopped this epoch
        self.thread = threading.Thread(target=p.run, name="zarrfs-loader", daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, p.stop, p.pool, p.ahead, p.out, self.thread)
        self.thread.start()

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __len__(self) -> int:
        return len(self.batches)

    def __next__(self) -> Batch:
        import torch
        if self.stopped is not None:
            self.close()
            raise RuntimeError(self.stopped)
        t = time.perf_counter()
        while True:
            try:
                item, coords, err = self.out.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.out.empty():
                    self.close()
                    raise StopIteration
        self.st.since("consumer_wait", t)
        if err is not None:
            self.close()
            if isinstance(err, StopIteration):
                raise StopIteration
            raise err
        if isinstance(item, tuple):
            dev, ev = item
            torch.cuda.current_stream(dev.device).wait_event(ev)
            dev.record_stream(torch.cuda.current_stream(dev.device))
            item = dev
        self.st.set("epoch", time.perf_counter() - self.t0)
        return item, coords

    def close(self) -> None:
        """Stop the threads of this epoch (also done when it ends or is dropped)."""
        self._finalizer()


class _SampleFile:
    """A sample's file, opened once for the pieces of a batch that read it
    (an open of a mount's file is a round trip to its daemon): buffered,
    and with O_DIRECT where asked, each at its first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.fds: Dict[bool, int] = {}

    def fd(self, direct: bool) -> int:
        with self.lock:
            fd = self.fds.get(direct)
            if fd is None:
                flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (os.O_DIRECT if direct else 0)
                try:
                    fd = self.fds[direct] = os.open(self.path, flags)
                except OSError as e:
                    raise OSError(e.errno, f"{self.path}: {e.strerror}") from None
            return fd

    def close(self) -> None:
        with self.lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()


class _Reading:
    """A batch whose reads are queued: what it is read into, its pieces'
    futures and its files, closed once every piece is done."""

    def __init__(self, k: int, batch: np.ndarray, files: List[_SampleFile], stages: _Stages) -> None:
        self.k, self.batch, self.files, self.st = k, batch, files, stages
        self.futures: List[Any] = []
        self.slot = -1
        self.host: Any = None  # the ring buffer, on a GPU
        self.base = 0
        self.item: Any = None  # the CPU tensor handed out

    def wait(self) -> Optional[BaseException]:
        """Waits for every piece (none may still read when the files
        close), closes the files; the first error. A piece cancelled by the
        pool's shutdown counts as done (concurrent.futures.wait would wait
        for it forever: nothing notifies its waiters)."""
        t = time.perf_counter()
        err: Optional[BaseException] = None
        for fu in self.futures:
            try:
                e = fu.exception()
            except CancelledError as c:
                e = c
            err = err or e
        t = self.st.since("read_wait", t)
        for f in self.files:
            f.close()
        self.st.since("close", t)
        return err


class _Producer:
    """Reads an epoch's batches ahead, on its own thread."""

    def __init__(self, loader: Loader, order: np.ndarray, stages: _Stages) -> None:
        import torch
        self.l = loader
        self.st = stages
        d = loader.dir
        bs = loader.batch_size
        self.order = order
        self.batches = [order[i:i + bs] for i in range(0, len(order), bs)]
        if loader.drop_last and self.batches and len(self.batches[-1]) < bs:
            self.batches.pop()
        self.nsamples = sum(len(b) for b in self.batches)  # those read: not a dropped last batch
        self.nbytes = d.sample_nbytes
        # Samples sit at aligned offsets in the host buffers, so O_DIRECT
        # reads can land there.
        self.stride = -(-self.nbytes // _ALIGN) * _ALIGN
        nslots = loader._ahead(False) + 1
        on_gpu = loader.device.type == "cuda"
        self.stop = threading.Event()
        self.ahead = ThreadPoolExecutor(loader.open_ahead, thread_name_prefix="zarrfs-open-ahead") if loader.open_ahead else None
        self.opened = 0  # samples of the order, from the first, opened ahead or read
        # A cold mount starts filling the first batch and the samples after
        # it now, while the first epoch's ring is pinned and CUDA starts
        # (a second or so, which the fills would otherwise wait for).
        self._open_first()
        # The ring of pinned buffers the GPU copies from, the loader's own and
        # kept across epochs (pinning is slow); CPU batches are read straight
        # into the tensors handed out instead.
        try:
            self.ring = loader._ring(nslots) if on_gpu else []
            self.slot_bytes = bs * self.stride + _ALIGN
            self.stream = torch.cuda.Stream(device=loader.device) if on_gpu else None  # type: ignore[no-untyped-call]
        except BaseException:
            self.stop.set()  # the opens ahead end; the error is the caller's
            if self.ahead is not None:
                self.ahead.shutdown(wait=False, cancel_futures=True)
            raise
        self.events = loader._events if on_gpu else []
        self.out: queue.Queue[Tuple[Any, Any, Optional[BaseException]]] = queue.Queue(maxsize=loader._ahead(False))
        self.pool = ThreadPoolExecutor(loader.threads, thread_name_prefix="zarrfs-loader")

    def run(self) -> None:
        """Queues each batch's reads before waiting for the batch before it,
        so that the reader threads go on from one batch to the next rather
        than idling while a batch's last pieces finish (the ring has a
        buffer for each: prefetch + 1, at least 2), unless the batches read
        ahead wait for the consumer already."""
        pending: List[_Reading] = []  # batches whose reads are queued, in order
        end: BaseException = StopIteration()
        try:
            for k, batch in enumerate(self.batches):
                if self.stop.is_set():
                    break
                if pending and self.out.full():
                    # No room for the batch read: hand it out first, so
                    # that no more than prefetch batches wait read ahead.
                    self._finish(pending.pop(0))
                pending.append(self._start(k, batch))
                if len(pending) > 1:
                    self._finish(pending.pop(0))
            while pending and not self.stop.is_set():
                self._finish(pending.pop(0))
        except BaseException as e:  # handed to the consumer
            end = e
        for r in pending:  # stopped, or failed: no piece reads on, the files close
            r.wait()
        self._put_final((None, None, end))

    def _start(self, k: int, batch: np.ndarray) -> _Reading:
        """Queues batch k's reads: into its ring buffer (once the copy that
        last read that buffer is done) on a GPU, else into the CPU tensor
        handed out."""
        import torch
        st = self.st
        t = time.perf_counter()
        self._open_ahead(k)
        r = _Reading(k, batch, [_SampleFile(self.l.dir.file(int(p))) for p in batch], st)
        if self.ring:
            r.slot = k % len(self.ring)
            ev = self.events[r.slot]
            if ev is not None:
                t = st.since("submit", t)
                ev.synchronize()  # its previous copy is done: reuse
                t = st.since("slot_wait", t)
            r.host = self._slot(r.slot)
            t = st.since("pin", t)
            r.base = (-r.host.data_ptr()) % _ALIGN
            flat = r.host.numpy()
            views = [flat[r.base + j * self.stride: r.base + j * self.stride + self.nbytes] for j in range(len(batch))]
            aligned = True
        else:
            # CPU tensors: read straight into the batch handed out.
            out = torch.empty((len(batch), self.nbytes), dtype=torch.uint8, pin_memory=self.l.pinned)
            flat = out.numpy()
            views = [flat[j] for j in range(len(batch))]
            aligned = False
            r.item = out.view(self.l._torch_dtype).view((len(batch),) + self.l.dir.sample_shape)
        try:
            for j, f in enumerate(r.files):
                for off in range(0, self.nbytes, _PIECE):
                    r.futures.append(self.pool.submit(self._read, f, off, views[j][off:off + _PIECE], aligned))
        except BaseException:
            r.wait()
            raise
        st.since("submit", t)
        return r

    def _finish(self, r: _Reading) -> None:
        """Waits for batch r's reads, then copies it to the GPU (on a GPU)
        and hands it out."""
        st = self.st
        err = r.wait()
        if err is not None:
            raise err
        t = time.perf_counter()
        item: Any = self._deliver(r.host, r.base, len(r.batch), r.slot) if self.ring else r.item
        coords = self._coords_of(r.batch)
        t = st.since("h2d_issue", t)
        while not self.stop.is_set():
            try:
                self.out.put((item, coords, None), timeout=0.1)
                break
            except queue.Full:
                pass
        st.since("put_wait", t)
        st.add("batches", 1)
        st.add("samples", len(r.batch))
        st.add("bytes", len(r.batch) * self.nbytes)

    def _slot(self, slot: int) -> "torch.Tensor":
        """The ring slot's pinned buffer, pinned now if this is its first use
        (_pinned: no pageable copy to touch and copy first)."""
        import torch
        host = self.ring[slot]
        if host is None:
            # On the stream's device (the loader's, resolved where the
            # epoch was made): this thread's current device is otherwise
            # device 0, whose context a rank of another GPU must not start.
            assert self.stream is not None  # a ring is made on the GPU only
            with torch.cuda.device(self.stream.device):
                host = self.ring[slot] = _pinned(self.slot_bytes)
        return host

    def _open_first(self) -> None:
        """Opens, in the background, the first batch's samples and the
        open_ahead samples after it, before the epoch's setup."""
        if self.batches:
            self._open_until(len(self.batches[0]) + self.l.open_ahead)

    def _open_ahead(self, k: int) -> None:
        """Opens, in the background, the samples after batch k up to
        open_ahead of them: a cold mount starts filling them now."""
        first = k * self.l.batch_size + len(self.batches[k])
        self.opened = max(self.opened, first)
        self._open_until(first + self.l.open_ahead)

    def _open_until(self, end: int) -> None:
        """Opens, in the background, the samples of the order not yet
        opened before position end."""
        end = min(end, self.nsamples)
        if self.ahead is not None:
            for i in range(self.opened, end):
                self.ahead.submit(self._touch, self.l.dir.file(int(self.order[i])))
        self.opened = max(self.opened, end)

    def _touch(self, path: str) -> None:
        if self.stop.is_set():
            return
        try:
            os.close(os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        except OSError:
            pass  # the read of the sample reports it

    def _put_final(self, v: Tuple[Any, Any, Optional[BaseException]]) -> None:
        while not self.stop.is_set():
            try:
                self.out.put(v, timeout=0.1)
                return
            except queue.Full:
                pass

    def _read(self, f: _SampleFile, off: int, mv: np.ndarray, aligned: bool) -> None:
        """Reads piece off of sample f's data into mv, on a reader thread."""
        if self.stop.is_set():
            return
        st = self.st
        t = time.perf_counter()
        direct = self.l.odirect and aligned and off % _ALIGN == 0
        fd = f.fd(direct)
        t = st.since("open", t)
        want = len(mv)
        done = 0
        start = self.l.dir.data_offset + off
        while done < want:
            try:
                n = os.preadv(fd, [mv[done:]], start + done)  # type: ignore[list-item]  # an ndarray is a buffer
            except OSError as e:
                if direct and e.errno == 22:  # EINVAL: unaligned tail, read it buffered
                    direct = False
                    fd = f.fd(False)
                    continue
                raise OSError(e.errno, f"{f.path}: {e.strerror}") from None
            if n <= 0:
                raise OSError(5, f"{f.path}: ends after {start + done} bytes, want {start + want}")
            done += n
        st.since("pread", t)

    def _deliver(self, host: torch.Tensor, base: int, n: int, slot: int) -> Tuple[torch.Tensor, torch.cuda.Event]:
        import torch
        l = self.l
        shape = (n,) + l.dir.sample_shape
        with torch.cuda.stream(self.stream):
            dev = torch.empty((n, self.nbytes), dtype=torch.uint8, device=l.device)
            timed = self.st is not _NO_STAGES
            if timed:
                t0 = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                t0.record(self.stream)
            # One copy per sample: each is contiguous in pinned memory, so it
            # goes by DMA, asynchronously (a strided source would not).
            for j in range(n):
                off = base + j * self.stride
                dev[j].copy_(host[off: off + self.nbytes], non_blocking=True)
            ev = torch.cuda.Event(enable_timing=timed)  # type: ignore[no-untyped-call]
            ev.record(self.stream)
            if timed:
                with self.st.lock:
                    self.st.copies.append((t0, ev))
        self.events[slot] = ev
        dev = dev.view(l._torch_dtype).view(shape)
        return (dev, ev)

    def _coords_of(self, batch: np.ndarray) -> Dict[str, Any]:
        return _coords_of(self.l, batch)


def _coords_of(loader: Loader, batch: np.ndarray) -> Dict[str, Any]:
    """A batch's coordinates: global indices, files, the sample coordinate."""
    import torch
    d = loader.dir
    idx = d.first + d.step * batch.astype(np.int64)
    c = {"index": torch.from_numpy(idx), "file": [d.file(int(p)) for p in batch]}
    if loader._coords is not None and d.sample_dim:
        c[d.sample_dim] = loader._coords[batch]
    return c


def torch_current_stream(device: Any) -> Any:
    import torch
    return torch.cuda.current_stream(device)

def _shutdown(stop: threading.Event, pool: ThreadPoolExecutor, ahead: Optional[ThreadPoolExecutor],
              out: queue.Queue[Any], thread: threading.Thread) -> None:
    stop.set()
    if ahead is not None:
        # An open waits for its fill: let those under way end by themselves.
        ahead.shutdown(wait=False, cancel_futures=True)
    while True:  # unblock a producer waiting to put
        try:
            out.get_nowait()
        except queue.Empty:
            break
    pool.shutdown(wait=True, cancel_futures=True)
    if thread.is_alive() and threading.current_thread() is not thread:
        thread.join()
