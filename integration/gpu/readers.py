#!/usr/bin/env python3
"""Readers of a sample directory into GPU memory, timed, for the GPU runs.

Usage: readers.py KIND ROOT [options]; prints one JSON line
  {"kind", "root", "samples", "build_s", "epoch_s", "rate", "gbs", "checked", "bad"}.

Kinds:
  dali-cpu   DALI fn.readers.numpy(device="cpu") then .gpu(), batch --batch, --threads threads
  dali-gpu   DALI fn.readers.numpy(device="gpu") (GPUDirect Storage through cuFile)
  kvikio     kvikio.CuFile reads of each file's data into a CuPy array, --threads files at once
  pread      os.preadv of each file into pinned host memory by --threads threads, then an
             asynchronous copy to the GPU (the plain-file ceiling of a loader)
  loader     zarrfs.torch.Loader (the package's fast loader), batch --batch
  baseline   xarray + zarr-python + a PyTorch DataLoader (--threads workers) over the Zarr
             store ROOT and the view --view, the pipeline users have without zarrfs

--files passes DALI the file list instead of file_root (DALI stats every entry of file_root
when the pipeline is built, which in direct mode fills every sample before the first batch).
--check REF compares every sample read with numpy.load(REF/name), byte for byte.
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def sample_files(root):
    return sorted(f for f in os.listdir(root) if f.endswith(".npy"))


def header(path):
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        return shape, dtype, f.tell()


def check_one(ref, name, arr, bad):
    want = np.load(os.path.join(ref, name))
    if arr.shape != want.shape or arr.dtype != want.dtype or arr.tobytes() != want.tobytes():
        bad.append(name)


def run_dali(a, device):
    from nvidia.dali import fn, pipeline_def
    names = sample_files(a.root)
    kw = dict(device=device, name="r", file_filter="*.npy")
    if a.files:
        kw = dict(device=device, name="r", files=[os.path.join(a.root, n) for n in names])
    else:
        kw["file_root"] = a.root

    @pipeline_def(batch_size=a.batch, num_threads=a.threads, device_id=0, prefetch_queue_depth=2)
    def pipe():
        data = fn.readers.numpy(**kw)
        info = fn.get_property(data, key="source_info")
        if device == "cpu":
            data = data.gpu()
        return data, info

    t0 = time.perf_counter()
    p = pipe()
    p.build()
    t1 = time.perf_counter()
    seen, bad = 0, []
    while seen < len(names):
        data, info = p.run()
        for i in range(len(data)):
            if seen >= len(names):
                break
            seen += 1
            if a.check:
                arr = np.array(data.as_cpu()[i])
                inf = info.as_cpu() if hasattr(info, "as_cpu") else info
                src = bytes(np.asarray(inf[i])).rstrip(b"\0").decode()
                check_one(a.check, os.path.basename(src), arr, bad)
    import cupy
    cupy.cuda.runtime.deviceSynchronize()
    t2 = time.perf_counter()
    return len(names), t1 - t0, t2 - t1, bad


def run_kvikio(a):
    import cupy
    import kvikio
    from concurrent.futures import ThreadPoolExecutor
    names = sample_files(a.root)
    shape, dtype, off = header(os.path.join(a.root, names[0]))
    bufs = [cupy.empty(shape, dtype=dtype) for _ in range(a.threads)]
    bad = []

    def one(k):
        name = names[k]
        buf = bufs[k % a.threads]
        with kvikio.CuFile(os.path.join(a.root, name), "r") as f:
            n = f.read(buf, file_offset=off)
        assert n == buf.nbytes, (name, n)
        if a.check:
            check_one(a.check, name, cupy.asnumpy(buf), bad)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as ex:
        for start in range(0, len(names), a.threads):
            list(ex.map(one, range(start, min(start + a.threads, len(names)))))
    cupy.cuda.runtime.deviceSynchronize()
    return len(names), 0.0, time.perf_counter() - t0, bad


def run_pread(a):
    import torch
    from concurrent.futures import ThreadPoolExecutor
    names = sample_files(a.root)
    shape, dtype, off = header(os.path.join(a.root, names[0]))
    n = int(np.prod(shape)) * dtype.itemsize
    host = [torch.empty(n, dtype=torch.uint8).pin_memory() for _ in range(a.threads)]
    dev = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(a.threads)]
    streams = [torch.cuda.Stream() for _ in range(a.threads)]
    bad = []

    def one(k):
        i = k % a.threads
        streams[i].synchronize()
        fd = os.open(os.path.join(a.root, names[k]), os.O_RDONLY)
        try:
            mv = memoryview(host[i].numpy())
            got = 0
            while got < n:
                r = os.preadv(fd, [mv[got:]], off + got)
                if r <= 0:
                    raise IOError(f"{names[k]}: short read")
                got += r
        finally:
            os.close(fd)
        with torch.cuda.stream(streams[i]):
            dev[i].copy_(host[i], non_blocking=True)
        if a.check:
            streams[i].synchronize()
            check_one(a.check, names[k], dev[i].cpu().numpy().view(dtype).reshape(shape), bad)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as ex:
        for start in range(0, len(names), a.threads):
            list(ex.map(one, range(start, min(start + a.threads, len(names)))))
    torch.cuda.synchronize()
    return len(names), 0.0, time.perf_counter() - t0, bad


def run_loader(a):
    import torch
    from zarrfs.torch import Loader
    t0 = time.perf_counter()
    loader = Loader(a.root, a.batch, device="cuda", threads=a.threads or None)
    # The first epoch pins the loader's buffers and starts CUDA: untimed,
    # as the other readers' setup is.
    for _ in range(a.epochs - 1):
        for batch, coords in loader:
            pass
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    seen, bad = 0, []
    for batch, coords in loader:
        if a.check:
            for i in range(batch.shape[0]):
                name = coords["file"][i] if isinstance(coords, dict) and "file" in coords else None
                if name:
                    check_one(a.check, os.path.basename(name), batch[i].cpu().numpy(), bad)
        seen += batch.shape[0]
    torch.cuda.synchronize()
    return seen, t1 - t0, time.perf_counter() - t1, bad


def run_baseline(a):
    import torch
    import xarray as xr
    import yaml
    spec = yaml.safe_load(open(a.view))["views"][0]
    ds = xr.open_zarr(a.root, consolidated=False)

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return a.n or ds.sizes["time"]

        def __getitem__(self, t):
            chans = []
            for ch in spec["channels"]:
                v = ds[ch["var"]]
                if "time" in v.dims:
                    v = v.isel(time=t)
                arr = v.values.astype(np.float32)
                if arr.ndim == 3:
                    chans.extend(arr)
                else:
                    chans.append(arr)
            return torch.from_numpy(np.stack(chans))

    dl = torch.utils.data.DataLoader(Samples(), batch_size=a.batch, num_workers=a.threads, pin_memory=True)
    t0 = time.perf_counter()
    seen = 0
    for x in dl:
        x = x.cuda(non_blocking=True)
        seen += x.shape[0]
    torch.cuda.synchronize()
    return seen, 0.0, time.perf_counter() - t0, []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["dali-cpu", "dali-gpu", "kvikio", "pread", "loader", "baseline"])
    ap.add_argument("root")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--files", action="store_true")
    ap.add_argument("--check")
    ap.add_argument("--view")
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=2, help="loader: epochs read, the last one timed")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    run = {"dali-cpu": lambda: run_dali(a, "cpu"), "dali-gpu": lambda: run_dali(a, "gpu"), "kvikio": lambda: run_kvikio(a),
           "pread": lambda: run_pread(a), "loader": lambda: run_loader(a), "baseline": lambda: run_baseline(a)}[a.kind]
    try:
        n, build, epoch, bad = run()
        out = {"kind": a.kind, "label": a.label, "root": a.root, "samples": n, "build_s": round(build, 3),
               "epoch_s": round(epoch, 3), "rate": round(n / max(epoch, 1e-9), 2),
               "rate_with_build": round(n / max(build + epoch, 1e-9), 2), "checked": bool(a.check), "bad": bad[:5], "nbad": len(bad)}
    except Exception as e:  # one line the run log can show
        out = {"kind": a.kind, "label": a.label, "root": a.root, "error": f"{type(e).__name__}: {e}"[:500]}
    print(json.dumps(out), flush=True)
    sys.exit(1 if "error" in out or out.get("nbad") else 0)


if __name__ == "__main__":
    main()
