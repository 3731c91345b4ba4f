#!/usr/bin/env python3
"""Write the decompression test vectors of package codec.

Every vector is a chunk compressed by numcodecs (the library zarr-python uses,
so an independent writer of the same bytes a real store holds) together with
the bytes it must decode to. Run from this folder:

    python3 make_vectors.py

It rewrites vectors/: index.json, one <name>.bin per compressed vector and one
raw/<data>.raw per distinct decoded buffer (shared by the vectors that
compress it). The data are seeded, so a rerun with the same numcodecs writes
the same files. Keep the total well under 1 MB: vectors are small on purpose,
large enough only to force multiple blosc blocks, split streams, a partial last
block, raw (incompressible) streams and memcpyed frames.

index.json is {"numcodecs": VERSION, "blosc": VERSION, "vectors": [{"name",
"codec" (zstd|gzip|zlib|lz4|blosc), "src" (file under vectors/), "raw" (file
under vectors/raw/), "params" {...}, "flags" (blosc header flags byte)}]}.
"""

import json
import os
import shutil
import sys

import numpy as np
import numcodecs
import numcodecs.blosc as blosc
from numcodecs import GZip, LZ4, Zlib, Zstd

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "vectors")


def smooth(n, typesize, seed):
    """A smooth field with a little noise, like real array data."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 6 * np.pi, n)
    if typesize == 1:
        words = [b"zarr ", b"chunk ", b"blosc ", b"shuffle ", b"\x00\x01\x02 "]
        out = bytearray()
        while len(out) < n:
            out += words[rng.integers(len(words))]
        return bytes(out[:n])
    if typesize == 2:
        v = np.cumsum(rng.integers(-3, 4, n)).astype("<i2")
        return v.tobytes()
    if typesize == 4:
        v = (280 + 20 * np.sin(t) + rng.normal(0, 0.05, n)).astype("<f4")
        return v.tobytes()
    v = (np.cos(t) * 1e3 + np.round(rng.normal(0, 1, n), 2)).astype("<f8")
    return v.tobytes()


def random_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def mixed(n, typesize, seed):
    """Half smooth, half random: some blocks or streams compress, others are
    stored raw."""
    a = smooth(n // 2, typesize, seed)
    b = random_bytes(n * typesize - len(a), seed + 1)
    return a + b


raws = {}  # name -> bytes
vectors = []


def add_raw(name, data):
    if name in raws:
        assert raws[name] == data, name
    raws[name] = data
    return name + ".raw"


def add(name, codec, data_name, data, encoded, params):
    rawfile = add_raw(data_name, data)
    fname = name + ".bin"
    with open(os.path.join(OUT, fname), "wb") as f:
        f.write(encoded)
    v = {"name": name, "codec": codec, "src": fname, "raw": rawfile, "params": params}
    if codec == "blosc":
        v["flags"] = encoded[2]
    vectors.append(v)


def bcompress(data, cname, clevel, shuffle, blocksize, typesize, splitmode):
    # BLOSC_SPLITMODE is read on every blosc_compress call (the global-context
    # path that use_threads selects) and sticks in the library, so set it each
    # time.
    os.environ["BLOSC_SPLITMODE"] = splitmode
    blosc.use_threads = True
    enc = blosc.compress(data, cname.encode(), clevel, shuffle, blocksize, typesize=typesize)
    # numcodecs refuses to decompress an empty frame; c-blosc itself returns 0.
    assert not data or blosc.decompress(enc) == data
    return enc


SHUF = {"noshuffle": blosc.NOSHUFFLE, "shuffle": blosc.SHUFFLE, "bitshuffle": blosc.BITSHUFFLE}


def blosc_vectors():
    cnames = ["blosclz", "lz4", "lz4hc", "zlib", "zstd"]
    for ts in (1, 2, 4, 8):
        # (variant, data name, data, blocksize, clevel, splitmode)
        # Element counts are primes, so never a multiple of 8 elements.
        n = {1: 2053, 2: 1021, 4: 509, 8: 251}[ts]
        m = {1: 3079, 2: 1543, 4: 769, 8: 389}[ts]
        variants = [
            ("auto", f"smooth{ts}_{n}", smooth(n, ts, 10 + ts), 0, 5, "FORWARD_COMPAT"),
            # Forced small blocks: three full blocks and a partial last one.
            ("b1024", f"smooth{ts}_{m}", smooth(m, ts, 20 + ts), 1024, 5, "FORWARD_COMPAT"),
            ("mixed", f"mixed{ts}_{n}", mixed(n, ts, 30 + ts), 1024, 9, "FORWARD_COMPAT"),
        ]
        for cname in cnames:
            for shuf in ("noshuffle", "shuffle", "bitshuffle"):
                for var, dname, data, bs, clevel, split in variants:
                    name = f"blosc_{cname}_{shuf}_t{ts}_{var}"
                    enc = bcompress(data, cname, clevel, SHUF[shuf], bs, ts, split)
                    add(name, "blosc", dname, data, enc,
                        {"cname": cname, "shuffle": shuf, "typesize": ts, "blocksize": bs,
                         "clevel": clevel, "splitmode": split})
    # Split-mode overrides: zstd split into typesize streams, lz4 never split.
    for cname, split in (("zstd", "ALWAYS"), ("lz4", "NEVER"), ("blosclz", "NEVER"), ("zlib", "ALWAYS")):
        for shuf in ("shuffle", "bitshuffle"):
            ts = 4
            data = smooth(2042, ts, 24)
            name = f"blosc_{cname}_{shuf}_t{ts}_split{split.lower()}"
            enc = bcompress(data, cname, 5, SHUF[shuf], 2048, ts, split)
            add(name, "blosc", f"smooth{ts}_2042", data, enc,
                {"cname": cname, "shuffle": shuf, "typesize": ts, "blocksize": 2048, "clevel": 5,
                 "splitmode": split})
    # Incompressible data: memcpyed frames; clevel 0 is always memcpyed.
    rnd = random_bytes(1500, 99)
    for cname in ("lz4", "zstd", "blosclz"):
        for clevel in (0, 5):
            name = f"blosc_{cname}_random_c{clevel}"
            enc = bcompress(rnd, cname, clevel, blosc.SHUFFLE, 0, 4, "FORWARD_COMPAT")
            add(name, "blosc", "random_1500", rnd, enc,
                {"cname": cname, "shuffle": "shuffle", "typesize": 4, "clevel": clevel})
    # Sizes that are not a multiple of the typesize (leftover bytes) and odd
    # typesizes.
    for ts, nbytes in ((4, 2051), (8, 4099), (3, 1501), (16, 2052), (24, 2401)):
        data = smooth(nbytes, 1, 40 + ts)
        for cname in ("lz4", "blosclz", "zstd"):
            for shuf in ("shuffle", "bitshuffle"):
                name = f"blosc_{cname}_{shuf}_t{ts}_n{nbytes}"
                enc = bcompress(data, cname, 5, SHUF[shuf], 1024, ts, "FORWARD_COMPAT")
                add(name, "blosc", f"text_{nbytes}_{ts}", data, enc,
                    {"cname": cname, "shuffle": shuf, "typesize": ts, "blocksize": 1024, "clevel": 5})
    # Tiny and empty buffers.
    for nbytes in (0, 1, 7, 100):
        data = smooth(nbytes, 1, 50)
        name = f"blosc_lz4_shuffle_t4_tiny{nbytes}"
        enc = bcompress(data, "lz4", 5, blosc.SHUFFLE, 0, 4, "FORWARD_COMPAT")
        add(name, "blosc", f"text_{nbytes}", data, enc, {"cname": "lz4", "shuffle": "shuffle", "typesize": 4})
    os.environ["BLOSC_SPLITMODE"] = "FORWARD_COMPAT"


def other_vectors():
    data4 = smooth(1001, 4, 60)
    text = smooth(5000, 1, 61)
    rnd = random_bytes(2000, 62)
    inputs = [("f4_1001", data4), ("text_5000", text), ("random_2000", rnd), ("empty", b"")]
    for dname, data in inputs:
        for level in (-1, 3, 19):
            for checksum in (False, True):
                c = Zstd(level=level, checksum=checksum)
                enc = c.encode(data)
                name = f"zstd_l{level}{'_crc' if checksum else ''}_{dname}"
                add(name, "zstd", dname, data, enc, {"level": level, "checksum": checksum})
        for level in (1, 9):
            add(f"gzip_l{level}_{dname}", "gzip", dname, data, GZip(level=level).encode(data), {"level": level})
            add(f"zlib_l{level}_{dname}", "zlib", dname, data, Zlib(level=level).encode(data), {"level": level})
        for accel in (1, 10):
            add(f"lz4_a{accel}_{dname}", "lz4", dname, data, LZ4(acceleration=accel).encode(data),
                {"acceleration": accel})
    # A gzip file of two members (gzip readers concatenate them).
    two = GZip(level=5).encode(text[:2000]) + GZip(level=5).encode(text[2000:])
    add("gzip_two_members_text_5000", "gzip", "text_5000", text, bytes(two), {"members": 2})
    # Two concatenated zstd frames.
    two = Zstd(level=3).encode(text[:1000]) + Zstd(level=3, checksum=True).encode(text[1000:])
    add("zstd_two_frames_text_5000", "zstd", "text_5000", text, bytes(two), {"frames": 2})


def main():
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(os.path.join(OUT, "raw"))
    blosc_vectors()
    other_vectors()
    for name, data in raws.items():
        with open(os.path.join(OUT, "raw", name + ".raw"), "wb") as f:
            f.write(data)
    index = {"numcodecs": numcodecs.__version__, "blosc": blosc.VERSION_STRING, "vectors": vectors}
    with open(os.path.join(OUT, "index.json"), "w") as f:
        json.dump(index, f, indent=0, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(OUT) for fn in fns)
    print(f"{len(vectors)} vectors, {len(raws)} raw buffers, {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
