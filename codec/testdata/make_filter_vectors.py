"""Writes testdata/filters: chunks encoded by numcodecs' HDF5 filter chain
(shuffle, then zlib, then fletcher32, as kerchunk and VirtualiZarr describe
HDF5 datasets), with the raw bytes they decode to. Run from this folder."""
import json
import os

import numpy as np
from numcodecs import Fletcher32, Shuffle, Zlib

rng = np.random.default_rng(28)
cases = []
for dtype in ["<f4", "<f8", "<i2", "|u1", "<i8"]:
    for n in [1, 7, 301]:
        raw = (rng.standard_normal(n) * 100).astype(dtype)
        for chain in [["shuffle"], ["shuffle", "zlib"], ["shuffle", "zlib", "fletcher32"], ["fletcher32"], ["zlib", "fletcher32"]]:
            b = raw.tobytes()
            for c in chain:
                codec = {"shuffle": Shuffle(elementsize=raw.itemsize), "zlib": Zlib(level=4), "fletcher32": Fletcher32()}[c]
                b = bytes(codec.encode(np.frombuffer(b, "u1")))
            name = f"{dtype[1:]}_{n}_{'-'.join(chain)}"
            with open(os.path.join("filters", name + ".enc"), "wb") as f:
                f.write(b)
            with open(os.path.join("filters", name + ".raw"), "wb") as f:
                f.write(raw.tobytes())
            cases.append({"name": name, "chain": chain, "elementsize": raw.itemsize})
with open(os.path.join("filters", "index.json"), "w") as f:
    json.dump(cases, f, indent=1)
