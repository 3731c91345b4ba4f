"""PyTorch over a zarrfs sample directory: a map-style Dataset, and Loader,
which reads batches straight into GPU memory."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

try:
    import torch
    from torch.utils.data import Dataset as _Base
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("zarrfs.torch needs PyTorch (pip install torch)") from e

from ._samples import SampleDir, read_into
from .loader import Loader

__all__ = ["Loader", "SampleDataset"]


class SampleDataset(_Base):
    """The samples of ``MOUNT/ARRAY`` or ``MOUNT/VIEW``, one item per listed file.

    ``ds[i]`` is ``(sample, coord)``: the sample as a tensor of the sidecar's
    ``sample_shape`` and dtype, and the sample coordinate of that file (a
    time step as int64 nanoseconds since 1970, ``numpy.datetime64(coord,
    "ns")`` gives it back; without a coordinate array, the global sample
    index). With ``coords=False`` items are the samples alone.

    Without a transform, a sample is read with one read at the sidecar's
    ``data_offset`` straight into the tensor's memory (faster than a memory
    map followed by a copy). ``transform`` gets the sample memory-mapped
    (``numpy.load(..., mmap_mode="r")``), so a crop reads only the pages it
    touches; what it returns becomes the tensor (copied if it is a view of
    the read-only map).

    ``ds.coords`` holds every item's coordinate, CF-decoded (datetime64 for
    times), ``ds.indices`` the global sample indices, ``ds.files`` the paths.
    On a ``--rank/--world`` mount the directory, and so the dataset, holds
    the rank's share. Safe to use with ``DataLoader(num_workers=N)``: it
    holds paths and small arrays only, and each item opens its own file.
    """

    def __init__(self, mount_dir, *, transform: Optional[Callable] = None, coords: bool = True):
        self.dir = SampleDir(mount_dir)
        self.indices = self.dir.indices
        self.transform = transform
        self.with_coords = coords
        c = self.dir.coords() if coords else None
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
    def files(self) -> list:
        return self.dir.files

    def __len__(self) -> int:
        return len(self.dir)

    def __getitem__(self, i: int):
        d = self.dir
        if i < 0:
            i += len(d)
        path = d.file(i)
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
        return f"SampleDataset({self.dir!r})"
