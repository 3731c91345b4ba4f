#!/usr/bin/env python3
"""Write the Parquet reference sets package kerchunk's tests read.

kerchunk's own writer (kerchunk.df.refs_to_dataframe, fsspec's
LazyReferenceMapper over fastparquet, zstd pages) turns one JSON reference
set into Parquet folders, so the tests read the files a user's reference set
holds, not files written by the reader's own library. Run from this folder:

    python3 make_parquet.py

It rewrites parquet/: refs.json (the JSON form, targets relative to
parquet/), data/ (the target files), cat.parq (paths as a dictionary: pandas'
categorical, what kerchunk writes when few files hold many chunks) and
plain.parq (paths as plain strings). The references cover ranges, whole
files, inline bytes, missing chunks, several record files per array, a
partly filled last record, a nested group and a scalar.
"""

import base64
import json
import os
import shutil

import kerchunk.df

out = "parquet"
shutil.rmtree(out, ignore_errors=True)
os.makedirs(os.path.join(out, "data"))


def zarray(shape, chunks, dtype="<i4"):
    return json.dumps({"shape": shape, "chunks": chunks, "dtype": dtype, "fill_value": 0, "order": "C",
                       "compressor": None, "filters": None, "zarr_format": 2})


archive = bytearray(b"header")
refs = {".zgroup": json.dumps({"zarr_format": 2}), ".zattrs": json.dumps({"title": "parquet fixture"}),
        "t/.zarray": zarray([10, 4], [1, 2]), "t/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time", "x"]}),
        "g/.zgroup": json.dumps({"zarr_format": 2}),
        "g/s/.zarray": zarray([], []), "g/s/0": "base64:KgAAAA==",
        "g/u/.zarray": zarray([3], [2])}
# t: 10 x 2 chunks, record_size 6 below: 4 record files, the last partly
# filled; chunk 3.1 missing, every fifth chunk inline, every seventh a
# whole file, the rest ranges of one archive.
for i in range(10):
    for j in range(2):
        k = i * 2 + j
        body = bytes((k * 8 + n) % 256 for n in range(8))
        if (i, j) == (3, 1):
            continue
        if k % 5 == 0:
            refs[f"t/{i}.{j}"] = "base64:" + base64.b64encode(body).decode()
        elif k % 7 == 0:
            name = f"data/whole{k}.bin"
            with open(os.path.join(out, name), "wb") as f:
                f.write(body)
            refs[f"t/{i}.{j}"] = [name]
        else:
            refs[f"t/{i}.{j}"] = ["data/archive.bin", len(archive), len(body)]
            archive += body + b"gap"
refs["g/u/1"] = ["data/archive.bin", 0, 6]
with open(os.path.join(out, "data", "archive.bin"), "wb") as f:
    f.write(archive)
with open(os.path.join(out, "refs.json"), "w") as f:
    json.dump({"version": 1, "refs": refs}, f, indent=0, sort_keys=True)
kerchunk.df.refs_to_dataframe(os.path.join(out, "refs.json"), os.path.join(out, "cat.parq"), record_size=6,
                              categorical_threshold=1)
kerchunk.df.refs_to_dataframe(os.path.join(out, "refs.json"), os.path.join(out, "plain.parq"), record_size=6,
                              categorical_threshold=1000)
