#!/usr/bin/env python3
"""Device delivery on a GPU machine: zarrfs.torch.Loader(decode="device")
against decode="host" over the same samples of the ERA5-like view.

Usage: deliver_check.py ZARRFS STORE VIEW SCRATCH [--parts equal,reader,daemon,rate] [--trust-unchecked] [--gpu-kernels FILE]

  equal   every batch of decode="device" equals decode="host" byte for byte
          (same shuffled order, compared on the GPU), and a few samples equal
          numpy.load of the mount's files; the ring is device memory
          (path 'ring-cuda'); status counts the samples and bytes
  reader  a reader killed with SIGKILL frees its ring: status shows none
          open, and the daemon's GPU memory (nvidia-smi) drops by the ring
  daemon  a daemon killed mid-epoch makes the Loader raise DeliveryError,
          not hang; a daemon started again serves a new Loader
  rate    first epoch, cold mount (its own cache), batch 4: samples/s of
          decode="device" and decode="host", daemon on cores 0-3 (taskset)
          and the Loader on 8-15, then on every core

--trust-unchecked mounts with --gpu-trust-unchecked (the mixed store: its
zstd frames have no checksum, and decode on the GPU only with it).

--gpu-kernels FILE mounts with the kernels of FILE (kernels.cu compiled by
deliver.sh) instead of the binary's.

Prints one line per check ("PASS ..." or "FAIL ...") and RATE, CPU, BYTES,
STAGES and MEASURE lines for the rates; exits 1 when a check failed.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

import zarrfs
from zarrfs._deliver import DeliveryError
from zarrfs.loader import Loader

failed = []
# --device cpu runs every check against the mount's test mode (--delivery
# host: a ring in host memory, decoded on the CPU), to try this script on a
# machine without a GPU.
DEVICE = "cuda"
# Mount flags every mount of the run gets besides its own (--trust-unchecked).
EXTRA = {}


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failed.append(what)


def mount_flags(view, cache):
    if DEVICE == "cpu":
        return dict(cache=cache, view=[view], delivery="host", memory="8GiB", **EXTRA)
    # Room for the rounds and a ring of 3 slots of 4 samples of 87 MB
    # (DELIVER_GPU_MEMORY: another --gpu-memory).
    return dict(cache=cache, view=[view], gpu_memory=os.environ.get("DELIVER_GPU_MEMORY", "8GiB"), pinned_memory=os.environ.get("DELIVER_PINNED_MEMORY", "6GiB"), **EXTRA)


def wrapper(zarrfs_bin, scratch, cores):
    """A zarrfs that runs on cores (taskset), for zarrfs.Mount."""
    if cores is None:
        return zarrfs_bin
    p = os.path.join(scratch, f"zarrfs-{cores}")
    with open(p, "w") as f:
        f.write(f"#!/bin/sh\nexec taskset -c {cores} {zarrfs_bin} \"$@\"\n")
    os.chmod(p, 0o755)
    return p


def start(zarrfs_bin, store, view, scratch, name, cores=None, **flags):
    os.environ["ZARRFS_BIN"] = wrapper(zarrfs_bin, scratch, cores)
    cache = os.path.join(scratch, "cache-" + name)
    subprocess.run(["rm", "-rf", cache])
    m = zarrfs.Mount(store, os.path.join(scratch, "mnt-" + name), **mount_flags(view, cache), **flags)
    m.start()
    os.environ["ZARRFS_BIN"] = zarrfs_bin
    return m


def status(zarrfs_bin, m):
    out = subprocess.run([zarrfs_bin, "status", m.path, "--json"], capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    return d[0] if isinstance(d, list) else d


def gpu_mem(pid):
    """MiB of GPU memory process pid holds (nvidia-smi), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True)
    except FileNotFoundError:
        return None
    for line in out.stdout.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 2 and f[0] == str(pid) and f[1].isdigit():
            return int(f[1])
    return None


def part_equal(a, m, n):
    d = os.path.join(m.path, "train")
    dev = Loader(d, 4, device=DEVICE, decode="device", shuffle=True, seed=3)
    host = Loader(d, 4, device=DEVICE, decode="host", shuffle=True, seed=3)
    check(dev.path_kind == ("ring-cuda" if DEVICE == "cuda" else "ring-host"), f"equal: decode='device' reads a ring in GPU memory ({dev.path_kind})")
    same, batches, samples = True, 0, 0
    for (x, cx), (y, cy) in zip(dev, host):
        batches += 1
        samples += len(x)
        if cx["index"].tolist() != cy["index"].tolist() or not torch.equal(x, y):
            same = False
            print(f"  batch {batches}: samples {cx['index'].tolist()} differ", flush=True)
    check(same and samples == n, f"equal: {samples} samples of decode='device' equal decode='host' byte for byte")
    files = dev.dir.files[:3]
    it = iter(Loader(d, 3, device=DEVICE, decode="device"))
    x, c = next(it)
    ok = all(np.array_equal(x[i].cpu().numpy(), np.load(f)) for i, f in enumerate(c["file"]))
    check(ok and c["file"] == files, "equal: ring batches equal numpy.load of the mount's files")
    del it, x
    dev.close()
    st = status(a.zarrfs, m)["delivery"]
    print(f"  status: {json.dumps({k: v for k, v in st.items() if k != 'rings'})}", flush=True)
    per = (st["compressed_bytes"] + st["host_path_bytes"]) / max(1, st["device_samples"] + st["host_samples"])
    print(f"  to the GPU per sample: {per / 1e6:.1f} MB ({st['device_samples']} device path, {st['host_samples']} host path samples)", flush=True)
    check(st["errors"] == 0, "equal: no fill failed")


_READER = """
import sys, time
from zarrfs.loader import Loader
l = Loader(sys.argv[1], 4, device=sys.argv[2], decode="device")
it = iter(l)
next(it)
print("ready", l._dring.ring_bytes, flush=True)
time.sleep(300)
"""


def part_reader(a, m):
    pid = m._proc.pid
    before = gpu_mem(pid)
    p = subprocess.Popen([sys.executable, "-c", _READER, os.path.join(m.path, "train"), DEVICE], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    check(line[:1] == ["ready"], "reader: a reader took a batch from its ring")
    ring = int(line[1]) if len(line) > 1 else 0
    st = status(a.zarrfs, m)["delivery"]
    with_ring = gpu_mem(pid)
    check(st["rings_open"] == 1 and st["ring_bytes"] == ring, f"reader: status shows its ring ({ring >> 20} MiB)")
    p.kill()
    p.wait()
    deadline = time.time() + 15
    while status(a.zarrfs, m)["delivery"]["rings_open"] and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    st = status(a.zarrfs, m)["delivery"]
    after = gpu_mem(pid)
    check(st["rings_open"] == 0 and st["ring_bytes"] == 0, "reader: killed, its ring is freed (status)")
    print(f"  daemon GPU memory (nvidia-smi, MiB): before {before}, with the ring {with_ring}, after the reader died {after}", flush=True)
    if with_ring is not None and after is not None:
        check(with_ring - after >= (ring >> 20) * 0.9, "reader: the daemon's GPU memory drops by the ring (nvidia-smi)")
    else:
        print("  nvidia-smi shows no per-process memory here: the status check stands alone", flush=True)
    n = sum(len(c["index"]) for _, c in Loader(os.path.join(m.path, "train"), 4, device=DEVICE, decode="device"))
    check(n > 0, "reader: the next Loader starts cleanly")


def part_daemon(a):
    m = start(a.zarrfs, a.store, a.view, a.scratch, "daemon")
    l = Loader(os.path.join(m.path, "train"), 4, device=DEVICE, decode="device", timeout=60)
    it = iter(l)
    next(it)
    os.kill(m._proc.pid, signal.SIGKILL)
    t0 = time.time()
    err = None
    signal.alarm(120)  # a hang fails the whole script, loudly
    try:
        # The ring may hold the rest of a short epoch already: later
        # epochs ask the dead daemon.
        for _ in it:
            pass
        for _ in range(100):
            for _ in l:
                pass
    except DeliveryError as e:
        err = e
    signal.alarm(0)
    took = time.time() - t0
    check(err is not None and took < 30, f"daemon: killed mid-epoch, the Loader raised in {took:.1f} s: {err}")
    del it
    l.close()
    try:
        m.stop()
    except zarrfs.MountError:
        pass
    m2 = start(a.zarrfs, a.store, a.view, a.scratch, "daemon")
    n = sum(len(c["index"]) for _, c in Loader(os.path.join(m2.path, "train"), 4, device=DEVICE, decode="device"))
    check(n > 0, "daemon: a daemon started again serves a new Loader")
    m2.stop()


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def cpu_seconds(pid):
    """User and system CPU seconds process pid has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def epoch_rate(a, name, decode, cores, prefetch=2):
    """First epoch of a cold mount (its own cache), batch 4, the daemon on
    cores: samples/s, and what the daemon spent on them (CPU seconds, its
    status: bytes, stages)."""
    flags = {}
    prof = os.environ.get("DELIVER_PROFILE_DIR")
    if prof:
        # The daemon's Go CPU profile of the epoch's mount (its hidden
        # --cpuprofile): where the CPU a sample goes.
        os.makedirs(prof, exist_ok=True)
        flags["cpuprofile"] = os.path.join(prof, f"{os.path.basename(a.scratch)}-{name}-{decode}-{cores or 'all'}.prof")
    m = start(a.zarrfs, a.store, a.view, a.scratch, name, cores, **flags)
    try:
        l = Loader(os.path.join(m.path, "train"), 4, device=DEVICE, decode=decode, prefetch=prefetch)
        sync()
        cpu0 = cpu_seconds(m._proc.pid)
        t0 = time.perf_counter()
        got = 0
        for x, _ in l:
            x.sum()  # the trainer reads the batch
            got += len(x)
        sync()
        dt = time.perf_counter() - t0
        cpu = cpu_seconds(m._proc.pid) - cpu0
        st = status(a.zarrfs, m)
        l.close()
        return dict(rate=got / dt, kind=l.path_kind, samples=got, cpu=cpu, delivery=st.get("delivery") or {},
                    fetched=(st.get("source_reads") or {}).get("bytes_fetched", 0))
    finally:
        m.stop()


def stage_line(d):
    """The device path's stages, ms a sample (summed over fills)."""
    n = max(1, d.get("device_samples", 0) + d.get("host_samples", 0))
    st = d.get("stages_s") or {}
    order = ["fill", "read", "consumer_wait", "host_checks", "device_wait", "h2d", "decode", "kernels", "d2h",
             "host_decode", "upload", "host_path", "host_share"]
    return ", ".join(f"{k} {1e3 * st.get(k, 0) / n:.1f}" for k in order)


def part_rate(a):
    """The issue's measures this path affects, per core count: first-epoch
    samples/s of decode='device' against 'host', bytes to the GPU against
    the compressed bytes, daemon CPU per sample, and the device path's
    stages."""
    ncpu = os.cpu_count() or 1
    summary = []
    for label, daemon_cores, loader_cores, target in (("4 cores", "0-3", set(range(8, min(16, ncpu))), 4.0),
                                                       (f"{ncpu} cores", None, None, 1.5)):
        os.sched_setaffinity(0, loader_cores or set(range(ncpu)))
        dev = epoch_rate(a, "rate-dev", "device", daemon_cores)
        host = epoch_rate(a, "rate-host", "host", daemon_cores)
        d = dev["delivery"]
        ndev = d.get("device_samples", 0)
        nall = max(1, ndev + d.get("host_samples", 0))
        h2d = (d.get("compressed_bytes", 0) + d.get("host_path_bytes", 0)) / nall
        comp = dev["fetched"] / max(1, dev["samples"])
        cpu_dev, cpu_host = dev["cpu"] / max(1, dev["samples"]), host["cpu"] / max(1, host["samples"])
        speed = dev["rate"] / host["rate"]
        print(f"RATE {label}: first epoch, cold mount, batch 4: decode='device' {dev['rate']:.1f} samples/s ({dev['kind']}, "
              f"{ndev} samples on the device path, {h2d / 1e6:.1f} MB to the GPU a sample), "
              f"decode='host' {host['rate']:.1f} samples/s ({host['kind']}): {speed:.2f}x", flush=True)
        print(f"  CPU {label}: daemon {1e3 * cpu_dev:.1f} ms a sample on the device path, {1e3 * cpu_host:.1f} on the host path: "
              f"{cpu_dev / max(cpu_host, 1e-9):.3f}x", flush=True)
        print(f"  BYTES {label}: {h2d / 1e6:.2f} MB to the GPU a sample ({d.get('compressed_bytes', 0) / nall / 1e6:.2f} compressed "
              f"by the device path, {d.get('host_path_bytes', 0) / nall / 1e6:.2f} decoded by the host, of which "
              f"{d.get('host_share_bytes', 0) / nall / 1e6:.2f} the device could have taken), "
              f"{comp / 1e6:.2f} MB compressed read a sample: {h2d / max(comp, 1):.3f}x", flush=True)
        print(f"  STAGES {label} (device path, ms a sample, summed over fills): {stage_line(d)}", flush=True)
        # The Loader's default keeps 2 batches in flight; 4 shows whether
        # the device path waits on its own latency.
        deep = epoch_rate(a, "rate-dev4", "device", daemon_cores, prefetch=4)
        print(f"  DEPTH {label}: decode='device' with prefetch=4 {deep['rate']:.1f} samples/s "
              f"({deep['rate'] / host['rate']:.2f}x the host path); stages: {stage_line(deep['delivery'])}", flush=True)
        summary.append(f"{label}: device/host first epoch {speed:.2f}x (target >= {target:g}x), "
                       f"to the GPU/compressed {h2d / max(comp, 1):.3f}x (target <= 1.1x), "
                       f"daemon CPU device/host {cpu_dev / max(cpu_host, 1e-9):.3f}x (target <= 0.15x)")
    os.sched_setaffinity(0, set(range(ncpu)))
    for line in summary:
        print("MEASURE " + line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("zarrfs")
    ap.add_argument("store")
    ap.add_argument("view")
    ap.add_argument("scratch")
    ap.add_argument("--parts", default="equal,reader,daemon,rate")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--trust-unchecked", action="store_true", help="mount with --gpu-trust-unchecked")
    ap.add_argument("--gpu-kernels", help="mount with --gpu-kernels FILE: kernels compiled from kernels.cu")
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    if a.trust_unchecked:
        EXTRA["gpu_trust_unchecked"] = True
    if a.gpu_kernels:
        EXTRA["gpu_kernels"] = os.path.abspath(a.gpu_kernels)
    a.zarrfs = os.path.abspath(a.zarrfs)
    os.makedirs(a.scratch, exist_ok=True)
    parts = a.parts.split(",")
    if DEVICE == "cuda":
        torch.cuda.init()
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, {os.cpu_count()} cores", flush=True)
    n = 0
    if "equal" in parts or "reader" in parts:
        m = start(a.zarrfs, a.store, a.view, a.scratch, "check")
        try:
            n = len(zarrfs.SampleDir(os.path.join(m.path, "train")))
            if "equal" in parts:
                part_equal(a, m, n)
            if "reader" in parts:
                part_reader(a, m)
        finally:
            m.stop()
    if "daemon" in parts:
        part_daemon(a)
    if "rate" in parts:
        part_rate(a)
    print(f"{len(failed)} checks failed" if failed else "all checks passed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
