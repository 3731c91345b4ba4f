#!/usr/bin/env python3
"""Summarise fill.jsonl (integration/bench/fill/run.sh) as Markdown tables with same-run ratios.

Usage: summary.py FILL.jsonl
"""

import json
import sys
from collections import defaultdict


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    stores = []
    for r in rows:
        if r.get("store") and r["store"] not in stores:
            stores.append(r["store"])
    for s in stores:
        rs = [r for r in rows if r.get("store") == s]
        print(f"\n### {s}\n")
        for r in rs:
            if r["what"] == "floor_read":
                print(f"- floor: {r['threads']} threads read every chunk file: {r['gbps']:.1f} GB/s")
            if r["what"] == "floor_write":
                print(f"- floor: {r['threads']} threads write blob-sized files to the cache's filesystem: {r['gbps']:.1f} GB/s")
            if r["what"] == "fill":
                print(f"- fill loop ({r['decode']}, {r['jobs']} jobs): {r['gbps']:.2f} GB/s, {r['cpu_seconds']:.1f} CPU s, "
                      f"{r['minor_faults']} minor faults, peak RSS {r['peak_rss'] / 1e9:.2f} GB")
        stages = [r for r in rs if r["what"] == "stage"]
        if stages:
            print("\n| stage | CPU s/GB | bytes moved per decoded byte |\n|---|---|---|")
            for r in stages:
                mv = r.get("moved_per_byte")
                print(f"| {r['stage']} | {r['cpu_s_per_gb']:.3f} | {'' if mv is None else f'{mv:.2f}'} |")
        peers = {r["reader"]: r for r in rs if r["what"] == "peer"}
        warm = defaultdict(list)
        for r in rs:
            if r["what"] == "warm":
                warm[r["label"].removesuffix("-2")].append(r)
        best = {k: min(v, key=lambda r: r["seconds"]) for k, v in warm.items()}
        if peers or best:
            # Peers read each array once (a static field once); warm writes
            # every sample of the view (the static field in each): the bytes
            # differ, the job (every sample's data) does not, so readers are
            # compared by their times.
            print("\n| reader | GB/s of its own bytes | GB | seconds | speed against zarr-python + zarrs (its time / this one's) |\n|---|---|---|---|---|")
            ref = peers.get("zarrs", {}).get("seconds")
            for k, r in list(peers.items()) + [(f"zarrfs warm {k} (cpus {r['cpus']})", r) for k, r in best.items()]:
                ratio = f"{ref / r['seconds']:.2f}x" if ref else ""
                print(f"| {k} | {r['gbps']:.2f} | {r['bytes'] / 1e9:.2f} | {r['seconds']:.2f} | {ratio} |")
        for cpus in ("all", "0-3", "0-7"):
            sfx = "" if cpus == "all" else f"-{cpus}"
            cpu = best.get(f"new-cpu{sfx}")
            for dec in ("gpu", "auto"):
                other = best.get(f"new-{dec}{sfx}")
                if cpu and other:
                    print(f"- cpus {cpus}: --decode {dec} against cpu: {cpu['seconds'] / other['seconds']:.2f}x")
            oldc = best.get(f"old-cpu{sfx}")
            if cpu and oldc:
                print(f"- cpus {cpus}: this build against ZARRFS_OLD, --decode cpu: {oldc['seconds'] / cpu['seconds']:.2f}x")
        for r in rs:
            if r["what"] == "pin" and "seconds" in r:
                sec = r["seconds"]
                print(f"- pinning a {r['mib']} MiB ring slot: torch {min(sec['torch']):.3f}-{max(sec['torch']):.3f} s, "
                      f"the Loader's {min(sec['loader']):.3f}-{max(sec['loader']):.3f} s")
            if r["what"] == "epoch":
                what = "warm mount" if r["how"] == "plain-warm" else "first epoch"
                print(f"- {what}, {r['how']}, cache on {r['cache']}: {r['samples_per_s']} samples/s, "
                      f"{r['vs_warm']}x zarrfs warm of the same samples ({r['warm_samples_per_s']}/s)")


if __name__ == "__main__":
    main()
