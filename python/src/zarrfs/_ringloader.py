"""Loader epochs through a mount's ring (device delivery): the daemon fills
slot after slot with batches, the consumer takes tensors backed by them.

A producer thread asks for batch j in slot j % S once the batch that held
the slot before, j - S, is released; the consumer releases batch j - 1 when
it takes batch j (with ``copy=True``, as soon as it is copied). On a GPU a
release records the slot's consumer event on the current stream first, and
the daemon's writes into that slot wait for it (for no other slot's); a
batch handed out makes the current stream wait for its slot's event,
recorded by the daemon once the slot is written.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from ._deliver import DeliveryError, Ring

if TYPE_CHECKING:
    from .loader import Loader


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
        self.l, self.ring = loader, ring
        self.flow = _Flow()
        self.out: queue.Queue[Tuple[Any, Optional[BaseException]]] = queue.Queue()
        self.taken = 0
        self.superseded = False
        d = loader.dir
        names = [[os.path.basename(d.file(int(p))) for p in b] for b in batches]
        self._coords = [_coords_of(loader, b) for b in batches]
        self.thread = threading.Thread(target=_produce, args=(ring, names, d.path, self.flow, self.out),
                                       name="zarrfs-ring", daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, self.flow, self.thread)
        self.thread.start()

    def __iter__(self) -> "RingEpoch":
        return self

    def __len__(self) -> int:
        return len(self.batches)

    def _release(self) -> None:
        """Gives the oldest batch still held back, and its slot, to the daemon."""
        # Batch j is in slot j % S; released is written by this thread only.
        self.ring.release(self.flow.released % self.ring.slots)
        with self.flow.cond:
            self.flow.released += 1
            self.flow.cond.notify_all()

    def __next__(self) -> Tuple[Any, Dict[str, Any]]:
        import torch
        if self.superseded:
            # Its slots are the next epoch's now, whatever it had read ahead.
            self.close()
            raise RuntimeError("zarrfs Loader: this epoch was stopped when another iteration over "
                               "the same Loader started (one epoch reads at a time)")
        held = self.taken - self.flow.released
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
            self.close()
            if isinstance(err, StopIteration):
                raise StopIteration
            if isinstance(err, DeliveryError):
                self.l._lose_ring(err)
            raise err
        j, slot = item
        ring = self.ring
        t = ring.slot(slot, len(self.batches[j]))
        if ring.memory == "cuda":
            torch.cuda.current_stream(ring.device).wait_event(ring.events[slot])
        self.taken += 1
        if self.l.copy:
            t = t.clone()
            self._release()
        return t, self._coords[j]

    def close(self) -> None:
        """Stop the producer (also done when the epoch ends or is dropped);
        it waits for the fills it asked for."""
        self._finalizer()


def _produce(ring: Ring, names: List[List[str]], dirpath: str, flow: _Flow,
             out: "queue.Queue[Tuple[Any, Optional[BaseException]]]") -> None:
    S = ring.slots
    nb = len(names)
    sent = got = handed = 0
    ready: Dict[int, Dict[str, Any]] = {}
    last = time.monotonic()
    final: BaseException = StopIteration()
    try:
        while handed < nb and not flow.stop.is_set():
            with flow.cond:
                while sent < nb and sent - flow.released < S:
                    ring.send({"op": "fill", "slot": sent % S, "files": names[sent]})
                    sent += 1
                if sent == got:  # nothing in flight: wait for the consumer
                    flow.cond.wait(0.1)
                    last = time.monotonic()
                    continue
            rep = ring.recv(timeout=0.1)
            if rep is None:
                if time.monotonic() - last > ring.timeout:
                    raise DeliveryError(f"the mount's daemon filled no slot in {ring.timeout:g} s")
                continue
            last = time.monotonic()
            got += 1
            slot = int(rep.get("slot", -1))
            if rep.get("op") != "ready" and not 0 <= slot < S:
                raise _fill_error(rep, dirpath)  # about no batch: the connection
            # Replies come in any order: a batch's error is raised in its
            # turn, after the batches before it, however fast it failed.
            ready[slot] = rep
            while handed < nb and handed % S in ready:
                rep = ready.pop(handed % S)
                if rep.get("op") != "ready":
                    raise _fill_error(rep, dirpath)
                out.put(((handed, handed % S), None))
                handed += 1
    except BaseException as e:
        final = e
    # Fills asked for are written into the ring whatever happens: wait for
    # their replies, so the next epoch's first fills find their slots free.
    deadline = time.monotonic() + ring.timeout
    while got < sent and time.monotonic() < deadline and isinstance(final, (StopIteration, OSError)):
        try:
            if ring.recv(timeout=0.5) is not None:
                got += 1
        except DeliveryError:
            break
    out.put((None, final))


def _fill_error(rep: Dict[str, Any], dirpath: str) -> BaseException:
    msg = rep.get("error", "fill failed")
    f = rep.get("file")
    if rep.get("code") == "fill" and f:
        return OSError(errno.EIO, f"{os.path.join(dirpath, os.path.basename(f))}: {msg}")
    return DeliveryError(msg)


def _shutdown(flow: _Flow, thread: threading.Thread) -> None:
    flow.stop.set()
    with flow.cond:
        flow.cond.notify_all()
    if thread.is_alive() and threading.current_thread() is not thread:
        thread.join()
