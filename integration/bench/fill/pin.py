#!/usr/bin/env python3
"""Time pinning a ring slot of zarrfs.torch.Loader two ways; print one JSON line.

Usage: pin.py [--mib 348] [--rounds 3]

Each round pins a fresh buffer of MIB MiB (a Loader ring slot of batch 4 of
the ERA5-like 21-channel view is 348 MiB) through torch.empty(...,
pin_memory=True) (cudaHostAlloc) and through the Loader's own _pinned
(anonymous memory on transparent huge pages, faulted in on threads,
cudaHostRegister), alternating which goes first, and times a host-to-GPU
copy from each. Needs CUDA; without it prints {"what": "pin", "skipped": why}.
"""

import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=348)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"what": "pin", "skipped": "no CUDA device"}), flush=True)
        return
    from zarrfs.loader import _pinned

    n = a.mib << 20
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    gpu = torch.empty(n, dtype=torch.uint8, device="cuda")
    ways = {"torch": lambda: torch.empty(n, dtype=torch.uint8, pin_memory=True), "loader": lambda: _pinned(n)}
    out = {"what": "pin", "mib": a.mib, "seconds": {k: [] for k in ways}, "h2d_gbps": {k: [] for k in ways}}
    keep = []  # fresh memory each round: torch's allocator would hand a freed block back
    for r in range(a.rounds):
        for k in (list(ways) if r % 2 == 0 else list(reversed(ways))):
            t = time.perf_counter()
            host = ways[k]()
            out["seconds"][k].append(round(time.perf_counter() - t, 4))
            t = time.perf_counter()
            gpu.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            out["h2d_gbps"][k].append(round(n / (time.perf_counter() - t) / 1e9, 1))
            keep.append(host)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
