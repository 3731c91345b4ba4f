"""xarray backend: ``xr.open_dataset(MOUNT, engine="zarrfs")``.

Dimensions, coordinates and attributes come from the mount's sidecars (and
the small coordinate arrays), on the CPU. Data stays lazy: a
:class:`SampleArray` reads only the sample files an indexing touches (a
large file it takes only part of is memory-mapped, so only the pages it
touches are read), so opening a 100,000-sample view reads no sample file.
With ``device="cuda"`` data variables come back as CuPy arrays read with
kvikio (cuFile), while coordinates stay NumPy.

What can be opened:

- ``MOUNT`` (or ``MOUNT, group="sub"``, or ``MOUNT/sub``): every array of that
  group, as ``xr.open_zarr(SOURCE, group=...)`` shows it. Views are left out:
  their sample dimension is a selection of the store's.
- ``MOUNT/VIEW``: the view as one variable named after it, dims
  ``(sample_dim, "channel", *spatial)``; ``channel`` is labelled
  ``"var"`` or ``"var:dim=value"``, with the coordinates ``var`` and one per
  selected dimension along it.
- ``MOUNT/P`` (an array's sample directory) or ``MOUNT/P.npy``: that array
  and the coordinates of its dimensions.

On a ``--rank/--world`` mount every sample dimension holds the rank's share
only, and the coordinates along it are cut to match.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Tuple, Union

import numpy as np
import numpy.typing  # noqa: F401  (np.typing in annotations)
import xarray
from xarray import Variable
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.backends.common import AbstractDataStore
from xarray.backends.store import StoreBackendEntrypoint
from xarray.core import indexing

from ._samples import SampleDir, fill_value, read_into, read_json, shard_of

__all__ = ["ZarrfsBackendEntrypoint", "ZarrfsStore", "SampleArray", "FileArray"]

# The oldest xarray the backend runs on (LazilyIndexedArray.get_duck_array
# came in 2023.4; 2023.3 fails), the floor pyproject.toml declares.
MIN_XARRAY = (2023, 4)


def _version(v: str) -> Tuple[int, ...]:
    parts = []
    for p in v.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version(xarray.__version__) < MIN_XARRAY:
    raise ImportError(f"zarrfs's xarray backend needs xarray>={MIN_XARRAY[0]}.{MIN_XARRAY[1]}, "
                      f"found {xarray.__version__} (pip install -U xarray)")

# An outer-indexing key: per axis an int, a slice or a 1-D integer array.
Key = Tuple[Union[int, slice, np.ndarray], ...]
# (sample_dim, rank, world, mode) of a --rank/--world mount.
Shard = Tuple[str, int, int, str]
Sidecar = Dict[str, Any]


def _outer_index(a: Any, key: Key, xp: Any = np) -> Any:
    """Outer indexing: key holds one int, slice or 1-D integer array per axis."""
    basic = tuple(slice(None) if isinstance(k, np.ndarray) else k for k in key)
    out = a[basic]
    ax = 0
    for k in key:
        if isinstance(k, (int, np.integer)):
            continue
        if isinstance(k, np.ndarray):
            out = xp.take(out, xp.asarray(k) if xp is not np else k, axis=ax)
        ax += 1
    return out


# The unlisted file of every group directory that holds the group's
# attributes (layout.GroupAttrsName).
GROUP_ATTRS = ".zattrs"

# Samples up to this size are read whole and indexed in memory; larger ones
# are memory-mapped when an indexing takes only part of them, so that only
# the pages it touches are read.
SMALL_SAMPLE = 1 << 20

# Sample files read at once by one indexing that takes many (open_dataset's
# threads= changes it).
DEFAULT_THREADS = min(8, 2 * (os.cpu_count() or 1))


def _whole(key: Key, shape: Tuple[int, ...]) -> bool:
    return all(isinstance(k, slice) and k.indices(n) == (0, n, 1) for k, n in zip(key, shape))


class _Reader:
    """Reads one .npy file of the mount.

    On the CPU a file the indexing takes whole is read straight into its
    place in the result (one open and one read: a memory map costs more
    than a small sample), a small one is read whole and indexed, and a large
    one partly indexed is memory-mapped. On the GPU the file is read into
    device memory with kvikio (cuFile).
    """

    def __init__(self, shape: Iterable[int], dtype: "np.typing.DTypeLike", data_offset: int, device: str) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.data_offset = data_offset
        self.device = device
        self.xp = np
        if device == "cuda":
            import cupy
            import kvikio  # noqa: F401  (fail at open, not at the first read)

            self.xp = cupy

    def read(self, path: str, key: Key, out: Any = None) -> Any:
        """The file's array indexed with key (outer indexing); into out when given and key is whole."""
        if self.device == "cuda":
            return self._read_cuda(path, key, out)
        whole = _whole(key, self.shape)
        if whole or self.nbytes <= SMALL_SAMPLE:
            buf = out if (whole and out is not None) else np.empty(self.shape, dtype=self.dtype)
            if self.nbytes:
                read_into(path, self.data_offset, buf)
            return buf if whole else _outer_index(buf, key)
        a = np.load(path, mmap_mode="r")
        try:
            return np.array(_outer_index(a, key))
        finally:
            del a

    def _read_cuda(self, path: str, key: Key, out: Any = None) -> Any:
        import cupy
        import kvikio

        whole = _whole(key, self.shape)
        buf = out if (whole and out is not None) else cupy.empty(self.shape, dtype=self.dtype)
        if self.nbytes:
            # In direct mode the realpath is the cache's file, which cuFile can
            # register (resolving the link fills it); a FUSE file is read with
            # kvikio's POSIX fallback.
            with kvikio.CuFile(os.path.realpath(path), "r") as f:
                n = f.read(buf, file_offset=self.data_offset)
            if n != self.nbytes:
                raise OSError(f"{path}: read {n} of {self.nbytes} bytes")
        return buf if whole else _outer_index(buf, key, cupy)


class SampleArray(BackendArray):
    """A variable stored as one file per index along its sample axis; file(i) names the i-th."""

    def __init__(self, file: Callable[[int], str], shape: Iterable[int], dtype: "np.typing.DTypeLike", axis: int,
                 data_offset: int, device: str = "cpu", threads: int = 1) -> None:
        # A function, not a list: 100,000 paths cost more than opening the dataset.
        self.file = file
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.axis = axis
        if threads < 1:
            raise ValueError(f"threads {threads}: want 1 or more")
        self.threads = threads
        self._r = _Reader(self.shape[:axis] + self.shape[axis + 1:], dtype, data_offset, device)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> Any:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER, self._getitem)

    def _getitem(self, key: Key) -> Any:
        a = self.axis
        k = key[a]
        rest = key[:a] + key[a + 1:]
        if isinstance(k, (int, np.integer)):
            return self._r.read(self.file(int(k)), rest)
        picks = np.arange(self.shape[a])[k]
        xp = self._r.xp
        out_axis = sum(1 for x in key[:a] if not isinstance(x, (int, np.integer)))
        # The shape of one sample after indexing: shape of rest applied to a sample.
        sub = tuple(len(range(*x.indices(n))) if isinstance(x, slice) else len(x)
                    for x, n in zip(rest, self._r.shape) if not isinstance(x, (int, np.integer)))
        out = xp.empty((len(picks),) + sub, dtype=self.dtype)
        whole = _whole(rest, self._r.shape)

        def one(j: int) -> None:
            path = self.file(int(picks[j]))
            if whole:
                self._r.read(path, rest, out=out[j])
            else:
                out[j] = self._r.read(path, rest)

        n = min(self.threads, len(picks)) if xp is np else 1
        if n > 1:
            # Each read waits on the mount (an open, and a fill the first
            # time): several in flight keep the daemon's cores busy.
            with ThreadPoolExecutor(n, thread_name_prefix="zarrfs-read") as pool:
                for _ in pool.map(one, range(len(picks))):
                    pass
        else:
            for j in range(len(picks)):
                one(j)
        return xp.moveaxis(out, 0, out_axis) if out_axis else out


class FileArray(BackendArray):
    """A variable stored whole in one file; take, if set, picks indices along one axis (a rank's share)."""

    def __init__(self, path: str, shape: Iterable[int], dtype: "np.typing.DTypeLike", data_offset: int, device: str = "cpu",
                 take: Optional[Tuple[int, np.ndarray]] = None) -> None:
        self.path = path
        self.file_shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.take = take
        shape = list(self.file_shape)
        if take is not None:
            shape[take[0]] = len(take[1])
        self.shape = tuple(shape)
        self._r = _Reader(self.file_shape, dtype, data_offset, device)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> Any:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER, self._getitem)

    def _getitem(self, key: Key) -> Any:
        if self.take is not None:
            ax, idx = self.take
            k = key[ax]
            g = idx[k]
            key = key[:ax] + (int(g) if np.ndim(g) == 0 else np.asarray(g),) + key[ax + 1:]
        return self._r.read(self.path, key)


def _dims(side: Sidecar, name: str) -> Tuple[str, ...]:
    return tuple(d if d is not None else f"{name}_dim_{i}" for i, d in enumerate(side["dims"]))


class ZarrfsStore(AbstractDataStore):
    """The variables of one group, view or array of a zarrfs mount (see the module doc)."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], group: Optional[str] = None, device: str = "cpu",
                 use_zarr_fill_value_as_mask: Optional[bool] = None, threads: Optional[int] = None) -> None:
        path = os.path.abspath(os.fspath(path)).rstrip("/")
        if group:
            path = os.path.join(path, group.strip("/"))
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r}: want 'cpu' or 'cuda'")
        self.path = path
        self.device = device
        self.mask_fill = use_zarr_fill_value_as_mask
        if threads is not None and threads < 1:
            raise ValueError(f"threads={threads}: want 1 or more (or None: {DEFAULT_THREADS})")
        self.threads = threads if threads is not None else DEFAULT_THREADS
        self._lock = threading.Lock()
        self._vars: Optional[Dict[str, Variable]] = None

    # -- what the path is --------------------------------------------------

    def _target(self) -> Tuple[str, str]:
        p = self.path
        if p.endswith(".npy") and os.path.isfile(p[:-4] + ".json"):
            return "file", p[:-4]
        if os.path.isfile(p + ".json"):
            side = read_json(p + ".json")
            if side.get("kind") == "view":
                return "view", p
            if side.get("kind") == "array":
                return ("samples" if side.get("sample_dim") else "file"), p
        if os.path.isdir(p):
            return "group", p
        raise FileNotFoundError(f"{self.path}: not a directory or sample file of a zarrfs mount")

    def _sidecars(self, d: str) -> Dict[str, Sidecar]:
        """The array sidecars directly in group directory d, by name."""
        out = {}
        for e in sorted(os.listdir(d)):
            if not e.endswith(".json"):
                continue
            side = read_json(os.path.join(d, e))
            if side.get("kind") == "array":
                out[e[:-5]] = side
        return out

    def _shard(self, sides: Iterable[Sidecar]) -> Optional[Shard]:
        """(sample_dim, rank, world, mode) of a --rank/--world mount, from any sidecar."""
        for s in sides:
            sh = s.get("shard")
            if sh:
                return s["sample_dim"], int(sh["rank"]), int(sh["world"]), sh["mode"]
        return None

    # -- variables -----------------------------------------------------------

    def _attrs_encoding(self, side: Sidecar, dims: Tuple[str, ...], path: str,
                        sample_axis: Optional[int]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        attrs = dict(side.get("attributes") or {})
        enc: Dict[str, Any] = {"source": path}
        if sample_axis is not None:
            enc["preferred_chunks"] = {d: (1 if i == sample_axis else n)
                                       for i, (d, n) in enumerate(zip(dims, side["shape"]))}
        fv = fill_value(side.get("fill_value"), side["dtype"])
        if fv is not None and side.get("kind") == "array":
            # As xarray's zarr backend: Zarr v2's fill_value masks missing
            # values (CF _FillValue), v3's does not unless asked.
            as_mask = self.mask_fill
            if as_mask is None:
                as_mask = side.get("zarr_format") != 3
            if as_mask:
                attrs["_FillValue"] = fv
            else:
                enc["fill_value"] = fv
        return attrs, enc

    def _array_variable(self, d: str, name: str, side: Sidecar, shard: Optional[Shard], device: str) -> Variable:
        dims = _dims(side, name)
        data: Union[SampleArray, FileArray]
        if side.get("sample_dim"):
            sd = SampleDir(os.path.join(d, name))
            shape = list(side["shape"])
            shape[sd.axis] = len(sd)
            data = SampleArray(sd.file, shape, side["dtype"], sd.axis, sd.data_offset, device, self.threads)
            attrs, enc = self._attrs_encoding(side, dims, sd.path, sd.axis)
        else:
            take = None
            if shard is not None and shard[0] in dims:
                ax = dims.index(shard[0])
                first, step, count = shard_of(side["shape"][ax], *shard[1:])
                take = (ax, first + step * np.arange(count, dtype=np.int64))
            p = os.path.join(d, name + ".npy")
            data = FileArray(p, side["shape"], side["dtype"], int(side["data_offset"]), device, take)
            attrs, enc = self._attrs_encoding(side, dims, p, None)
        return Variable(dims, indexing.LazilyIndexedArray(data), attrs, enc)

    def _coordinate(self, d: str, name: str, side: Sidecar, shard: Optional[Shard]) -> Variable:
        """A 1-D coordinate, read now (xarray indexes it anyway), as NumPy."""
        v = self._array_variable(d, name, side, shard, "cpu")
        return Variable(v.dims, np.asarray(v._data.get_duck_array()), v.attrs, v.encoding)  # type: ignore[union-attr]

    @staticmethod
    def _is_coord(name: str, side: Sidecar) -> bool:
        return side.get("dims") == [name] and not side.get("sample_dim")

    def _group_variables(self, d: str) -> Dict[str, Variable]:
        sides = self._sidecars(d)
        shard = self._shard(sides.values())
        coord_names = set()
        for s in sides.values():
            coord_names.update(str(s.get("attributes", {}).get("coordinates", "")).split())
        out = {}
        for name, side in sides.items():
            if self._is_coord(name, side):
                out[name] = self._coordinate(d, name, side, shard)
            else:
                dev = "cpu" if name in coord_names else self.device
                out[name] = self._array_variable(d, name, side, shard, dev)
        return out

    def _one_array(self, p: str) -> Dict[str, Variable]:
        d, name = os.path.dirname(p), os.path.basename(p)
        side = read_json(p + ".json")
        sides = self._sidecars(d)
        shard = self._shard([side] + list(sides.values()))
        out = {name: self._array_variable(d, name, side, shard, self.device)}
        wanted = set(_dims(side, name)) | set(str(side.get("attributes", {}).get("coordinates", "")).split())
        for c in sorted(wanted - {name}):
            cs = sides.get(c)
            if cs is None:
                continue
            if self._is_coord(c, cs):
                out[c] = self._coordinate(d, c, cs, shard)
            else:
                out[c] = self._array_variable(d, c, cs, shard, "cpu")
        return out

    def _view(self, p: str) -> Dict[str, Variable]:
        sd = SampleDir(p)
        side = sd.sidecar
        name = sd.name
        dims = _dims(side, name)
        shape = list(side["shape"])
        shape[0] = len(sd)
        data = SampleArray(sd.file, shape, side["dtype"], 0, sd.data_offset, self.device, self.threads)
        attrs, enc = self._attrs_encoding(side, dims, p, 0)
        out = {name: Variable(dims, indexing.LazilyIndexedArray(data), attrs, enc)}
        # The sample coordinate, cut to the listed samples.
        if side.get("sample_coords") is not None:
            vals = np.asarray(side["sample_coords"])[sd.indices]
            out[dims[0]] = Variable((dims[0],), vals, dict(side.get("sample_coords_attributes") or {}))
        # Channels: labels, the variable of each, and each selected dim's value.
        chans = side.get("channels") or []
        labels: List[str] = []
        varnames: List[str] = []
        selected: Dict[str, None] = {}
        for ch in chans:
            sel = ch.get("select") or {}
            parts = []
            for dim, s in sel.items():
                v = s.get("value")
                parts.append(f"{dim}={v if v is not None else '#' + str(s['index'])}")
            labels.append(ch["var"] + (":" + ",".join(parts) if parts else ""))
            varnames.append(ch["var"])
            for dim in sel:
                selected.setdefault(dim, None)
        cdim = dims[1]
        out[cdim] = Variable((cdim,), np.array(labels, dtype=object))
        out["var"] = Variable((cdim,), np.array(varnames, dtype=object))
        # Named in the CF "coordinates" attribute, so decoding makes them coordinates.
        out[name].attrs["coordinates"] = " ".join(["var"] + list(selected))
        for dim in selected:
            vals = [((ch.get("select") or {}).get(dim) or {}).get("value") for ch in chans]
            if all(v is None or isinstance(v, (int, float)) for v in vals):
                arr = np.array([np.nan if v is None else v for v in vals], dtype=float)
                if all(v is not None and float(v).is_integer() for v in vals):
                    arr = arr.astype(np.int64)
            else:
                arr = np.array(["" if v is None else str(v) for v in vals], dtype=object)
            out[dim] = Variable((cdim,), arr)
        # Spatial coordinates: 1-D arrays named like the dims at the top of the mount.
        root = sd.root()
        for dim in dims[2:]:
            side_path = os.path.join(root, dim + ".json")
            if dim in out or not os.path.isfile(side_path):
                continue
            cs = read_json(side_path)
            if cs.get("kind") == "array" and self._is_coord(dim, cs):
                out[dim] = self._coordinate(root, dim, cs, None)
        return out

    def get_variables(self) -> Dict[str, Variable]:
        with self._lock:
            if self._vars is None:
                kind, p = self._target()
                if kind == "group":
                    self._vars = self._group_variables(p)
                elif kind == "view":
                    self._vars = self._view(p)
                else:
                    self._vars = self._one_array(p)
            return self._vars

    def get_attrs(self) -> Dict[str, Any]:
        # A group's own attributes are in its unlisted .zattrs; a view or a
        # single array opened alone has no group, as in xr.open_zarr.
        kind, p = self._target()
        if kind != "group":
            return {}
        try:
            return dict(read_json(os.path.join(p, GROUP_ATTRS)))
        except FileNotFoundError:  # a mount of a zarrfs that did not serve them
            return {}

    def get_dimensions(self) -> Dict[Hashable, int]:
        dims: Dict[Hashable, int] = {}
        for v in self.get_variables().values():
            dims.update(zip(v.dims, v.shape))
        return dims

    def get_encoding(self) -> Dict[str, Any]:
        return {"source": self.path}

    def close(self) -> None:
        pass


class ZarrfsBackendEntrypoint(BackendEntrypoint):
    """``xr.open_dataset(MOUNT, engine="zarrfs")``: a zarrfs mount, its groups, views and arrays."""

    description = "Open a zarrfs mount (dims, coordinates and attributes from its sidecars; data read per sample file)"
    open_dataset_parameters = (
        "filename_or_obj", "mask_and_scale", "decode_times", "concat_characters", "decode_coords",
        "drop_variables", "use_cftime", "decode_timedelta", "group", "device", "use_zarr_fill_value_as_mask",
        "threads",
    )

    def open_dataset(
            self, filename_or_obj: Any, *, mask_and_scale: Optional[bool] = None, decode_times: Any = True,
            concat_characters: Any = True, decode_coords: Any = True, drop_variables: Any = None,
            use_cftime: Optional[bool] = None, decode_timedelta: Any = None, group: Optional[str] = None,
            device: str = "cpu", use_zarr_fill_value_as_mask: Optional[bool] = None,
            threads: Optional[int] = None) -> "xarray.Dataset":
        if mask_and_scale is None:
            # CF masking and scaling run NumPy code on the data; with CuPy
            # data they are left to the caller.
            mask_and_scale = device != "cuda"
        store = ZarrfsStore(filename_or_obj, group=group, device=device,
                            use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask, threads=threads)
        return StoreBackendEntrypoint().open_dataset(
            store, mask_and_scale=mask_and_scale, decode_times=decode_times, concat_characters=concat_characters,
            decode_coords=decode_coords, drop_variables=drop_variables, use_cftime=use_cftime,
            decode_timedelta=decode_timedelta)

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        try:
            p = os.path.abspath(os.fspath(filename_or_obj)).rstrip("/")
        except TypeError:
            return False
        if p.endswith(".npy") and os.path.isfile(p[:-4] + ".json"):
            return True
        if os.path.isfile(p + ".json") and os.path.isdir(p):
            return True
        from ._mount import mount_source

        return (mount_source(p) or "").startswith("fuse.zarrfs")
