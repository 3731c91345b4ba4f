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
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

from ._samples import SampleDir

__all__ = ["numpy_reader", "rank_files"]

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

