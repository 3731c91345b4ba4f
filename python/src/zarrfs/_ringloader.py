"""Loader epochs through a mount's ring (device delivery): the daemon fills
slot after slot with batches, the consumer takes tensors backed by them.

A producer thread asks for batch j in slot j % S once the batch that held
the slot before, j - S, is released; the consumer releases batch j - 1 when
it takes batch j (with ``copy=True``, as soon as it is copied). On a GPU a
release records the slot's consumer event on the current stream first, and
the daemon's writes into that slot wait for it (for no other slot's); a
batch handed out makes the current stream wait for its slot's event,
recorded by the daemon once the slot is written.

An epoch stopped with fills under way leaves their replies owed on the
ring (Ring.owed); the next epoch's producer reads and drops them before it
asks for anything, so each batch is handed out on its own fill's reply.

A ring the daemon lost (a GPU context it rebuilt after a device error:
RingLost) is replaced within the epoch: a new ring is opened and a new
producer fills the batches from the one in turn (RingEpoch._reopen); with
decode="auto" and no ring to be had, the files are read from there.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, NoReturn, Optional, Tuple

import numpy as np

from ._deliver import RING_LOST, DeliveryError, Ring, RingLost

if TYPE_CHECKING:
    from .loader import Loader

log = logging.getLogger("zarrfs")


class _Flow:
    """What the consumer and the producer share: the count of batches
    released, under a condition, and the stop flag."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.released = 0
        self.stop = threading.Event()


class RingEpoch:
    """One pass over the loader's order through its ring. The producer holds
    no reference to this object, so dropping it stops the producer."""

    def __init__(self, loader: "Loader", order: np.ndarray) -> None:
        from .loader import _coords_of
        ring = loader._dring
        assert ring is not None
        bs = loader.batch_size
        batches = [order[i:i + bs] for i in range(0, len(order), bs)]
        if loader.drop_last and batches and len(batches[-1]) < bs:
            batches.pop()
        self.batches = batches
        self.l = loader
        self.taken = 0
        self.stopped: Optional[str] = None  # why the loader stopped this epoch
        d = loader.dir
        self._names = [[os.path.basename(d.file(int(p))) for p in b] for b in batches]
        self._coords = [_coords_of(loader, b) for b in batches]
        self._renewed: Optional[int] = None  # the batch in turn when the ring was last replaced
        self._files: Optional[Any] = None  # the files' epoch reading the rest (decode="auto", no ring)
        self._start(ring, 0)

    def _start(self, ring: Ring, base: int) -> None:
        """Starts a producer filling the batches from base on into ring."""
        self.ring: Optional[Ring] = ring  # None once the epoch is over: the batches hold it on
        self.base = base  # the ring's batch j is the epoch's batch base + j
        self.flow = _Flow()
        self.out: queue.Queue[Tuple[Any, Optional[BaseException]]] = queue.Queue()
        self.thread = threading.Thread(target=_produce, args=(ring, self._names[base:], self.l.dir.path, self.flow, self.out),
                                       name="zarrfs-ring", daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, self.flow, self.thread)
        self.thread.start()

    def __iter__(self) -> "RingEpoch":
        return self

    def __len__(self) -> int:
        return len(self.batches)

    def _release(self) -> None:
        """Gives the oldest batch still held back, and its slot, to the daemon."""
        assert self.ring is not None  # the epoch is under way
        # Batch j is in slot j % S; released is written by this thread only.
        self.ring.release(self.flow.released % self.ring.slots)
        with self.flow.cond:
            self.flow.released += 1
            self.flow.cond.notify_all()

    def __next__(self) -> Tuple[Any, Dict[str, Any]]:
        import torch
        if self.stopped is not None:
            # Its slots are the next epoch's now (or nobody's), whatever it
            # had read ahead.
            self.close()
            raise RuntimeError(self.stopped)
        if self._files is not None:
            return next(self._files)  # type: ignore[no-any-return]
        ring = self.ring
        if ring is None:  # ended, or failed
            raise StopIteration
        held = self.taken - self.base - self.flow.released
        if held > 0:
            self._release()  # the batch before: the consumer is done with it
        while True:
            try:
                item, err = self.out.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.out.empty():
                    self.close()
                    raise StopIteration
        if err is not None:
            del ring  # the error's traceback holds this frame, not the ring
            if not (isinstance(err, RingLost) and self._reopen(err)):
                try:
                    self._end(err)
                finally:
                    # Nor the error: a frame its traceback holds that held
                    # it in turn would keep both, and the caller's frame,
                    # its batches with their ring, until a full collection.
                    del err
            return self.__next__()
        j, slot = item
        j += self.base
        t = ring.slot(slot, len(self.batches[j]))
        if ring.memory == "cuda":
            torch.cuda.current_stream(ring.device).wait_event(ring.events[slot])
        self.taken += 1
        if self.l.copy:
            t = t.clone()
            self._release()
        return t, self._coords[j]

    def _reopen(self, err: RingLost) -> bool:
        """Goes on from the batch in turn over a new ring, for a ring the
        daemon lost (it lives): the batch in hand stays readable (its
        tensor holds the old ring's mapping), the old ring's fills are left
        to it. Not twice for one batch (a new ring lost before it filled
        one: the loss is the device's), nor where no ring opens: then
        decode="auto" reads the files from the batch in turn, and otherwise
        the epoch ends with err, as close as it can say why."""
        if self.l._closed:
            return False
        self._finalizer()  # the producer put its last word: it is done
        if self._renewed == self.taken:
            # A device that keeps failing: "auto" reads the files instead.
            if self.l.decode != "auto":
                return False
            self._read_files(err)
            return True
        self._renewed = self.taken
        try:
            ring = self.l._open_ring()
        except RuntimeError as e:  # decode="device": no ring opens
            err.args = (f"{err}; no new ring: {e}",)
            return False
        if ring is None:  # decode="auto": no ring to be had, the files are
            self._read_files(err)
            return True
        log.warning("zarrfs Loader: %s; going on from batch %d over a new ring", err, self.taken)
        self.l._dring = ring
        self._start(ring, self.taken)
        return True

    def _read_files(self, err: RingLost) -> None:
        """Goes on from the batch in turn reading the files (decode="auto"
        with no ring to be had): the same batches, in the same order. The
        loader lets go of the ring, and its next epoch tries for one again."""
        from .loader import _Epoch
        log.warning("zarrfs Loader: %s; no new ring: reading the files from batch %d", err, self.taken)
        self.ring = None
        self.l._lose_ring(err)
        order = np.concatenate(self.batches[self.taken:])  # the batch in turn failed: one at least
        # The files' epoch takes the loader's pinned buffers, which stops
        # the loader's epoch under way: this one, which stays it.
        self.l._active = None
        self._files = _Epoch(self.l, order)
        self.l._active = weakref.proxy(self)
        self.l.path_kind = self.l._path_kind()

    def _end(self, err: BaseException) -> NoReturn:
        """Ends the epoch with the producer's last word."""
        self.close()
        if isinstance(err, StopIteration):
            raise StopIteration
        if isinstance(err, DeliveryError):
            self.l._lose_ring(err)
        try:
            if isinstance(err, (OSError, DeliveryError)):
                # Its text says it all; the producer's frames would hold the
                # ring open for as long as the error is kept.
                raise err.with_traceback(None)
            raise err
        finally:
            del err  # this frame, in the traceback, holds no reference to it

    def close(self) -> None:
        """Stop the producer (also done when the epoch ends or is dropped).
        The fills it asked for are the next epoch's to wait for."""
        self._finalizer()
        self.ring = None
        if self._files is not None:
            self._files.close()


def _produce(ring: Ring, names: List[List[str]], dirpath: str, flow: _Flow,
             out: "queue.Queue[Tuple[Any, Optional[BaseException]]]") -> None:
    final: BaseException = StopIteration()
    # One producer reads the socket at a time: one stopped is gone within
    # its poll, and leaves the replies it was owed on the ring.
    with ring.turn:
        try:
            _settle(ring, flow)
            _fill(ring, names, dirpath, flow, out)
        except BaseException as e:
            final = e
    out.put((None, final))


def _settle(ring: Ring, flow: _Flow) -> None:
    """Reads, and drops, the replies owed to the fills of an epoch stopped
    before they came (the daemon writes those slots whatever happens, and
    refuses a fill of a slot being filled): this epoch's fills, and only
    theirs, then have replies under way."""
    last = time.monotonic()
    while ring.owed and not flow.stop.is_set():
        rep = ring.recv(timeout=0.1)
        if rep is None:
            if time.monotonic() - last > ring.timeout:
                raise DeliveryError(f"the mount's daemon did not answer the fills of slots {sorted(ring.owed)} "
                                    f"of an epoch stopped before in {ring.timeout:g} s")
            continue
        last = time.monotonic()
        _answered(ring, rep)


def _answered(ring: Ring, rep: Dict[str, Any]) -> int:
    """The slot a fill reply answers, no longer owed; a reply to no fill
    under way (the daemon's refusal of the connection) raises."""
    S = ring.slots
    slot = int(rep.get("slot", -1))
    if rep.get("op") != "ready" and not 0 <= slot < S:
        raise DeliveryError(str(rep.get("error") or "fill failed"))  # about no batch: the connection
    if slot not in ring.owed:
        raise DeliveryError(f"the mount's daemon answered a fill of slot {slot}, which has none under way")
    ring.owed.discard(slot)
    return slot


def _fill(ring: Ring, names: List[List[str]], dirpath: str, flow: _Flow,
          out: "queue.Queue[Tuple[Any, Optional[BaseException]]]") -> None:
    S = ring.slots
    nb = len(names)
    sent = handed = 0
    ready: Dict[int, Dict[str, Any]] = {}
    last = time.monotonic()
    while handed < nb and not flow.stop.is_set():
        with flow.cond:
            while sent < nb and sent - flow.released < S:
                ring.fill(sent % S, names[sent])
                sent += 1
            if not ring.owed:  # nothing in flight: wait for the consumer
                flow.cond.wait(0.1)
                last = time.monotonic()
                continue
        rep = ring.recv(timeout=0.1)
        if rep is None:
            if time.monotonic() - last > ring.timeout:
                raise DeliveryError(f"the mount's daemon filled no slot in {ring.timeout:g} s")
            continue
        last = time.monotonic()
        # Replies come in any order: a batch's error is raised in its
        # turn, after the batches before it, however fast it failed.
        ready[_answered(ring, rep)] = rep
        while handed < nb and handed % S in ready:
            rep = ready.pop(handed % S)
            if rep.get("op") != "ready":
                raise _fill_error(rep, dirpath)
            out.put(((handed, handed % S), None))
            handed += 1


def _fill_error(rep: Dict[str, Any], dirpath: str) -> BaseException:
    msg = rep.get("error", "fill failed")
    f = rep.get("file")
    if rep.get("code") == RING_LOST:
        return RingLost(msg)
    if rep.get("code") == "fill" and f:
        return OSError(errno.EIO, f"{os.path.join(dirpath, os.path.basename(f))}: {msg}")
    return DeliveryError(msg)


def _shutdown(flow: _Flow, thread: threading.Thread) -> None:
    # The producer sees stop within its poll (0.1 s), or once a send the
    # daemon does not read times out.
    flow.stop.set()
    with flow.cond:
        flow.cond.notify_all()
    if thread.is_alive() and threading.current_thread() is not thread:
        thread.join()
