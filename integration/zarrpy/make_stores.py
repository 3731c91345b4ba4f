#!/usr/bin/env python3
"""Write small Zarr stores with zarr-python 3 and numcodecs for zarrfs's conformance tests.

Usage: make_stores.py OUTDIR

One store per family (v3 data types, v3 codecs, blosc, sharding, chunk keys, fill values, edge
shapes, consolidated metadata, v2 compressors and layouts, unsupported features). For every array
the directory gets a reference OUTDIR/STORE__PATH.npy holding what zarr-python reads back
(`arr[...]`, converted to little-endian, C order) and an entry in OUTDIR/manifest.json:

  {"store", "path", "ref", "zarr_format", "shape", "chunks" (outer: the shard shape when sharded),
   "inner_chunks" (sharded only), "dtype" (little-endian numpy string), "source_dtype" (numpy string
   with the source byte order, v2 only), "data_type" (v3 name), "dims" ("" where unnamed),
   "fill_value" (as the metadata holds it), "unsupported" (bool), "note"}

Some metadata is edited by hand after zarr-python wrote the array, where zarr-python would not
write it itself (hex fill values, an unknown codec name); the reference is still what zarr-python
reads back after the edit, except for arrays zarr-python itself cannot read (marked unsupported,
no reference). Everything is seeded, so two runs write the same bytes.
"""

import json
import math
import os
import shutil
import sys
import warnings

import numcodecs
import numpy as np
import zarr
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)

warnings.simplefilter("ignore")  # zarr-python warns about v2/numcodecs codecs; they are the point here

RNG = np.random.default_rng(20240611)
MANIFEST = []
OUT = None


# --- data ------------------------------------------------------------------------------------------


def values(shape, dtype):
    """Deterministic values that exercise the whole type: extremes, NaN payloads, -0, subnormals."""
    want = np.dtype(dtype)
    dt = want.newbyteorder("=")
    n = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        v = RNG.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        v = RNG.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        if n >= 4:
            v[:4] = [info.min, info.max, 0, 1 if info.min == 0 else -1]
    else:
        v = (RNG.standard_normal(n) * 100).astype(dt)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(dt).tiny / 4, np.finfo(dt).max],
                            dtype=dt)
        k = min(n, len(specials))
        v[:k] = specials[:k]
        if n > 7:
            # A NaN with a payload other than the default: bit-exact comparison must keep it.
            u = v.view(f"u{dt.itemsize}")
            if dt.itemsize == 2:
                u[7] = 0x7E01
            elif dt.itemsize == 4:
                u[7] = 0x7FC00123
            else:
                u[7] = 0x7FF8000000000ABC
    return v.reshape(shape).astype(want)


def smooth(shape, dtype="float32"):
    """Smooth field (compresses like real data) for the codec families."""
    grids = np.meshgrid(*[np.linspace(0, 3, s) for s in shape], indexing="ij")
    f = sum(np.sin(g * (i + 1)) for i, g in enumerate(grids)) if shape else np.float64(1.25)
    return (np.asarray(f) * 50 + RNG.standard_normal(shape) * 0.1).astype(dtype)


# --- writing and recording -------------------------------------------------------------------------


def le(dt):
    dt = np.dtype(dt)
    return dt.newbyteorder("<") if dt.itemsize > 1 else dt


def meta_path(store, path, fmt):
    d = os.path.join(OUT, store, path)
    return os.path.join(d, "zarr.json") if fmt == 3 else os.path.join(d, ".zarray")


def edit_meta(store, path, fmt, fn):
    p = meta_path(store, path, fmt)
    with open(p) as f:
        m = json.load(f)
    fn(m)
    with open(p, "w") as f:
        json.dump(m, f, indent=2)


def group(store, fmt, sub=""):
    g = zarr.open_group(os.path.join(OUT, store), mode="a", zarr_format=fmt)
    for part in [p for p in sub.split("/") if p]:
        g = g.require_group(part)
    return g


def arr(store, path, data, *, fmt=3, write=None, edit=None, unsupported=False, note="", dims=None,
        **kw):
    """Create STORE/PATH with create_array(**kw), write `data` (all of it, or the region `write`,
    a tuple of slices; None writes nothing), apply `edit` to the metadata, read back, record."""
    parent, _, name = path.rpartition("/")
    g = group(store, fmt, parent)
    if dims is not None:
        if fmt == 3:
            kw["dimension_names"] = dims
        else:
            kw.setdefault("attributes", {})["_ARRAY_DIMENSIONS"] = dims
    kw.setdefault("shape", data.shape)
    kw.setdefault("dtype", data.dtype)
    a = g.create_array(name, **kw)
    if write is not None:
        if write == "all":
            a[...] = data
        else:
            a[write] = data[write]
    if edit is not None:
        edit_meta(store, path, fmt, edit)
    m = json.load(open(meta_path(store, path, fmt)))
    rec = {
        "store": store,
        "path": path,
        "zarr_format": fmt,
        "shape": list(kw["shape"]) if not isinstance(kw["shape"], int) else [kw["shape"]],
        "unsupported": unsupported,
        "note": note,
        "fill_value": m["fill_value"],
    }
    if fmt == 3:
        rec["data_type"] = m["data_type"]
        rec["chunks"] = m["chunk_grid"]["configuration"]["chunk_shape"]
        rec["dims"] = [d or "" for d in (m.get("dimension_names") or [None] * len(rec["shape"]))]
        c0 = m["codecs"][0] if m["codecs"] else {}
        if c0.get("name") == "sharding_indexed":
            rec["inner_chunks"] = c0["configuration"]["chunk_shape"]
    else:
        rec["source_dtype"] = m["dtype"]
        rec["chunks"] = m["chunks"]
        attrs_p = os.path.join(OUT, store, path, ".zattrs")
        attrs = json.load(open(attrs_p)) if os.path.exists(attrs_p) else {}
        rec["dims"] = attrs.get("_ARRAY_DIMENSIONS") or [""] * len(rec["shape"])
    if not unsupported:
        b = zarr.open_array(os.path.join(OUT, store), path=path, mode="r", zarr_format=fmt)
        ref = np.asarray(b[...])  # ascontiguousarray would turn 0-d into 1-d
        ref = np.array(ref, dtype=le(ref.dtype), order="C")
        rec["dtype"] = ref.dtype.str
        rec["ref"] = f"{store}__{path.replace('/', '_')}.npy"
        np.save(os.path.join(OUT, rec["ref"]), ref, allow_pickle=False)
    MANIFEST.append(rec)
    return a


# --- families --------------------------------------------------------------------------------------

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "float32", "float64"]
ALL = ["bool"] + INTS + FLOATS


def v3_dtypes():
    s = "v3_dtypes.zarr"
    for dt in ALL:
        d = values((7, 9), dt)
        arr(s, f"{dt}_le", d, chunks=(3, 4), write="all", dims=["y", "x"])
        if dt not in ("bool", "int8", "uint8"):
            arr(s, f"{dt}_be", d, chunks=(3, 4), write="all", serializer=BytesCodec(endian="big"),
                compressors=None, dims=["y", "x"])
        # Missing chunks: only the top-left corner written.
        arr(s, f"{dt}_partial", d, chunks=(3, 4), write=(slice(0, 4), slice(0, 5)),
            fill_value=True if dt == "bool" else 3)


def v3_codecs():
    s = "v3_codecs.zarr"
    d = smooth((10, 13))
    d3 = smooth((5, 6, 7), "float64")
    cases = {
        "raw": dict(compressors=None),
        "bytes_big": dict(serializer=BytesCodec(endian="big"), compressors=None),
        "gzip1": dict(compressors=GzipCodec(level=1)),
        "gzip9": dict(compressors=GzipCodec(level=9)),
        "zstd0": dict(compressors=ZstdCodec(level=0, checksum=False)),
        "zstd3_checksum": dict(compressors=ZstdCodec(level=3, checksum=True)),
        "zstd19": dict(compressors=ZstdCodec(level=19)),
        "zstd_neg": dict(compressors=ZstdCodec(level=-5)),
        "crc32c_only": dict(compressors=Crc32cCodec()),
        "zstd_crc32c": dict(compressors=[ZstdCodec(level=1), Crc32cCodec()]),
        "transpose": dict(filters=TransposeCodec(order=(1, 0))),
        "transpose_big_gzip_crc": dict(filters=TransposeCodec(order=(1, 0)),
                                       serializer=BytesCodec(endian="big"),
                                       compressors=[GzipCodec(level=5), Crc32cCodec()]),
    }
    for name, kw in cases.items():
        arr(s, name, d, chunks=(4, 5), write="all", dims=["lat", "lon"], **kw)
    arr(s, "transpose3d", d3, chunks=(2, 3, 4), write="all", filters=TransposeCodec(order=(2, 0, 1)),
        compressors=ZstdCodec(level=1))
    arr(s, "transpose3d_big", d3, chunks=(2, 3, 4), write=(slice(0, 3), slice(None), slice(2, 7)),
        filters=TransposeCodec(order=(1, 2, 0)), serializer=BytesCodec(endian="big"),
        compressors=GzipCodec(), fill_value=float("nan"))


def v3_blosc():
    s = "v3_blosc.zarr"
    d = smooth((20, 30))
    for cname in ["blosclz", "lz4", "lz4hc", "zlib", "zstd"]:
        for shuffle in ["noshuffle", "shuffle", "bitshuffle"]:
            arr(s, f"{cname}_{shuffle}", d, chunks=(8, 16), write="all",
                compressors=BloscCodec(cname=cname, clevel=5, shuffle=shuffle))
    # Type sizes: from the data type (1, 2, 8) and explicit ones that differ from it.
    arr(s, "u1_shuffle", values((50, 40), "uint8"), chunks=(16, 16), write="all",
        compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    arr(s, "i2_bitshuffle", (smooth((50, 40)) * 10).astype("int16"), chunks=(16, 16), write="all",
        compressors=BloscCodec(cname="zstd", shuffle="bitshuffle"))
    arr(s, "f8_shuffle", smooth((50, 40), "float64"), chunks=(16, 16), write="all",
        compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    arr(s, "f8_typesize2", smooth((50, 40), "float64"), chunks=(16, 16), write="all",
        compressors=BloscCodec(cname="blosclz", shuffle="shuffle", typesize=2))
    arr(s, "f4_typesize8_bitshuffle", d, chunks=(8, 16), write="all",
        compressors=BloscCodec(cname="lz4", shuffle="bitshuffle", typesize=8))
    arr(s, "f4_blocksize256", smooth((64, 64)), chunks=(32, 32), write="all",
        compressors=BloscCodec(cname="zstd", shuffle="shuffle", blocksize=256))
    arr(s, "f4_clevel0", d, chunks=(8, 16), write="all",
        compressors=BloscCodec(cname="lz4", clevel=0, shuffle="shuffle"))
    arr(s, "f4_random_lz4", values((20, 30), "float32"), chunks=(8, 16), write="all",
        compressors=BloscCodec(cname="lz4", shuffle="shuffle"))


def v3_sharding():
    s = "v3_sharding.zarr"
    d = smooth((19, 23))
    inner = {
        "zstd": [BytesCodec(), ZstdCodec(level=1)],
        "gzip": [BytesCodec(), GzipCodec(level=1)],
        "blosc": [BytesCodec(), BloscCodec(cname="lz4", shuffle="shuffle")],
        "raw": [BytesCodec()],
        "transpose_big_crc": [TransposeCodec(order=(1, 0)), BytesCodec(endian="big"),
                              ZstdCodec(level=2), Crc32cCodec()],
    }
    for loc in ["end", "start"]:
        for name, codecs in inner.items():
            arr(s, f"{name}_{loc}", d, chunks=(8, 10), write="all", compressors=None, dims=["y", "x"],
                serializer=ShardingCodec(chunk_shape=(4, 5), codecs=codecs, index_location=loc))
    arr(s, "index_no_crc", d, chunks=(8, 10), write="all", compressors=None,
        serializer=ShardingCodec(chunk_shape=(4, 5), codecs=[BytesCodec(), ZstdCodec()],
                                 index_codecs=[BytesCodec()]))
    # The shards= shortcut, with missing shards and shards missing some inner chunks.
    arr(s, "shards_partial", d, chunks=(2, 5), shards=(8, 10), fill_value=float("nan"),
        write=(slice(1, 7), slice(3, 12)))
    arr(s, "shards_sparse_int", (d * 10).astype("int32"), chunks=(4, 5), shards=(8, 10),
        fill_value=-7, write=(slice(16, 19), slice(20, 23)))
    d3 = smooth((9, 10, 11), "float32")
    arr(s, "shards3d", d3, chunks=(2, 2, 3), shards=(4, 4, 6), write="all",
        compressors=BloscCodec(cname="zstd", shuffle="bitshuffle"), dims=["time", "lat", "lon"])
    # Nested sharding: zarr-python 3 writes it when handed a ShardingCodec inside a ShardingCodec.
    arr(s, "nested", (d * 100).astype("int16"), chunks=(8, 10), compressors=None, fill_value=-1,
        serializer=ShardingCodec(chunk_shape=(4, 10), index_location="start", codecs=[
            ShardingCodec(chunk_shape=(2, 5), codecs=[BytesCodec(), ZstdCodec(level=1)])]),
        write=(slice(0, 13), slice(None)))
    arr(s, "nested3", smooth((16, 16), "float64"), chunks=(16, 16), compressors=None,
        serializer=ShardingCodec(chunk_shape=(8, 8), codecs=[
            ShardingCodec(chunk_shape=(4, 4), index_location="start", codecs=[
                ShardingCodec(chunk_shape=(2, 2), codecs=[BytesCodec(endian="big"), GzipCodec()])])]),
        write="all")


def v3_keys():
    s = "v3_keys.zarr"
    d = values((6, 7, 5), "int32")
    for name, cke in {
        "default_slash": {"name": "default", "separator": "/"},
        "default_dot": {"name": "default", "separator": "."},
        "v2_dot": {"name": "v2", "separator": "."},
        "v2_slash": {"name": "v2", "separator": "/"},
    }.items():
        arr(s, name, d, chunks=(4, 3, 5), chunk_key_encoding=cke, write="all", fill_value=0)
        arr(s, name + "_partial", d, chunks=(4, 3, 5), chunk_key_encoding=cke, fill_value=-1,
            write=(slice(4, 6), slice(0, 3), slice(None)))


def v3_fill():
    s = "v3_fill.zarr"
    part = (slice(0, 3), slice(0, 4))

    def fill(name, dt, written_fill, meta_fill=None):
        # The data written never equals the fill, so missing chunks really are missing.
        ed = None
        if meta_fill is not None:
            def ed(m, v=meta_fill):
                m["fill_value"] = v
        arr(s, name, values((7, 9), dt), chunks=(3, 4), write=part, fill_value=written_fill, edit=ed)

    for dt in FLOATS:
        fill(f"{dt}_nan", dt, float("nan"))
        fill(f"{dt}_inf", dt, float("inf"))
        fill(f"{dt}_neginf", dt, float("-inf"))
        fill(f"{dt}_number", dt, -1.5)
        fill(f"{dt}_zero", dt, 0.0)
        fill(f"{dt}_negzero", dt, -0.0)
    fill("float32_big", "float32", 1e30)
    # Hex bit patterns (written by hand: zarr-python writes NaN as "NaN").
    fill("float16_hex_nan", "float16", 0.0, "0x7e01")
    fill("float16_hex_one", "float16", 0.0, "0x3c00")
    fill("float32_hex_nan", "float32", 0.0, "0x7fc00001")
    fill("float32_hex_negnan", "float32", 0.0, "0xffc00000")
    fill("float32_hex_one", "float32", 0.0, "0x3f800000")
    fill("float64_hex_nan", "float64", 0.0, "0x7ff8000000000001")
    fill("float64_hex_pi", "float64", 0.0, "0x400921fb54442d18")
    fill("float64_int_literal", "float64", 0.0, 7)
    fill("int8_min", "int8", -128)
    fill("int16_neg", "int16", -32768)
    fill("int32_number", "int32", 123456)
    fill("int64_min", "int64", -(2**63))
    fill("uint8_max", "uint8", 255)
    fill("uint16_number", "uint16", 40000)
    fill("uint32_max", "uint32", 2**32 - 1)
    fill("uint64_max", "uint64", 2**64 - 1)
    fill("bool_true", "bool", True)
    fill("bool_false", "bool", False)
    # Nothing written at all.
    arr(s, "empty_nan", values((5, 5), "float32"), chunks=(2, 2), fill_value=float("nan"), write=None)


def v3_edge():
    s = "v3_edge.zarr"
    arr(s, "scalar", np.array(2.5, dtype="float64"), write="all", note="0-d")
    arr(s, "scalar_missing", np.array(9, dtype="int16"), fill_value=42, write=None, note="0-d, no chunk")
    arr(s, "size1", values((1, 5, 1), "float32"), chunks=(1, 2, 1), write="all", dims=["time", "x", "y"])
    arr(s, "size1_time", values((1, 4, 6), "uint16"), chunks=(1, 4, 6), write="all",
        dims=["time", "lat", "lon"])
    arr(s, "one_element_chunks", values((3, 4), "int64"), chunks=(1, 1), write="all")
    arr(s, "one_element_array", values((1,), "float32"), chunks=(1,), write="all")
    arr(s, "chunk_bigger_than_array", values((5, 3), "int16"), chunks=(10, 10), write="all")
    arr(s, "odd", smooth((13, 17, 11)), chunks=(5, 4, 3), write="all", dims=["time", None, "z"])
    arr(s, "odd_partial", smooth((13, 17, 11)), chunks=(5, 4, 3), write=(slice(2, 9), slice(5, 17), slice(0, 2)),
        fill_value=float("-inf"))
    arr(s, "long1d", values((1001,), "uint32"), chunks=(64,), write="all")
    arr(s, "zero_len", np.zeros((0, 3), "float32"), chunks=(2, 2), write=None, note="size-0 dimension")
    arr(s, "four_d", smooth((3, 2, 5, 7)), chunks=(2, 1, 3, 4), write="all",
        dims=["time", "level", "lat", "lon"])
    arr(s, "group/sub/deep", values((4, 4), "int8"), chunks=(3, 3), write="all", note="nested groups")


def v3_consolidated():
    s = "v3_consolidated.zarr"
    arr(s, "t", smooth((6, 8, 9)), chunks=(1, 8, 9), write="all", dims=["time", "lat", "lon"],
        attributes={"units": "K", "long_name": "temperature"})
    arr(s, "time", np.arange(6, dtype="int64"), chunks=(6,), write="all", dims=["time"])
    arr(s, "sub/u", smooth((6, 8, 9), "float64"), chunks=(2, 4, 4), write="all",
        dims=["time", "lat", "lon"], compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    zarr.consolidate_metadata(os.path.join(OUT, s))


def v2_basic():
    s = "v2_basic.zarr"
    d = smooth((11, 13))
    comps = {
        "blosc_lz4_shuffle": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
        "blosc_zstd_bitshuffle": numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE),
        "blosc_blosclz_noshuffle": numcodecs.Blosc(cname="blosclz", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE),
        "blosc_lz4hc": numcodecs.Blosc(cname="lz4hc", clevel=9, shuffle=numcodecs.Blosc.SHUFFLE),
        "blosc_zlib": numcodecs.Blosc(cname="zlib", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=128),
        "zstd": numcodecs.Zstd(level=3),
        "zstd_checksum": numcodecs.Zstd(level=1, checksum=True),
        "zlib": numcodecs.Zlib(level=5),
        "gzip": numcodecs.GZip(level=6),
        "lz4": numcodecs.LZ4(acceleration=1),
        "none": None,
    }
    for name, comp in comps.items():
        arr(s, name, d, fmt=2, chunks=(4, 5), compressors=comp, write="all", dims=["lat", "lon"])
    for order in ["C", "F"]:
        for sep in [".", "/"]:
            for dt in [">i2", ">u4", ">f4", ">f8", ">i8", "<f2", "<u8"]:
                tag = dt.replace(">", "be_").replace("<", "le_")
                arr(s, f"order{order}_{'dot' if sep == '.' else 'slash'}_{tag}", values((7, 6, 5), dt),
                    fmt=2, chunks=(3, 4, 2), order=order, dtype=dt, write="all",
                    chunk_key_encoding={"name": "v2", "separator": sep},
                    compressors=numcodecs.Zlib(level=1) if order == "F" else numcodecs.Zstd(level=1))
    for dt in ["|b1", "|i1", "|u1"]:
        arr(s, "bytes_" + dt[1:], values((9, 4), dt), fmt=2, chunks=(4, 3), write="all",
            compressors=numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.BITSHUFFLE))
    part = (slice(0, 5), slice(0, 6))
    arr(s, "fill_null_f4", d, fmt=2, chunks=(4, 5), fill_value=None, write=part)
    arr(s, "fill_null_i4", (d * 10).astype("int32"), fmt=2, chunks=(4, 5), fill_value=None, write=part)
    arr(s, "fill_nan", d, fmt=2, chunks=(4, 5), fill_value=float("nan"), write=part)
    arr(s, "fill_inf", d, fmt=2, chunks=(4, 5), fill_value=float("inf"), write=part)
    arr(s, "fill_neginf_be", d, fmt=2, chunks=(4, 5), dtype=">f8", fill_value=float("-inf"), write=part)
    arr(s, "fill_number", d, fmt=2, chunks=(4, 5), fill_value=-9.5, write=part)
    arr(s, "fill_int", (d * 10).astype(">i2"), fmt=2, chunks=(4, 5), fill_value=-32768, write=part)
    arr(s, "fill_u8_max", values((11, 13), "uint64"), fmt=2, chunks=(4, 5), fill_value=2**64 - 1, write=part)
    arr(s, "fill_bool", values((11, 13), "bool"), fmt=2, chunks=(4, 5), fill_value=True, write=part)
    arr(s, "F_partial", d, fmt=2, chunks=(4, 5), order="F", fill_value=1.0, write=(slice(3, 11), slice(6, 8)))
    arr(s, "scalar", np.array(-3, dtype="<i4"), fmt=2, write="all", note="0-d")
    arr(s, "sub/inner", values((5, 5), "<i8"), fmt=2, chunks=(2, 2), write="all", dims=["a", "b"])


def v2_consolidated():
    s = "v2_consolidated.zarr"
    arr(s, "t2m", smooth((5, 7, 9)), fmt=2, chunks=(1, 7, 9), write="all", dims=["time", "lat", "lon"],
        fill_value=float("nan"), compressors=numcodecs.Blosc(cname="lz4", shuffle=1),
        attributes={"units": "K"})
    arr(s, "time", np.arange(5, dtype="<i8"), fmt=2, chunks=(5,), write="all", dims=["time"])
    arr(s, "lat", np.linspace(-90, 90, 7).astype("<f4"), fmt=2, chunks=(7,), write="all", dims=["lat"])
    arr(s, "grp/tp", smooth((5, 7, 9), ">f8"), fmt=2, chunks=(2, 7, 9), write=(slice(0, 3),),
        chunk_key_encoding={"name": "v2", "separator": "/"}, dims=["time", "lat", "lon"],
        compressors=numcodecs.Zstd(level=2))
    zarr.consolidate_metadata(os.path.join(OUT, s), zarr_format=2)


def unsupported():
    # Readable arrays sit beside unreadable ones: zarrfs must report the latter with a reason and
    # still read the former.
    s = "v3_mixed.zarr"
    d = smooth((6, 8))
    arr(s, "ok", d, chunks=(3, 4), write="all", dims=["y", "x"])

    def bitround(m):
        m["codecs"].insert(0, {"name": "bitround", "configuration": {"keepbits": 10}})
    arr(s, "bitround", d, chunks=(3, 4), write="all", edit=bitround, unsupported=True,
        note="codec name 'bitround' edited into the metadata")
    arr(s, "numcodecs_delta", d, chunks=(3, 4), write="all", unsupported=True,
        filters=[zarr.codecs.numcodecs.Delta(dtype="<f4")], note="numcodecs.delta filter")
    arr(s, "strings", np.array(["a", "bb", "ccc", ""]), chunks=(2,), dtype=str, write="all",
        unsupported=True, note="ragged string data type")
    arr(s, "ok_after", d, chunks=(4, 4), write="all")

    s = "v2_mixed.zarr"
    arr(s, "ok", d, fmt=2, chunks=(3, 4), write="all", dims=["y", "x"])
    arr(s, "delta", d, fmt=2, chunks=(3, 4), write="all", filters=[numcodecs.Delta(dtype="<f4")],
        unsupported=True, note="v2 delta filter")
    arr(s, "bz2", d, fmt=2, chunks=(3, 4), write="all", compressors=numcodecs.BZ2(), unsupported=True,
        note="v2 bz2 compressor")


FAMILIES = [v3_dtypes, v3_codecs, v3_blosc, v3_sharding, v3_keys, v3_fill, v3_edge, v3_consolidated,
            v2_basic, v2_consolidated, unsupported]


def main():
    global OUT
    if len(sys.argv) != 2:
        sys.exit("usage: make_stores.py OUTDIR")
    OUT = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    for e in os.listdir(OUT):
        p = os.path.join(OUT, e)
        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    for fam in FAMILIES:
        fam()
    man = {
        "writer": {"zarr": zarr.__version__, "numcodecs": numcodecs.__version__, "numpy": np.__version__},
        "arrays": MANIFEST,
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1, allow_nan=False)
    print(f"wrote {len(MANIFEST)} arrays in {len({r['store'] for r in MANIFEST})} stores to {OUT}")


if __name__ == "__main__":
    main()
