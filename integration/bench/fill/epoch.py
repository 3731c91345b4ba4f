#!/usr/bin/env python3
"""Time one epoch over a sample directory of a (cold) mount; print one JSON line.

Usage: epoch.py SAMPLE_DIR --how loader|loader-shuffled|plain|plain-ra0 [--batch 4]

  loader           zarrfs.torch.Loader, batch 4, in order, to the GPU when there is one
                   (CUDA started before the epoch, as a training script's model starts it)
  loader-shuffled  the same with shuffle=True
  plain, plain-ra0 one reader, one sample at a time in order: open, read the
                   whole file into one reused buffer, close (the mount decides
                   the readahead; plain-ra0 names a mount with --readahead 0)

Output: how, samples, seconds, samples_per_s, cpu_s (the reader's own CPU
seconds, user and system, over the epoch), and for the Loader the device.
"""

import argparse
import json
import os
import resource
import time


def cpu_seconds():
    """User and system CPU seconds of this process, all its threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--how", required=True, choices=["loader", "loader-shuffled", "plain", "plain-ra0"])
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    out = {"what": "epoch", "how": a.how}
    if a.how.startswith("loader"):
        import torch

        from zarrfs.torch import Loader

        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            # A training script has CUDA running (its model is on the GPU)
            # before its first epoch; the Loader's own setup (its pinned
            # ring) stays in the epoch's time.
            torch.zeros(1, device=device)
            torch.cuda.synchronize()
        loader = Loader(a.dir, a.batch, device=device, shuffle=a.how == "loader-shuffled")
        n = 0
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        for x in loader:
            batch = x[0] if isinstance(x, (tuple, list)) else x
            n += batch.shape[0]
        if device == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        out["device"] = device
    else:
        names = sorted(f for f in os.listdir(a.dir) if f.endswith(".npy"))
        size = os.path.getsize(os.path.join(a.dir, names[0]))
        buf = bytearray(size)
        view = memoryview(buf)
        n = 0
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        for f in names:
            with open(os.path.join(a.dir, f), "rb", buffering=0) as fh:
                got = 0
                while got < size:
                    k = fh.readinto(view[got:])
                    if not k:
                        break
                    got += k
            n += 1
        secs = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    out.update(samples=n, seconds=round(secs, 3), samples_per_s=round(n / secs, 2), cpu_s=round(cpu, 2))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
