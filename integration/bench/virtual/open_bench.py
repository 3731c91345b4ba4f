"""Opening a 10,000-file reference set: python3 open_bench.py ZARRFS DIR

Writes DIR/refs10k.json in the form kerchunk's MultiZarrToZarr gives 10,000
files of one time step each (t and q on a 181 x 360 grid, one chunk a file
and variable, targets DIR/nc10k/fNNNNN.nc) and DIR/refs10k.parq from it
with kerchunk.df.refs_to_dataframe; then, for each, starts `zarrfs mount`,
times it to its "mounted" line, lists the whole mount (readdir and stat of
every file, as ls -lR does), reads the daemon's RSS and unmounts. Prints one
JSON line per form."""
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

zarrfs, d = sys.argv[1], sys.argv[2]
N = 10_000
js = os.path.join(d, "refs10k.json")
if not os.path.exists(js):
    refs = {".zgroup": json.dumps({"zarr_format": 2}), ".zattrs": "{}"}
    for v in ("t", "q"):
        refs[f"{v}/.zarray"] = json.dumps({"shape": [N, 181, 360], "chunks": [1, 181, 360], "dtype": "<f4",
                                           "fill_value": None, "order": "C", "compressor": None,
                                           "filters": [{"id": "shuffle", "elementsize": 4}, {"id": "zlib", "level": 1}],
                                           "zarr_format": 2})
        refs[f"{v}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["time", "lat", "lon"]})
        for k in range(N):
            refs[f"{v}/{k}.0.0"] = [f"nc10k/f{k:05d}.nc", 4096 + (0 if v == "t" else 200_000), 190_000 + k % 977]
    refs["time/.zarray"] = json.dumps({"shape": [N], "chunks": [N], "dtype": "<f8", "fill_value": None, "order": "C",
                                       "compressor": None, "filters": None, "zarr_format": 2})
    refs["time/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["time"]})
    import numpy as np
    refs["time/0"] = "base64:" + base64.b64encode(np.arange(N, dtype="f8").tobytes()).decode()
    with open(js, "w") as f:
        json.dump({"version": 1, "refs": refs}, f)
pq = os.path.join(d, "refs10k.parq")
if not os.path.exists(os.path.join(pq, ".zmetadata")):
    import kerchunk.df
    kerchunk.df.refs_to_dataframe(js, pq, record_size=100_000)

for src in (js, pq):
    mnt, cache = tempfile.mkdtemp(), tempfile.mkdtemp()
    t0 = time.perf_counter()
    p = subprocess.Popen([zarrfs, "mount", src, mnt, "--cache", cache], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    p.stdout.readline()
    t_mount = time.perf_counter() - t0
    t1 = time.perf_counter()
    n = 0
    for root, dirs, files in os.walk(mnt):
        for f in files:
            os.stat(os.path.join(root, f))
            n += 1
    t_list = time.perf_counter() - t1
    rss = 0
    with open(f"/proc/{p.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    print(json.dumps({"form": "parquet" if src == pq else "json", "bytes": os.path.getsize(src) if src == js else
                      sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(pq) for f in fs),
                      "mount_s": round(t_mount, 3), "list_s": round(t_list, 3), "total_s": round(t_mount + t_list, 3),
                      "files": n, "rss_mib": round(rss / 2**20, 1)}))
