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
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

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
    ``prefetch + 1`` pinned buffers; ``prefetch`` batches are read ahead.
    Besides, the ``open_ahead`` samples (default 16) that follow the batch
    being read are opened (and closed) in the background: on a cold mount
    an open starts the sample's fill, so that many fill at once whatever
    the batch size; on a warm one an open costs a lookup. The
    loader's threads stop when an epoch's iteration ends, is abandoned, or
    fails; a sample that cannot be read (EIO from the mount: a corrupt chunk)
    raises an ``OSError`` naming its file. On a GPU one epoch reads at a
    time (the epochs share the pinned buffers): starting another iteration
    stops the one before, whose next ``next()`` raises ``RuntimeError``.
    """

    def __init__(self, sample_dir: Union[str, os.PathLike[str]], batch_size: int, *,
                 device: Union[str, torch.device] = "cuda", rank: int = 0, world: int = 1,
                 shard: str = "contiguous", shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                 threads: Optional[int] = None, prefetch: int = 2, odirect: bool = False,
                 even_batches: bool = False, open_ahead: int = 16, pin_memory: bool = False,
                 decode: str = "auto", copy: bool = False, timeout: float = 300.0) -> None:
        import torch

        self.dir = SampleDir(sample_dir)
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: want 1 or more")
        # The rank's share, as warm fills it (ValueError for a bad split).
        self._share = self.dir.positions(rank, world, shard)
        self._even = self.dir.min_share(world)
        if prefetch < 1:
            raise ValueError(f"prefetch {prefetch}: want 1 or more")
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
        self._lost: Optional[str] = None  # why the ring was let go (its daemon is gone)
        self._dring = self._open_ring()
        self.path_kind = self._path_kind()

    def _open_ring(self) -> Optional[Any]:
        """The mount's ring for this loader, when it decodes into this
        process's memory (docs/python.md): decode="device" insists, "auto"
        takes it on a GPU the mount decodes on and reads files otherwise."""
        if self.decode == "host" or (self.decode == "auto" and self.device.type != "cuda"):
            return None
        import torch
        from ._deliver import DeliveryError, DeliveryUnavailable, ring_for
        memory = "cuda" if self.device.type == "cuda" else "host"
        if memory == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        try:
            return ring_for(self.dir, memory, self.prefetch + 1, self.batch_size, self.device, self.timeout)
        except (DeliveryUnavailable, DeliveryError, OSError) as e:
            if self.decode == "device":
                raise RuntimeError(f"{self.dir.path}: decode='device': {e}") from None
            log.debug("zarrfs Loader reads files: %s", e)
            return None

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
        import torch
        if self._active is not None:
            try:
                self._active.superseded = True
                self._active.close()
            except ReferenceError:  # that epoch is gone, and its threads with it
                pass
        # The epoch before may have left copies from the ring in flight.
        for ev in self._events:
            if ev is not None:
                ev.synchronize()
        if not self._buffers:
            self._buffers = [None] * n
        self._events = [None] * len(self._buffers)
        return self._buffers

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
                f"prefetch={self.prefetch}, open_ahead={self.open_ahead}, path={self.path_kind!r}, samples={len(self.order())}, "
                f"sample={self.dir.sample_shape} {self.dir.dtype.str})")

    def __iter__(self) -> Iterator[Batch]:
        if self._lost is not None:
            from ._deliver import DeliveryError
            raise DeliveryError(f"{self.dir.path}: {self._lost}; this loader's ring is gone with it: make a new Loader")
        if self._dring is not None:
            from ._ringloader import RingEpoch
            self._stop_active()
            # The batches of the epoch before are done with, as of now on
            # the current stream.
            self._dring.release_all()
            r = RingEpoch(self, self.order())
            self._active = weakref.proxy(r)
            return r
        e = _Epoch(self, self.order())
        self._active = weakref.proxy(e)
        return e

    def _stop_active(self) -> None:
        if self._active is not None:
            try:
                self._active.superseded = True
                self._active.close()
            except ReferenceError:  # that epoch is gone, and its threads with it
                pass

    def _lose_ring(self, err: BaseException) -> None:
        """The ring's daemon is gone (or stopped answering): the ring takes
        no more batches. The loader lets go of it, so that its mapping
        closes as soon as the batches over it are gone, even while the
        loader is kept, and every later epoch raises err. Its text alone
        is kept: its traceback holds the epoch, which holds the ring."""
        self._lost = str(err)
        self._dring = None

    def close(self) -> None:
        """Stops the epoch under way and gives the mount's ring back (also
        done when the loader and every batch of its ring are gone)."""
        self._stop_active()
        if self._dring is not None:
            self._dring.close()


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


class _Epoch:
    """One pass over the loader's order, as the consumer sees it: a
    producer thread (_Producer) reads batches ahead into a ring of host
    buffers and copies each to the device; ``__next__`` hands them out in
    order. The producer holds no reference to this object, so dropping it
    stops the producer."""

    def __init__(self, loader: Loader, order: np.ndarray) -> None:
        p = _Producer(loader, order)
        self.out, self.batches = p.out, p.batches
        self.superseded = False
        self.thread = threading.Thread(target=p.run, name="zarrfs-loader", daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, p.stop, p.pool, p.ahead, p.out, self.thread)
        self.thread.start()

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __len__(self) -> int:
        return len(self.batches)

    def __next__(self) -> Batch:
        import torch
        while True:
            try:
                item, coords, err = self.out.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.out.empty():
                    self.close()
                    if self.superseded:
                        raise RuntimeError("zarrfs Loader: this epoch was stopped when another iteration over "
                                           "the same Loader started (one epoch reads at a time)")
                    raise StopIteration
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
        return item, coords

    def close(self) -> None:
        """Stop the threads of this epoch (also done when it ends or is dropped)."""
        self._finalizer()


class _Producer:
    """Reads an epoch's batches ahead, on its own thread."""

    def __init__(self, loader: Loader, order: np.ndarray) -> None:
        import torch
        self.l = loader
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
        nslots = loader.prefetch + 1
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
        self.out: queue.Queue[Tuple[Any, Any, Optional[BaseException]]] = queue.Queue(maxsize=loader.prefetch)
        self.pool = ThreadPoolExecutor(loader.threads, thread_name_prefix="zarrfs-loader")

    def run(self) -> None:
        import torch
        try:
            for k, batch in enumerate(self.batches):
                if self.stop.is_set():
                    return
                self._open_ahead(k)
                if self.ring:
                    slot = k % len(self.ring)
                    ev = self.events[slot]
                    if ev is not None:
                        ev.synchronize()  # its previous copy is done: reuse
                    host = self._slot(slot)
                    base = (-host.data_ptr()) % _ALIGN
                    flat = host.numpy()
                    views = [flat[base + j * self.stride: base + j * self.stride + self.nbytes] for j in range(len(batch))]
                    self._read_batch(batch, views, aligned=True)
                    item: Any = self._deliver(host, base, len(batch), slot)
                else:
                    # CPU tensors: read straight into the batch handed out.
                    out = torch.empty((len(batch), self.nbytes), dtype=torch.uint8, pin_memory=self.l.pinned)
                    flat = out.numpy()
                    self._read_batch(batch, [flat[j] for j in range(len(batch))], aligned=False)
                    item = out.view(self.l._torch_dtype).view((len(batch),) + self.l.dir.sample_shape)
                coords = self._coords_of(batch)
                while not self.stop.is_set():
                    try:
                        self.out.put((item, coords, None), timeout=0.1)
                        break
                    except queue.Full:
                        pass
        except BaseException as e:  # handed to the consumer
            self._put_final((None, None, e))
            return
        self._put_final((None, None, StopIteration()))

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

    def _read_batch(self, batch: np.ndarray, views: Sequence[np.ndarray], aligned: bool) -> None:
        d = self.l.dir
        jobs = []
        for j, pos in enumerate(batch):
            path = d.file(int(pos))
            for off in range(0, self.nbytes, _PIECE):
                jobs.append((path, off, views[j][off:off + _PIECE], aligned))
        futures = [self.pool.submit(self._read, *job) for job in jobs]
        err = None
        for f in futures:
            e = f.exception()
            err = err or e
        if err is not None:
            raise err

    def _read(self, path: str, off: int, mv: np.ndarray, aligned: bool) -> None:
        if self.stop.is_set():
            return
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        direct = self.l.odirect and aligned and off % _ALIGN == 0
        try:
            fd = os.open(path, flags | (os.O_DIRECT if direct else 0))
        except OSError as e:
            raise OSError(e.errno, f"{path}: {e.strerror}") from None
        try:
            want = len(mv)
            done = 0
            start = self.l.dir.data_offset + off
            while done < want:
                try:
                    n = os.preadv(fd, [mv[done:]], start + done)  # type: ignore[list-item]  # an ndarray is a buffer
                except OSError as e:
                    if direct and e.errno == 22:  # EINVAL: unaligned tail, read it buffered
                        os.close(fd)
                        fd = -1
                        fd = os.open(path, flags)
                        direct = False
                        continue
                    raise OSError(e.errno, f"{path}: {e.strerror}") from None
                if n <= 0:
                    raise OSError(5, f"{path}: ends after {start + done} bytes, want {start + want}")
                done += n
        finally:
            if fd >= 0:
                os.close(fd)

    def _deliver(self, host: torch.Tensor, base: int, n: int, slot: int) -> Tuple[torch.Tensor, torch.cuda.Event]:
        import torch
        l = self.l
        shape = (n,) + l.dir.sample_shape
        with torch.cuda.stream(self.stream):
            dev = torch.empty((n, self.nbytes), dtype=torch.uint8, device=l.device)
            # One copy per sample: each is contiguous in pinned memory, so it
            # goes by DMA, asynchronously (a strided source would not).
            for j in range(n):
                off = base + j * self.stride
                dev[j].copy_(host[off: off + self.nbytes], non_blocking=True)
            ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ev.record(self.stream)
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
