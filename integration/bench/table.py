#!/usr/bin/env python3
"""Summarise benchmark JSON lines (from readbench and peers.py) as a table of GB/s and ratios.

Usage: table.py RESULTS.jsonl

Ratios: zarrfs / zarr-python (per-step reads, as a training loader would do) and zarrfs /
tensorstore (the better of its per-step and whole-array reads). Targets: >= 1.5x zarr-python and
>= 1.0x tensorstore for zstd and blosc; zarrfs peak RSS <= 2x its bytes in flight. Exit status 1
when the readers disagree on the values of step 0.
"""

import json
import sys

TARGET = {"zstd": (1.5, 1.0), "blosc": (1.5, 1.0)}


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
    codecs = []
    by = {}
    for r in rows:
        c = r["store"].removeprefix("era5_").removesuffix(".zarr")
        if c not in codecs:
            codecs.append(c)
        by.setdefault(c, {})[(r["reader"], r["mode"])] = r
    bad = False
    print(f"{'codec':6} {'zarrfs':>8} {'zarr-py':>8} {'ts step':>8} {'ts whole':>8} "
          f"{'x zarr-py':>9} {'x ts':>6} {'peak/inflight':>13}  target")
    for c in codecs:
        m = by[c]
        zf = next((v for (rd, _), v in m.items() if rd == "zarrfs"), None)
        zp = m.get(("zarr-python", "step"))
        ts = [m.get(("tensorstore", "step")), m.get(("tensorstore", "whole"))]
        tsbest = max((t["gbps"] for t in ts if t), default=None)
        sums = {v["sha256_step0"] for v in m.values()}
        if len(sums) > 1:
            bad = True
            print(f"{c}: READERS DISAGREE on step 0: " +
                  ", ".join(f"{k[0]}/{k[1]}={v['sha256_step0'][:12]}" for k, v in m.items()))

        def g(r):
            return f"{r['gbps']:8.3f}" if r else f"{'-':>8}"
        rzp = zf["gbps"] / zp["gbps"] if zf and zp else None
        rts = zf["gbps"] / tsbest if zf and tsbest else None
        verdict = ""
        if c in TARGET and rzp is not None and rts is not None:
            ok = rzp >= TARGET[c][0] and rts >= TARGET[c][1]
            verdict = "met" if ok else f"MISSED (>= {TARGET[c][0]}x, >= {TARGET[c][1]}x)"
        mem = f"{zf['peak_over_in_flight']:13.2f}" if zf else f"{'-':>13}"
        srzp = f"{rzp:9.2f}" if rzp else f"{'-':>9}"
        srts = f"{rts:6.2f}" if rts else f"{'-':>6}"
        print(f"{c:6} {g(zf)} {g(zp)} {g(ts[0])} {g(ts[1])} {srzp} {srts} {mem}  {verdict}")
    extra = [r for r in rows if (r["reader"], r["mode"]) not in
             {("zarr-python", "step"), ("tensorstore", "step"), ("tensorstore", "whole")}
             and r["reader"] != "zarrfs"]
    for r in extra:
        print(f"  also: {r['store']} {r['reader']} {r['mode']}: {r['gbps']:.3f} GB/s")
    for c in codecs:
        zf = next((v for (rd, _), v in by[c].items() if rd == "zarrfs"), None)
        if zf:
            print(f"  zarrfs {c}: {zf['mode']}, {zf['steps']} steps, {zf['bytes'] / 1e9:.2f} GB, peak RSS "
                  f"{zf['peak_rss_bytes'] / 2**20:.0f} MiB, in flight {zf['in_flight_bytes'] / 2**20:.0f} MiB, "
                  f"growth beyond buffers {zf['growth_over_in_flight']:.2f}x in flight")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
