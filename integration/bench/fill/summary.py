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
        decoders_table(warm)
        for key in [k[len("new-cpu"):] for k in best if k.startswith("new-cpu")]:
            cpu, oldc = best[f"new-cpu{key}"], best.get(f"old-cpu{key}")
            if oldc:
                print(f"- cpus {cpu['cpus']} {cpu.get('flags', '')}: this build against ZARRFS_OLD, --decode cpu: {oldc['seconds'] / cpu['seconds']:.2f}x")
        for r in rs:
            if r["what"] == "pin" and "seconds" in r:
                sec = r["seconds"]
                print(f"- pinning a {r['mib']} MiB ring slot: torch {min(sec['torch']):.3f}-{max(sec['torch']):.3f} s, "
                      f"the Loader's {min(sec['loader']):.3f}-{max(sec['loader']):.3f} s")
            if r["what"] == "epoch":
                what = "warm mount" if r["how"] == "plain-warm" else "first epoch"
                print(f"- {what}, {r['how']}, cache on {r['cache']}: {r['samples_per_s']} samples/s, "
                      f"{r['vs_warm']}x zarrfs warm of the same samples ({r['warm_samples_per_s']}/s)")


def decoders_table(warm):
    """--decode auto and gpu against cpu, by cores and flags: each label's
    best and median seconds over its runs (run.sh's REPEAT), speed as cpu's
    seconds over the other's, and the chunks the GPU decoded."""
    keys = [k[len("new-cpu"):] for k in warm if k.startswith("new-cpu")]
    if not keys:
        return
    print("\n| cores | flags | runs | cpu s, best / median | auto s | gpu s | auto against cpu, best / median | gpu against cpu, best / median | GPU chunks, auto / gpu |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in keys:
        cpu = warm[f"new-cpu{k}"]
        cells, ratios, chunks = [], [], []
        for dec in ("cpu", "auto", "gpu"):
            rs = warm.get(f"new-{dec}{k}", [])
            secs = sorted(r["seconds"] for r in rs)
            if not secs:
                cells.append("")
                continue
            cells.append(f"{secs[0]:.2f} / {median(secs):.2f}")
            if dec != "cpu":
                c = sorted(r["seconds"] for r in cpu)
                ratios.append(f"{c[0] / secs[0]:.2f}x / {median(c) / median(secs):.2f}x")
                chunks.append(" ".join(sorted({r.get("gpu_chunks", "0") for r in rs})))
        while len(ratios) < 2:
            ratios.append("")
        print(f"| {cpu[0]['cpus']} | {cpu[0].get('flags', '') or 'default'} | {len(cpu)} | {' | '.join(cells)} | {' | '.join(ratios)} | {' / '.join(chunks)} |")


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


if __name__ == "__main__":
    main()
