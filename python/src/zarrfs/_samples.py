"""What a zarrfs mount says about itself: sidecars, sample directories, shards.

Everything here reads sidecar JSON only (the daemon holds it in memory), so
it costs no decoding: a sample directory's file names, their global
indices, shapes and dtypes are known without listing or opening a sample.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import numpy.typing  # noqa: F401  (np.typing in annotations)


def read_json(path: str) -> Dict[str, Any]:
    with open(path) as f:
        doc: Dict[str, Any] = json.load(f)
    return doc


SHARD_MODES = ("contiguous", "interleaved")


def check_shard(rank: int, world: int, mode: str = "contiguous") -> None:
    """Raise ValueError unless 0 <= rank < world and mode is a shard mode."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world {world}: want 0 <= rank < world")
    if mode not in SHARD_MODES:
        raise ValueError(f"shard mode {mode!r}: want contiguous or interleaved")


def shard_of(n: int, rank: int, world: int, mode: str = "contiguous") -> Tuple[int, int, int]:
    """(first, step, count): the samples of 0..n-1 that rank reads.

    The same split as ``zarrfs warm --rank/--world`` and ``zarrfs mount
    --rank/--world --shard MODE``: contiguous (the default everywhere) gives
    rank R the block [R*n//W, (R+1)*n//W) (DALI's shard_id/num_shards),
    interleaved gives R, R+W, R+2W, ...
    """
    check_shard(rank, world, mode)
    if world == 1:
        return 0, 1, n
    if mode == "interleaved":
        return rank, world, (n - rank + world - 1) // world if rank < n else 0
    a, b = rank * n // world, (rank + 1) * n // world
    return a, 1, b - a


def sample_width(n: int) -> int:
    """Digits of a sample file name: names are zero-padded to the width of n-1."""
    return len(str(max(n - 1, 0)))


def fill_value(v: Any, dtype: "np.typing.DTypeLike") -> Any:
    """A sidecar fill_value (JSON as Zarr writes it) as a numpy scalar of dtype, or None."""
    if v is None:
        return None
    dtype = np.dtype(dtype)
    if isinstance(v, str):
        special = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
        if v in special:
            v = special[v]
        elif v.startswith("0x"):
            raw = int(v, 16).to_bytes(dtype.itemsize, "big")
            return np.frombuffer(raw, dtype=dtype.newbyteorder(">"))[0].astype(dtype)
    if isinstance(v, list) and dtype.kind == "c":
        v = complex(*v)
    return np.array(v).astype(dtype)[()]


def decode_coord(name: str, values: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """CF-decode a 1-D coordinate (time units) with xarray when it is installed."""
    if not attrs:
        return values
    try:
        import xarray as xr
    except ImportError:
        return values
    v = xr.Variable((name,), values, dict(attrs))
    return np.asarray(xr.conventions.decode_cf_variable(name, v).values)


def read_into(path: str, offset: int, buf: np.ndarray) -> None:
    """Read buf.nbytes bytes at offset of path into buf (C-contiguous)."""
    mv = memoryview(buf.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        done = 0
        while done < len(mv):
            n = os.preadv(fd, [mv[done:]], offset + done)
            if n <= 0:
                raise OSError(f"{path}: file ends after {offset + done} bytes, want {offset + len(mv)}")
            done += n
    finally:
        os.close(fd)


class SampleDir:
    """One sample directory of a mount (an array's ``MOUNT/P/`` or a view's ``MOUNT/V/``).

    ``len(d)`` is the number of files the directory lists (one rank's share
    on a ``--rank/--world`` mount); ``d.names`` their names in order,
    ``d.indices`` their global sample indices, ``d.files`` their paths.
    """

    def __init__(self, path: "Union[str, os.PathLike[str]]") -> None:
        path = os.path.abspath(os.fspath(path)).rstrip("/")
        side = path + ".json"
        if not os.path.isfile(side):
            raise ValueError(f"{path}: no sidecar {os.path.basename(side)} beside it: "
                             "not a sample directory of a zarrfs mount")
        s = read_json(side)
        self.path = path
        self.name = os.path.basename(path)
        self.sidecar = s
        self.kind = s.get("kind")
        self.sample_dim: str = s.get("sample_dim") or ""
        if self.kind == "array":
            if not self.sample_dim:
                raise ValueError(f"{path}: array {s.get('path')!r} has no sample dimension; "
                                 f"it is one file, {self.name}.npy")
            self.axis = list(s["dims"]).index(self.sample_dim)
        elif self.kind == "view":
            self.axis = 0
        else:
            raise ValueError(f"{side}: kind {self.kind!r}: want array or view")
        self.total = int(s["shape"][self.axis])
        self.width = sample_width(self.total)
        sh = s.get("shard")
        if sh:
            self.first, self.step, self.count = int(sh["first"]), int(sh["step"]), int(sh["count"])
            self.rank, self.world, self.mode = int(sh["rank"]), int(sh["world"]), sh["mode"]
        else:
            self.first, self.step, self.count = 0, 1, self.total
            self.rank, self.world, self.mode = 0, 1, "contiguous"
        if self.count != int(s["files"]):
            raise ValueError(f"{side}: lists {s['files']} files but its shard has {self.count}")
        self.sample_shape = tuple(int(x) for x in s["sample_shape"])
        self.dtype = np.dtype(s["dtype"])
        self.data_offset = int(s["data_offset"])

    @property
    def sharded(self) -> bool:
        """Whether the directory lists one rank's samples only (a --rank/--world mount)."""
        return self.sidecar.get("shard") is not None

    @property
    def indices(self) -> np.ndarray:
        return self.first + self.step * np.arange(self.count, dtype=np.int64)

    @property
    def names(self) -> List[str]:
        w = self.width
        return [f"{g:0{w}d}.npy" for g in range(self.first, self.first + self.step * self.count, self.step)]

    @property
    def files(self) -> List[str]:
        return [os.path.join(self.path, n) for n in self.names]

    def positions(self, rank: int = 0, world: int = 1, shard: str = "contiguous") -> np.ndarray:
        """The positions (in this directory's listing) of the files rank reads, in order.

        On a directory that lists every sample, rank R of W gets what
        ``zarrfs warm --rank R --world W --shard SHARD`` fills: the block of
        the contiguous split (the default), or R, R+W, ... when interleaved.
        A per-rank directory (``zarrfs mount --rank/--world``: its sidecar
        has "shard") already lists one rank's files: all of them are read,
        and rank/world must be left at 0/1 or match the mount's.
        """
        check_shard(rank, world, shard)
        if self.sharded:
            if (rank, world) not in ((0, 1), (self.rank, self.world)):
                raise ValueError(f"{self.path} lists the samples of rank {self.rank} of {self.world} "
                                 f"(zarrfs mount --rank/--world); rank={rank}, world={world} asks for another "
                                 "share: leave rank and world out for a per-rank directory")
            return np.arange(self.count, dtype=np.int64)
        first, step, count = shard_of(self.count, rank, world, shard)
        return first + step * np.arange(count, dtype=np.int64)

    def min_share(self, world: int = 1) -> int:
        """The fewest files any rank reads when the samples are split among world ranks
        (the directory's own world on a per-rank directory)."""
        if self.sharded:
            return self.total // self.world
        return self.count // world

    def file(self, i: int) -> str:
        """Path of the i-th listed file (0 <= i < len; negative counts from the end)."""
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError(f"sample {i} of {self.count}")
        return f"{self.path}/{self.first + self.step * i:0{self.width}d}.npy"

    @property
    def sample_nbytes(self) -> int:
        return int(np.prod(self.sample_shape, dtype=np.int64)) * int(self.dtype.itemsize)

    def is_direct(self) -> bool:
        """Whether the mount is in direct mode (sample files are links to cache files)."""
        if self.count == 0:
            return os.path.isdir(os.path.join(self.root(), ".zarrfs"))
        return os.path.islink(self.file(0))

    def root(self) -> str:
        """The mount's top directory (from the store path the sidecar names)."""
        p = self.sidecar.get("path") if self.kind == "array" else self.sidecar.get("name")
        depth = len([x for x in (p or self.name).split("/") if x])
        r = self.path
        for _ in range(depth):
            r = os.path.dirname(r)
        return r

    def coord_array(self) -> Optional[Tuple[np.ndarray, Dict[str, Any]]]:
        """(values of every global sample, attributes) of the sample coordinate, or None.

        A view's come from its sidecar; an array's from the 1-D array named
        like the sample dimension in its group, else at the top of the mount.
        """
        s = self.sidecar
        if self.kind == "view":
            if s.get("sample_coords") is None:
                return None
            return np.asarray(s["sample_coords"]), dict(s.get("sample_coords_attributes") or {})
        for d in (os.path.dirname(self.path), self.root()):
            side = os.path.join(d, self.sample_dim + ".json")
            if not os.path.isfile(side):
                continue
            c = read_json(side)
            if c.get("kind") == "array" and len(c.get("shape", [])) == 1 and c["shape"][0] == self.total:
                return np.load(os.path.join(d, self.sample_dim + ".npy")), dict(c.get("attributes") or {})
        return None

    def coords(self, decode: bool = True) -> Optional[np.ndarray]:
        """The sample coordinate of each listed file (CF-decoded: datetime64 for times), or None."""
        c = self.coord_array()
        if c is None:
            return None
        values, attrs = c
        values = values[self.indices]
        return decode_coord(self.sample_dim, values, attrs) if decode else values

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        shard = f", rank {self.rank} of {self.world} ({self.mode})" if self.sharded else ""
        return (f"SampleDir({self.path!r}: {self.kind}, {self.count} of {self.total} samples{shard}, "
                f"sample {self.sample_shape} {self.dtype.str})")
