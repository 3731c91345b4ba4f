#!/usr/bin/env python3
"""Time numcodecs decoding the chunk BenchmarkDecode decodes, for comparison.

Builds the same 721x1440 float32 field as benchField in bench_test.go (same
formula, same splitmix64 noise), compresses it with numcodecs' codecs at the
settings the Go benchmark mimics, and prints decode MB/s (decimal MB, like
go test's MB/s) for one thread and for blosc's default thread count.

    python3 bench_numcodecs.py [DIR]

With DIR, it also writes the field (field.raw) and each compressed chunk
(<name>.bin) there; BenchmarkDecodeNumcodecs decodes those when
ZARRFS_CODEC_BENCH_DIR=DIR, so both sides time the very same bytes.
"""

import os
import sys
import time

import numpy as np
import numcodecs
import numcodecs.blosc as blosc
from numcodecs import Blosc, GZip, Zstd

M64 = (1 << 64) - 1


def splitmix64(i):
    z = (i * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def field():
    ny, nx = 721, 1440
    y, x = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    lat = (y / (ny - 1) - 0.5) * np.pi
    lon = x / nx * 2 * np.pi
    with np.errstate(over="ignore"):
        i = np.arange(ny * nx, dtype=np.uint64).reshape(ny, nx)
        u = (splitmix64(i) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    v = 250 + 40 * np.cos(lat) + 8 * np.sin(3 * lon) * np.cos(2 * lat) + 3 * np.sin(7 * lon + 5 * lat) + (u - 0.5) * 0.5
    return v.astype("<f4")


def bench(codec, data, reps=30):
    enc = codec.encode(data)
    out = np.empty_like(data)
    codec.decode(enc, out=out)
    assert np.array_equal(out, data)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        codec.decode(enc, out=out)
        best = min(best, time.perf_counter() - t)
    return data.nbytes / best / 1e6, data.nbytes / len(enc)


def main():
    data = field()
    codecs = [
        ("zstd3", Zstd(level=3, checksum=True)),
        ("blosc-lz4-shuffle", Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE)),
        ("blosc-zstd-shuffle", Blosc(cname="zstd", clevel=5, shuffle=Blosc.SHUFFLE)),
        ("blosc-lz4-bitshuffle", Blosc(cname="lz4", clevel=5, shuffle=Blosc.BITSHUFFLE)),
        ("gzip6", GZip(level=6)),
    ]
    print(f"numcodecs {numcodecs.__version__}, c-blosc {blosc.VERSION_STRING}")
    if len(sys.argv) > 1:
        out = sys.argv[1]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "field.raw"), "wb") as f:
            f.write(data.tobytes())
        for name, c in codecs:
            with open(os.path.join(out, name + ".bin"), "wb") as f:
                f.write(bytes(c.encode(data)))
    default_threads = blosc.get_nthreads()
    for threads in (1, default_threads):
        blosc.set_nthreads(threads)
        blosc.use_threads = threads > 1
        for name, c in codecs:
            if threads > 1 and not name.startswith("blosc"):
                continue
            mbs, ratio = bench(c, data)
            print(f"{name:24s} blosc threads {threads}: {mbs:8.0f} MB/s  ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
