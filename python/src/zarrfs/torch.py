"""PyTorch over a zarrfs sample directory: a map-style Dataset, and Loader,
which reads batches straight into GPU memory."""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Union

import numpy as np

try:
    import torch
    from torch.utils.data import Dataset as _Base
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("zarrfs.torch needs PyTorch (pip install torch)") from e

from ._samples import SampleDir, read_into
from .loader import Loader

__all__ = ["Loader", "SampleDataset"]


class SampleDataset(_Base[Any]):
    """The samples of ``MOUNT/ARRAY`` or ``MOUNT/VIEW``, one item per listed file.

    ``ds[i]`` is ``(sample, coord)``: the sample as a tensor of the sidecar's
    ``sample_shape`` and dtype, and the sample coordinate of that file (a
    time step as int64 nanoseconds since 1970, ``numpy.datetime64(coord,
    "ns")`` gives it back; without a coordinate array, the global sample
    index). With ``coords=False`` items are the samples alone.

    Without a transform, a sample is read with one read at the sidecar's
    ``data_offset`` straight into the tensor's memory: no memory map to
    fault in page by page and then copy. ``transform`` gets the sample memory-mapped
    (``numpy.load(..., mmap_mode="r")``), so a crop reads only the pages it
    touches; what it returns becomes the tensor (copied if it is a view of
    the read-only map).

    ``ds.coords`` holds every item's coordinate, CF-decoded (datetime64 for
    times), ``ds.indices`` the global sample indices, ``ds.files`` the paths.

    ``rank``/``world`` make the dataset one rank's share, the one ``zarrfs
    warm --rank R --world W`` fills: the contiguous block by default,
    ``shard="interleaved"`` as ``warm --shard interleaved``. Then shuffle
    with an ordinary sampler (``DataLoader(ds, shuffle=True)``), not
    DistributedSampler, which would split the share again. On a
    ``--rank/--world`` mount the directory, and so the dataset, already
    holds the rank's share: leave rank and world out. Safe to use with
    ``DataLoader(num_workers=N)``: it holds paths and small arrays only,
    and each item opens its own file.
    """

    def __init__(self, mount_dir: "Union[str, os.PathLike[str]]", *, transform: Optional[Callable[[np.ndarray], Any]] = None,
                 coords: bool = True, rank: int = 0, world: int = 1, shard: str = "contiguous") -> None:
        self.dir = SampleDir(mount_dir)
        self.rank, self.world, self.shard = rank, world, shard
        self._pos = self.dir.positions(rank, world, shard)
        self.indices = self.dir.indices[self._pos]
        self.transform = transform
        self.with_coords = coords
        c = self.dir.coords() if coords else None
        if c is not None:
            c = c[self._pos]
        self.coords = c
        if c is None:
            self._item_coords = self.indices
        elif np.issubdtype(c.dtype, np.datetime64):
            self._item_coords = c.astype("datetime64[ns]").astype(np.int64)
        elif c.dtype.kind in "biuf":
            self._item_coords = c
        else:
            # Strings or objects do not make tensors; the index does.
            self._item_coords = self.indices

    @property
    def files(self) -> List[str]:
        return [self.dir.file(int(p)) for p in self._pos]

    def __len__(self) -> int:
        return len(self._pos)

    def __getitem__(self, i: int) -> Any:
        d = self.dir
        n = len(self._pos)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} of {n}")
        path = d.file(int(self._pos[i]))
        if self.transform is None:
            x = np.empty(d.sample_shape, dtype=d.dtype)
            if x.nbytes:
                read_into(path, d.data_offset, x)
            t = torch.from_numpy(x)
        else:
            a = np.load(path, mmap_mode="r") if d.sample_nbytes else np.load(path)
            x = self.transform(a)
            if isinstance(x, np.ndarray):
                if not x.flags.writeable or np.may_share_memory(x, a):
                    x = np.array(x)
                t = torch.from_numpy(x)
            else:
                t = x
            del a
        if not self.with_coords:
            return t
        return t, self._item_coords[i]

    def __repr__(self) -> str:
        share = f", rank {self.rank} of {self.world} ({self.shard})" if self.world > 1 else ""
        return f"SampleDataset({self.dir!r}{share}, {len(self)} items)"
