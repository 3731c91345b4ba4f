"""DALI's numpy reader over a zarrfs sample directory, sharded like ``zarrfs warm``.

Two traps this module avoids:

- Given ``file_root`` alone, DALI stats every entry of the directory while
  the pipeline is built. On a ``--direct`` mount a stat resolves the link,
  which fills the sample, so building the pipeline would decode the whole
  directory. The reader here passes an explicit ``files`` list computed from
  the sidecar: building fills nothing, and files fill as they are read.
- With ``num_shards`` > 1, DALI moves each reader to the next shard every
  epoch unless ``stick_to_shard=True``; its ``random_shuffle`` permutes the
  whole file list (with a fixed seed) before splitting it, and
  ``shuffle_after_epoch`` cannot be combined with ``stick_to_shard``. Any of
  these makes a rank read samples other than the ones ``zarrfs warm --rank R
  --world W`` filled on its node. So the reader is given only the rank's own
  files (the contiguous block warm fills, or what a ``--rank/--world`` mount
  lists) and DALI shards nothing: every epoch reads exactly that block, and
  shuffling permutes it anew each epoch (``shuffle_after_epoch``).

The ``name`` of the reader (default: the directory's name) is what
``DALIGenericIterator(..., reader_name=...)`` needs to know the epoch size.

``ring_reader`` (in a pipeline) and ``ring_source`` (for
``fn.external_source``) read instead from the mount's ring: the daemon
decodes each batch's chunks on the pipeline's GPU straight into device
memory shared with this process (docs/design.md §13), and DALI copies the
batch into its own buffers on the source's stream, after which the slot is
given back (see RingSource).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterator, List, Optional, Union

from ._samples import SampleDir

__all__ = ["numpy_reader", "rank_files", "ring_reader", "ring_source", "RingSource"]

# Arguments the reader sets itself; passing them would defeat the sharding.
_OWN = ("file_root", "files", "file_list", "file_filter", "shard_id", "num_shards", "stick_to_shard")


def rank_files(mount_dir: Union[str, "os.PathLike[str]", SampleDir], rank: int = 0, world: int = 1,
               shard: str = "contiguous") -> List[str]:
    """The file names (relative to mount_dir) that rank reads, in order.

    On a directory that lists every sample, rank R of W gets what ``zarrfs
    warm --rank R --world W --shard SHARD`` fills (contiguous: a block, as
    DALI splits; interleaved: R, R+W, ...); on a per-rank directory
    (``zarrfs mount --rank R --world W``, its sidecar has "shard") the files
    it lists, and rank/world must be left at 0/1 or match the mount's.
    """
    d = mount_dir if isinstance(mount_dir, SampleDir) else SampleDir(mount_dir)
    names = d.names
    return [names[int(p)] for p in d.positions(rank, world, shard)]


def numpy_reader(mount_dir: Union[str, "os.PathLike[str]"], *, device: str = "cpu", rank: int = 0, world: int = 1,
                 shuffle: bool = False, seed: Optional[int] = None, shard: str = "contiguous", **kwargs: Any) -> Any:
    """``fn.readers.numpy`` over a sample directory of a zarrfs mount; call it inside a pipeline.

    mount_dir is ``MOUNT/ARRAY`` or ``MOUNT/VIEW``. rank/world select the
    share that ``zarrfs warm --rank/--world`` fills (contiguous blocks, or
    ``shard="interleaved"`` as ``warm --shard interleaved``); on a per-rank
    ``--rank/--world`` mount leave them out. shuffle=True reads the
    rank's samples in a new order every epoch (``seed`` fixes the sequence of
    orders). ``device="gpu"`` reads with cuFile (GPUDirect Storage)
    and needs a ``--direct`` mount, since cuFile cannot read FUSE files.

    The last batch of an epoch is padded (``pad_last_batch=True``) so that
    every epoch starts at the rank's first sample; DALI's iterators drop the
    padding with ``reader_name=`` and ``LastBatchPolicy.PARTIAL``. Other
    keyword arguments go to ``fn.readers.numpy`` unchanged.
    """
    from nvidia.dali import fn

    if device not in ("cpu", "gpu"):
        raise ValueError(f"device={device!r}: want 'cpu' or 'gpu'")
    for k in _OWN:
        if k in kwargs:
            raise TypeError(f"numpy_reader sets {k} itself (from the mount's sidecar and rank/world); do not pass it")
    if shuffle and kwargs.get("random_shuffle"):
        raise TypeError("shuffle=True and random_shuffle=True: choose one")
    d = SampleDir(mount_dir)
    files = rank_files(d, rank, world, shard)
    if device == "gpu" and not d.is_direct():
        raise ValueError(f"{d.path}: device='gpu' reads with cuFile, which cannot read files on FUSE; "
                         "mount with --direct (zarrfs.Mount(..., direct=True)) so that sample files "
                         "are links to the cache's files")
    args: Dict[str, Any] = dict(
        file_root=d.path,
        files=files,
        name=d.name,
        pad_last_batch=True,
        bytes_per_sample_hint=d.sample_nbytes + d.data_offset,
    )
    if shuffle:
        args["shuffle_after_epoch"] = True
        if seed is not None:
            args["shuffle_after_epoch_seed"] = seed
    elif seed is not None:
        args["seed"] = seed
    args.update(kwargs)
    return fn.readers.numpy(device=device, **args)


# external_source arguments ring_reader sets itself: the source, how DALI
# takes its batches (copied, on the source's stream) and its epochs.
_RING_OWN = ("source", "batch", "no_copy", "parallel", "cuda_stream", "cycle", "device", "dtype", "ndim")


class RingSource:
    """Batches of a sample directory from the mount's ring, for
    ``fn.external_source(source=src, batch=True, cycle="raise", ...)``.

    Each iteration is an epoch of a ``zarrfs.torch.Loader`` with
    ``decode="device"`` (the same share of ``rank`` of ``world``, the same
    order: ``seed + epoch`` when shuffled, epochs counted by iterations),
    and yields its batches: on ``device="gpu"`` CUDA tensors backed by the
    ring's slots on GPU ``device_id``, on ``device="cpu"`` NumPy arrays over
    the ring of the mount's test mode (``--delivery host``).

    A slot is given back to the daemon when the next batch is taken, so
    DALI must copy each batch (``no_copy=False``, external_source's default)
    on ``cuda_stream``: DALI schedules that copy on the stream when it is
    fed the batch, the next take records the slot's consumer event on the
    same stream, and the daemon's writes into the slot wait for the event.
    ``no_copy=True`` cannot be met: DALI keeps a buffer fed without a copy
    for ``prefetch_queue_depth`` iterations and says on no stream when its
    kernels stop reading it. ``ring_reader`` passes all of this.
    """

    def __init__(self, sample_dir: Union[str, "os.PathLike[str]"], batch_size: int, *, device: str = "gpu",
                 device_id: Optional[int] = None, rank: int = 0, world: int = 1, shard: str = "contiguous",
                 shuffle: bool = False, seed: int = 0, drop_last: bool = False, even_batches: bool = False,
                 prefetch: Optional[int] = None, timeout: float = 300.0) -> None:
        import torch

        from .loader import Loader

        if device not in ("cpu", "gpu"):
            raise ValueError(f"device={device!r}: want 'gpu' (the mount's GPU ring) or 'cpu' (its test mode)")
        if device == "gpu":
            if device_id is None:
                device_id = torch.cuda.current_device()
            tdev = torch.device("cuda", device_id)
        else:
            tdev = torch.device("cpu")
        self.device = device
        self.loader = Loader(sample_dir, batch_size, device=tdev, rank=rank, world=world, shard=shard,
                             shuffle=shuffle, seed=seed, drop_last=drop_last, even_batches=even_batches,
                             prefetch=prefetch, decode="device", timeout=timeout)
        self.stream = torch.cuda.Stream(device=tdev) if device == "gpu" else None  # type: ignore[no-untyped-call]
        self.epoch = 0  # the epoch the next iteration reads
        d = self.loader.dir
        self.ndim = len(d.sample_shape)  # a sample's, as DALI counts
        self.numpy_dtype = d.dtype

    @property
    def cuda_stream(self) -> Any:
        """The stream DALI must copy the batches on (None on the CPU)."""
        return self.stream

    @property
    def dtype(self) -> Any:
        """The batches' DALI data type."""
        from nvidia.dali import types
        return types.to_dali_type(self.numpy_dtype)  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        return len(self.loader)

    def _on_stream(self) -> Any:
        """The source's stream as the current one: the loader records the
        consumer event and waits for a slot's event on it."""
        if self.stream is None:
            return contextlib.nullcontext()
        import torch
        return torch.cuda.stream(self.stream)

    def __iter__(self) -> Iterator[Any]:
        self.loader.set_epoch(self.epoch)
        self.epoch += 1
        with self._on_stream():
            it = iter(self.loader)
        return _RingBatches(self, it)

    def close(self) -> None:
        """Stops the epoch under way and gives the ring back."""
        self.loader.close()


class _RingBatches:
    """One epoch of a RingSource."""

    def __init__(self, src: RingSource, it: Any) -> None:
        self.src, self.it = src, it

    def __iter__(self) -> "_RingBatches":
        return self

    def __next__(self) -> Any:
        # Taking the next batch gives the slot of the one before back,
        # ordered after DALI's copy of it on the same stream.
        with self.src._on_stream():
            x, _ = next(self.it)
        return x if self.src.stream is not None else x.numpy()


def ring_source(sample_dir: Union[str, "os.PathLike[str]"], batch_size: int, **kwargs: Any) -> RingSource:
    """A RingSource: batches of batch_size samples of sample_dir from the
    mount's ring; keyword arguments as RingSource's."""
    return RingSource(sample_dir, batch_size, **kwargs)


def ring_reader(sample_dir: Union[str, "os.PathLike[str]"], *, device: str = "gpu", rank: int = 0, world: int = 1,
                shard: str = "contiguous", shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                even_batches: bool = False, prefetch: Optional[int] = None, timeout: float = 300.0, **kwargs: Any) -> Any:
    """``fn.external_source`` fed by the mount's ring; call it inside a pipeline.

    The batches are the pipeline's batch size, decoded by the mount on the
    pipeline's GPU (``device_id``) into a ring shared with this process,
    and copied by DALI into its buffers on the source's stream. rank,
    world, shard, shuffle, seed, drop_last and even_batches are
    ``zarrfs.torch.Loader``'s: the share ``zarrfs warm --rank/--world``
    fills, in a new order every epoch when shuffled. An epoch ends with
    StopIteration (``cycle="raise"``): iterate with DALIGenericIterator and
    reset it between epochs; the last batch of an epoch may be smaller.
    ``device="cpu"`` reads the ring of the mount's test mode (``zarrfs
    mount --delivery host``) in a CPU pipeline. Other keyword arguments
    (``name``, ``layout``, ...) go to ``fn.external_source``; those that
    would break the ring's contract are refused.
    """
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    for k in _RING_OWN:
        if k in kwargs:
            raise TypeError(f"ring_reader sets {k} itself (batches copied from the ring on its stream); do not pass it")
    pipe = Pipeline.current()  # type: ignore[no-untyped-call]
    if pipe is None:
        raise RuntimeError("ring_reader is called inside a pipeline definition (it takes the pipeline's batch size and GPU)")
    device_id = None
    if device == "gpu":
        device_id = pipe.device_id
        if device_id is None:
            raise ValueError("device='gpu': the pipeline has no GPU (device_id=None); the ring is on the pipeline's GPU")
    src = RingSource(sample_dir, pipe.max_batch_size, device=device, device_id=device_id, rank=rank, world=world,
                     shard=shard, shuffle=shuffle, seed=seed, drop_last=drop_last, even_batches=even_batches,
                     prefetch=prefetch, timeout=timeout)
    return fn.external_source(source=src, batch=True, device=device, cuda_stream=src.cuda_stream, no_copy=False,
                              cycle="raise", dtype=src.dtype, ndim=src.ndim, **kwargs)
