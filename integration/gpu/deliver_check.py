#!/usr/bin/env python3
"""Device delivery on a GPU machine: zarrfs.torch.Loader(decode="device")
against decode="host" over the same samples of the ERA5-like view.

Usage: deliver_check.py ZARRFS STORE VIEW SCRATCH [--parts equal,reader,daemon,rate,dali,second,warm,damage] [--trust-unchecked]
       [--gpu-kernels FILE] [--chunkdamage FILE] [--damage-seeds 2]

  equal   every batch of decode="device" equals decode="host" byte for byte
          (same shuffled order, compared on the GPU), and a few samples equal
          numpy.load of the mount's files; the ring is device memory
          (path 'ring-cuda'); status counts the samples and bytes; the
          same for 32 samples of the arrays t, t2m and sst (a step of a chunk of 4)
  reader  a reader killed with SIGKILL frees its ring: status shows none
          open, and the daemon's GPU memory (nvidia-smi) drops by the ring
  daemon  a daemon killed mid-epoch makes the Loader raise DeliveryError,
          not hang; a daemon started again serves a new Loader
  rate    first epoch, cold mount (its own cache), batch 4: samples/s of
          decode="device" and decode="host", daemon on cores 0-3 (taskset)
          and the Loader on 8-15, then on every core
  dali    zarrfs.dali.ring_reader in a GPU pipeline: two shuffled epochs
          equal numpy.load of the Loader's files, and the first epoch's
          rate of a cold mount against Loader(decode="device"); skipped
          (a SKIP line) where DALI is not installed
  second  the second epoch from the compressed cache: `zarrfs warm
          --compressed` of the view's chunks, a mount of that cache whose
          --cache-size holds the chunks but not the decoded samples, and
          Loader(decode="device") epochs over it (the device path writes no
          decoded file: status shows every chunk read from the tier, no blob
          kept), against Loader(decode="host") over a mount of decoded
          blobs warmed the usual way (samples/s of each one's second
          epoch); and decode="host" from the compressed tier alone, each
          blob decoded from it as read, for reference; every core
  warm    the warm host path against its limit: the view's decoded blobs
          copied to plain files on the same filesystem; the reference
          reader (threads pread whole samples into pinned buffers, one
          asynchronous copy each to the GPU, batch 4) and
          Loader(decode="host"), each over the plain files and over the
          mount, rounds interleaved (medians); then a profiled Loader
          epoch (Loader(profile=True)) over each: where its time goes
  damage  a store of its own (STORE and VIEW unused: "-" will do) with
          blosc-lz4, zstd with a checksum and zstd without, a chunk a
          sample, whose chunks chunkdamage damages with every kind of the
          decoders' damage suite (internal/damage): each sample through
          decode="device" against the file of a mount decoding on the CPU.
          A sample the CPU rejects raises an OSError naming its file and
          chunk; every other sample equals the CPU's bytes, except that
          under --gpu-trust-unchecked (a second mount, the zstd array
          without checksums) damaged chunks may decode to other bytes or
          none of an error: counted, as the opt-in allows. An epoch hands
          out the batches before the first damaged one, then raises.

--trust-unchecked mounts with --gpu-trust-unchecked (the mixed store: its
zstd frames have no checksum, and decode on the GPU only with it).

--gpu-kernels FILE mounts with the kernels of FILE (kernels.cu compiled by
deliver.sh) instead of the binary's.

--chunkdamage FILE is the chunkdamage binary (CGO_ENABLED=0 go build
./integration/gpu/chunkdamage), by default beside ZARRFS.

Environment: DELIVER_PROFILE_DIR=DIR writes the daemon's Go CPU profile of
each rate epoch there, and DELIVER_TRACE=1 also its execution trace of the
device path's epoch on all cores (go tool trace -pprof=sync); DELIVER_DEPTH
is the DEPTH line's prefetch (default 2, one fill fewer than the Loader's
default on a ring); DELIVER_GPU_MEMORY and
DELIVER_PINNED_MEMORY the mounts' --gpu-memory and --pinned-memory.

Prints one line per check ("PASS ...", "FAIL ..." or "SKIP ...") and RATE, CPU, BYTES,
STAGES, STEADY, FIRST (the device path's first batch: the wait for its request, the
fill and its stages, the reply's way to the trainer), ROUTE (the ring's router, where
a fill had chunks of large parts), DEPTH, PROFILE and MEASURE lines for the rates;
exits 1 when a check failed.
"""

import argparse
import datetime
import gc
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import zarrfs
from zarrfs._deliver import DeliveryError
from zarrfs.loader import Loader, _torch_dtype

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


def part_equal(a, m, ref, n):
    """Loader(decode='device') over mount m against decode='host' over ref,
    a mount of the same store with a cache of its own: the device path
    copies a sample whose file its cache holds (one read before) rather
    than decode it, so the files read for reference must not be m's."""
    d, rd = os.path.join(m.path, "train"), os.path.join(ref.path, "train")
    dev = Loader(d, 4, device=DEVICE, decode="device", shuffle=True, seed=3)
    host = Loader(rd, 4, device=DEVICE, decode="host", shuffle=True, seed=3)
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
    ok = all(np.array_equal(x[i].cpu().numpy(), np.load(rd + f[len(d):])) for i, f in enumerate(c["file"]))
    check(ok and c["file"] == files, "equal: ring batches equal numpy.load of the mount's files")
    del it, x
    dev.close()
    st = status(a.zarrfs, m)["delivery"]
    print(f"  status: {json.dumps({k: v for k, v in st.items() if k != 'rings'})}", flush=True)
    per = (st["compressed_bytes"] + st["host_path_bytes"]) / max(1, st["device_samples"] + st["host_samples"])
    print(f"  to the GPU per sample: {per / 1e6:.1f} MB ({st['device_samples']} device path, {st['host_samples']} host path samples)", flush=True)
    # Arrays' samples (a sample of t: its 4 levels, one chunk; of t2m: one
    # chunk; of sst, where the store has it: a step of a chunk of 4) go
    # through the same ring path, read straight into the slot.
    for arr in ("t", "t2m", "sst"):
        d = os.path.join(m.path, arr)
        if not os.path.isdir(d):
            continue
        dev = Loader(d, 4, device=DEVICE, decode="device", shuffle=True, seed=5)
        host = Loader(os.path.join(ref.path, arr), 4, device=DEVICE, decode="host", shuffle=True, seed=5)
        same, got, want = True, 0, min(32, len(zarrfs.SampleDir(d)))
        for (x, cx), (y, cy) in zip(dev, host):
            got += len(x)
            if cx["index"].tolist() != cy["index"].tolist() or not torch.equal(x, y):
                same = False
                print(f"  {arr}: samples {cx['index'].tolist()} differ", flush=True)
            if got >= want:
                break
        dev.close()
        host.close()
        after = status(a.zarrfs, m)["delivery"]
        print(f"  {arr}: {after['device_samples'] - st['device_samples']} samples on the device path, "
              f"{(after['compressed_bytes'] - st['compressed_bytes']) / 1e6:.1f} MB compressed and "
              f"{(after['host_path_bytes'] - st['host_path_bytes']) / 1e6:.1f} MB decoded on the host to the GPU", flush=True)
        check(same and got >= want, f"equal: {got} samples of array {arr} through decode='device' equal decode='host' byte for byte")
        st = after
    check(st["errors"] == 0 and st["cached_samples"] == 0, "equal: no fill failed, and every sample was decoded (none copied from the cache)")
    # The Loader's default takes the ring on the cold mount; once the cache
    # holds its share (its files read, as a warm run meanwhile would), its
    # next epoch reads the files, equal to the ring's batches, and the ring
    # goes with the batches over it.
    d = os.path.join(m.path, "t2m")
    x = y = None  # the last batches above hold their rings (on a GPU) until they go
    gc.collect()
    if os.path.isdir(d):
        auto_rings = Loader._AUTO_RINGS
        Loader._AUTO_RINGS = ("cuda", "host")  # the test mode's ring as a GPU's
        try:
            auto = Loader(d, 4, device=DEVICE)
        finally:
            Loader._AUTO_RINGS = auto_rings
        kinds = [auto.path_kind]
        ring = [x.cpu() for x, _ in auto]
        for f in auto.dir.files:
            np.load(f)
        got = [x.cpu() for x, _ in auto]
        kinds.append(auto.path_kind)
        auto.close()
        del auto
        deadline = time.time() + 10
        while status(a.zarrfs, m)["delivery"]["rings_open"] and time.time() < deadline:
            gc.collect()
            time.sleep(0.1)
        left = status(a.zarrfs, m)["delivery"]["rings_open"]
        want = ["ring-cuda", "pread-pinned-h2d"] if DEVICE == "cuda" else ["ring-host", "pread"]
        same = len(ring) == len(got) > 0 and all(torch.equal(x, y) for x, y in zip(ring, got))
        check(kinds == want and same and left == 0,
              f"equal: the Loader's default over t2m reads {' then '.join(kinds)} (the ring cold, the files once the cache "
              f"holds them), {len(got)} batches equal, {left} rings left open")


_READER = """
import sys, time
from zarrfs.loader import Loader, _torch_dtype
l = Loader(sys.argv[1], 4, device=sys.argv[2], decode="device")
it = iter(l)
next(it)
print("ready", l._dring.ring_bytes, flush=True)
time.sleep(300)
"""


def part_dali(a, m, ref_m, n):
    """zarrfs.dali.ring_reader in a DALI pipeline on the GPU: two shuffled
    epochs, every batch equal to numpy.load of the files the Loader reads
    for the same seed and epoch; then the first epoch's rate of a cold
    mount against Loader(decode='device'). Skipped, and said so, where
    DALI is not installed."""
    try:
        from nvidia.dali import pipeline_def
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
        import zarrfs.dali
    except ImportError as e:
        print(f"SKIP dali: DALI is not installed here ({e}): zarrfs.dali.ring_reader is not checked on this GPU", flush=True)
        return
    d = os.path.join(m.path, "train")
    gpu = DEVICE == "cuda"

    def iterator(path):
        @pipeline_def(batch_size=4, num_threads=2, device_id=torch.cuda.current_device() if gpu else None)
        def pipe():
            return zarrfs.dali.ring_reader(path, device="gpu" if gpu else "cpu", shuffle=True, seed=7)
        return DALIGenericIterator([pipe()], ["x"])

    it = iterator(d)
    rd = os.path.join(ref_m.path, "train")  # not m's files: they would be copied into the ring, not decoded
    ref = Loader(rd, 4, device="cpu", decode="host", shuffle=True, seed=7)
    same, seen = True, 0
    for e in range(2):
        ref.set_epoch(e)
        want = [c["file"] for _, c in ref]
        got = [b[0]["x"].cpu().numpy() for b in it]
        it.reset()
        seen += sum(len(b) for b in got)
        same &= len(got) == len(want) and all(b.tobytes() == np.stack([np.load(f) for f in files]).tobytes()
                                              for b, files in zip(got, want))
    del it
    check(same and seen == 2 * n, f"dali: ring_reader's {seen} samples over two shuffled epochs equal numpy.load of the Loader's files")
    rates = {}
    for name in ("dali", "loader"):
        mm = start(a.zarrfs, a.store, a.view, a.scratch, "rate-" + name)
        try:
            path = os.path.join(mm.path, "train")
            t0, got = time.perf_counter(), 0
            if name == "dali":
                for b in iterator(path):
                    got += len(b[0]["x"])
            else:
                for x, _ in Loader(path, 4, device=DEVICE, decode="device"):
                    got += len(x)
            sync()
            rates[name] = got / (time.perf_counter() - t0)
        finally:
            mm.stop()
    print(f"RATE dali: first epoch, cold mount, batch 4: ring_reader {rates['dali']:.1f} samples/s, "
          f"Loader(decode='device') {rates['loader']:.1f}: {rates['dali'] / rates['loader']:.2f}x", flush=True)


def gpu_total():
    """MiB of memory in use on this process's GPU (nvidia-smi: every
    process's), or None without a GPU or nvidia-smi."""
    if DEVICE != "cuda":
        return None
    from zarrfs._deliver import pci_bus_id
    bus = pci_bus_id(torch.cuda.current_device())[-7:]  # "3b:00.0": nvidia-smi pads the domain otherwise
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True)
    except FileNotFoundError:
        return None
    for line in out.stdout.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 2 and f[0].lower().endswith(bus) and f[1].isdigit():
            return int(f[1])
    return None


def slack(ring_mib):
    """MiB a reading may exceed another's and count as the same level:
    what nvidia-smi's rounding and a context's small allocations move, far
    below a ring."""
    return max(64, ring_mib // 10)


def part_reader(a, m):
    """A trainer killed with SIGKILL mid-epoch (fills in flight): the
    daemon notices (its socket closes), frees the ring, and its GPU memory
    drops by the ring and leaves nothing outside the daemon; a new Loader
    starts cleanly."""
    pid = m._proc.pid
    before, total_before = gpu_mem(pid), gpu_total()
    p = subprocess.Popen([sys.executable, "-c", _READER, os.path.join(m.path, "train"), DEVICE], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    check(line[:1] == ["ready"], "reader: a reader took a batch from its ring")
    ring = int(line[1]) if len(line) > 1 else 0
    st = status(a.zarrfs, m)["delivery"]
    with_ring, total_with = gpu_mem(pid), gpu_total()
    check(st["rings_open"] == 1 and st["ring_bytes"] == ring, f"reader: status shows its ring ({ring >> 20} MiB)")
    p.kill()
    p.wait()
    deadline = time.time() + 15
    while status(a.zarrfs, m)["delivery"]["rings_open"] and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    st = status(a.zarrfs, m)["delivery"]
    after, total_after = gpu_mem(pid), gpu_total()
    check(st["rings_open"] == 0 and st["ring_bytes"] == 0, "reader: killed, its ring is freed (status)")
    print(f"  daemon GPU memory (nvidia-smi, MiB): before {before}, with the ring {with_ring}, after the reader died {after}; "
          f"the GPU's: {total_before}, {total_with}, {total_after}", flush=True)
    if with_ring is not None and after is not None:
        tol = slack(ring >> 20)
        check(with_ring - after >= (ring >> 20) * 0.9, "reader: the daemon's GPU memory drops by the ring (nvidia-smi)")
        # The rounds the reader's fills used stay with the daemon until
        # --gpu-idle (bounded by --gpu-memory), so its own level may rise;
        # what must not stay is anything outside it.
        budget = gpu_memory_mib()
        check(after <= budget + tol, f"reader: the daemon's GPU memory stays within --gpu-memory once the ring is freed "
                                     f"({after} MiB, --gpu-memory {budget} MiB, within {tol})")
        check(total_after - after <= total_before - (before or 0) + tol,
              f"reader: no GPU memory is left outside the daemon (the killed reader's context and mapping are gone: "
              f"{total_after - after} MiB against {total_before - (before or 0)}, within {tol})")
    else:
        print("  nvidia-smi shows no per-process memory here: the status check stands alone", flush=True)
    n = sum(len(c["index"]) for _, c in Loader(os.path.join(m.path, "train"), 4, device=DEVICE, decode="device"))
    check(n > 0, "reader: the next Loader starts cleanly")


def part_daemon(a):
    """The daemon killed with SIGKILL mid-epoch: the Loader raises
    DeliveryError at once, not a hang; the device memory of the ring is
    not left behind once the Loader noticed (nvidia-smi, the whole GPU,
    against its reading before the daemon started; the Loader is kept,
    its epoch dropped); a daemon started again serves a new Loader, and
    once it stops the GPU is back to that level."""
    total0 = gpu_total()
    m = start(a.zarrfs, a.store, a.view, a.scratch, "daemon")
    l = Loader(os.path.join(m.path, "train"), 4, device=DEVICE, decode="device", timeout=60)
    ring_mib = l._dring.ring_bytes >> 20
    it = iter(l)
    next(it)
    total1, daemon1 = gpu_total(), gpu_mem(m._proc.pid)
    os.kill(m._proc.pid, signal.SIGKILL)
    t0 = time.time()
    err = None
    signal.alarm(120)  # a hang fails the whole script, loudly
    try:
        # The ring may hold the rest of a short epoch already: later
        # epochs ask the dead daemon.
        drain(it)
        for _ in range(100):
            drain(l)
    except DeliveryError as e:
        err = e
    signal.alarm(0)
    took = time.time() - t0
    check(err is not None and took < 30, f"daemon: killed mid-epoch, the Loader raised in {took:.1f} s: {err}")
    err = None  # its traceback holds the epoch
    time.sleep(1)
    total2 = gpu_total()
    del it
    gc.collect()
    time.sleep(1)
    total3 = gpu_total()
    l.close()
    try:
        m.stop()
    except zarrfs.MountError:
        pass
    m2 = start(a.zarrfs, a.store, a.view, a.scratch, "daemon")
    n = sum(len(c["index"]) for _, c in Loader(os.path.join(m2.path, "train"), 4, device=DEVICE, decode="device"))
    check(n > 0, "daemon: a daemon started again serves a new Loader")
    m2.stop()
    gc.collect()
    time.sleep(1)
    total4 = gpu_total()
    print(f"  the GPU's memory in use (nvidia-smi, MiB): before the daemon {total0}, with its ring of {ring_mib} MiB {total1} "
          f"(the daemon {daemon1}), killed and the Loader raised {total2}, its epoch dropped {total3}, "
          f"after a second daemon served and stopped {total4}", flush=True)
    if total0 is None or total3 is None or total4 is None:
        print("  nvidia-smi reads no GPU here: the memory checks are skipped", flush=True)
        return
    tol = slack(ring_mib)
    check(total3 <= total0 + tol, f"daemon: killed, no device memory is left behind once the Loader noticed "
                                  f"({total3} MiB against {total0} before, within {tol})")
    check(total4 <= total0 + tol, f"daemon: after a second daemon served and stopped, the GPU is back to its level "
                                  f"({total4} MiB against {total0}, within {tol})")


def drain(batches):
    """Takes every batch and keeps none: a batch kept (a loop variable left
    bound) keeps its ring's mapping open, as it must for a user."""
    for _ in batches:
        pass


def gpu_memory_mib():
    """The mounts' --gpu-memory in MiB (mount_flags)."""
    v = os.environ.get("DELIVER_GPU_MEMORY", "8GiB")
    units = {"GiB": 1024, "MiB": 1}
    for u, f in units.items():
        if v.endswith(u):
            return int(float(v[:-len(u)]) * f)
    return int(v) >> 20


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def cpu_seconds(pid):
    """User and system CPU seconds process pid has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def epoch_rate(a, name, decode, cores, prefetch=None):
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
        if os.environ.get("DELIVER_TRACE") and decode == "device" and cores is None and prefetch is None:
            # And its Go execution trace (go tool trace -pprof=sync): where
            # the device path's fills wait.
            flags["trace"] = flags["cpuprofile"][:-len(".prof")] + ".trace"
    m = start(a.zarrfs, a.store, a.view, a.scratch, name, cores, **flags)
    try:
        l = Loader(os.path.join(m.path, "train"), 4, device=DEVICE, decode=decode, prefetch=prefetch)
        sync()
        cpu0 = cpu_seconds(m._proc.pid)
        t0, wall0 = time.perf_counter(), time.time()
        got, first = 0, None
        for x, _ in l:
            x.sum()  # the trainer reads the batch
            got += len(x)
            if first is None:
                # From here on the ring is open (its memory pinned) and
                # the first fill done: what every later batch costs.
                sync()
                first = (got, time.perf_counter(), cpu_seconds(m._proc.pid))
                first_wall = time.time()
        sync()
        t1 = time.perf_counter()
        cpu1 = cpu_seconds(m._proc.pid)
        st = status(a.zarrfs, m)
        l.close()
        n1, tf, cf = first or (got, t1, cpu1)
        return dict(rate=got / (t1 - t0), kind=l.path_kind, samples=got, cpu=cpu1 - cpu0, delivery=st.get("delivery") or {},
                    pinned=(st.get("decode") or {}).get("gpu_pinned_bytes", 0),
                    pinned_by_use=(st.get("decode") or {}).get("gpu_pinned") or {},
                    fetched=(st.get("source_reads") or {}).get("bytes_fetched", 0),
                    steady_rate=(got - n1) / max(t1 - tf, 1e-9), steady_cpu=(cpu1 - cf) / max(got - n1, 1),
                    first_batch=tf - t0, first_fill=first_fill(st, wall0, first_wall if first else None),
                    route=(((st.get("delivery") or {}).get("rings") or [{}])[-1]).get("route"))
    finally:
        m.stop()


def first_fill(st, wall0, wall1):
    """Where the first batch's time went (its ring's first_fill in the
    status): ms from the epoch's start to the daemon's first fill request,
    the fill, and from its end to the batch in the trainer's hands (the
    reply, the slot's tensor, the trainer's first kernel); and the fill's
    stages, ms. None when the mount served no ring."""
    rings = (st.get("delivery") or {}).get("rings") or []
    ff = rings[-1].get("first_fill") if rings else None
    if not ff or wall1 is None:
        return None
    began = datetime.datetime.fromisoformat(ff["began"].replace("Z", "+00:00")).timestamp()
    fill = ff["stages_s"].get("fill", 0)
    return dict(before=began - wall0, fill=fill, after=wall1 - began - fill,
                stages={k: v for k, v in ff["stages_s"].items() if v >= 0.0005})


def first_line(f):
    if not f:
        return "no ring"
    st = ", ".join(f"{k} {1e3 * v:.0f}" for k, v in f["stages"].items() if k != "fill")
    return (f"to its request {1e3 * f['before']:.0f} ms, the fill {1e3 * f['fill']:.0f} ms ({st}), "
            f"reply to the trainer's hands {1e3 * f['after']:.0f} ms")


def pinned_line(p):
    """The daemon's pinned memory by use (its status: gpu_pinned), MiB."""
    mib = {k: p.get(k, 0) / 2**20 for k in ("staging_bytes", "pool_bytes", "lent_peak_bytes", "unpinned_bytes")}
    return (f"staging {mib['staging_bytes']:.0f}, pool {mib['pool_bytes']:.0f} of which at most "
            f"{mib['lent_peak_bytes']:.0f} lent at once; {mib['unpinned_bytes']:.0f} lent unpinned (the pool had no room)")


def stage_line(d):
    """The device path's stages, ms a sample (summed over fills)."""
    n = max(1, d.get("device_samples", 0) + d.get("host_samples", 0))
    st = d.get("stages_s") or {}
    order = ["fill", "read", "consumer_wait", "host_checks", "device_wait", "h2d", "decode", "kernels", "d2h",
             "host_decode", "upload", "host_path", "host_share"]
    return ", ".join(f"{k} {1e3 * st.get(k, 0) / n:.1f}" for k in order)


def part_rate(a):
    """The device-delivery measures (BENCHMARKS.md), per core count: first-epoch
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
              f"{cpu_dev / max(cpu_host, 1e-9):.3f}x; pinned host memory at the epoch's end {dev['pinned'] / 2**20:.0f} / "
              f"{host['pinned'] / 2**20:.0f} MiB (the device path's: {pinned_line(dev['pinned_by_use'])})", flush=True)
        print(f"  BYTES {label}: {h2d / 1e6:.2f} MB to the GPU a sample ({d.get('compressed_bytes', 0) / nall / 1e6:.2f} compressed "
              f"by the device path, {d.get('host_path_bytes', 0) / nall / 1e6:.2f} decoded by the host, of which "
              f"{d.get('host_share_bytes', 0) / nall / 1e6:.2f} the device could have taken), "
              f"{comp / 1e6:.2f} MB compressed read a sample: {h2d / max(comp, 1):.3f}x", flush=True)
        print(f"  STAGES {label} (device path, ms a sample, summed over fills): {stage_line(d)}", flush=True)
        print(f"  STEADY {label}: from the first batch on (the ring opened, its memory pinned, the first fill done): "
              f"decode='device' {dev['steady_rate']:.1f} samples/s, daemon {1e3 * dev['steady_cpu']:.1f} ms a sample, "
              f"first batch {1e3 * dev['first_batch']:.0f} ms; "
              f"decode='host' {host['steady_rate']:.1f}, {1e3 * host['steady_cpu']:.1f}, {1e3 * host['first_batch']:.0f} ms: "
              f"{dev['steady_rate'] / max(host['steady_rate'], 1e-9):.2f}x, CPU {dev['steady_cpu'] / max(host['steady_cpu'], 1e-9):.3f}x",
              flush=True)
        print(f"  FIRST {label}: the device path's first batch: {first_line(dev['first_fill'])}", flush=True)
        if dev["route"]:
            r = dev["route"]
            wait = f"{1e3 * r['device_wait_s']:.0f} ms" if r['device_wait_s'] else "not measured"
            print(f"  ROUTE {label}: {r['fills_with_large_parts']} fills with chunks of large parts, {r['fills_all_on_host']} of them "
                  f"all on the host; such chunks {r['large_chunks_on_host']} on the host, {r['large_chunks_on_device']} on the device; "
                  f"the device's wait for them {wait}, the host's rate {r['host_bytes_per_s'] / 1e9:.2f} GB/s",
                  flush=True)
        # The Loader's default keeps 3 fills in flight on a ring; 2 (or
        # DELIVER_DEPTH) shows what the default's depth gains, or whether
        # the device path waits on its own latency.
        depth = int(os.environ.get("DELIVER_DEPTH", "2"))
        deep = epoch_rate(a, "rate-depth", "device", daemon_cores, prefetch=depth)
        print(f"  DEPTH {label}: decode='device' with prefetch={depth} {deep['rate']:.1f} samples/s "
              f"({deep['rate'] / host['rate']:.2f}x the host path); stages: {stage_line(deep['delivery'])}", flush=True)
        summary.append(f"{label}: device/host first epoch {speed:.2f}x (target >= {target:g}x), "
                       f"to the GPU/compressed {h2d / max(comp, 1):.3f}x (target <= 1.1x), "
                       f"daemon CPU device/host {cpu_dev / max(cpu_host, 1e-9):.3f}x (target <= 0.15x)")
    os.sched_setaffinity(0, set(range(ncpu)))
    for line in summary:
        print("MEASURE " + line, flush=True)



def zarrfs_cmd(a, *args):
    """Runs zarrfs ARGS; prints its summary line (the last line on stderr
    that starts with "zarrfs:")."""
    p = subprocess.run([a.zarrfs, *args], capture_output=True, text=True)
    said = [line for line in p.stderr.splitlines() if line.startswith("zarrfs:")]
    if p.returncode != 0:
        raise RuntimeError(f"zarrfs {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-2000:]}")
    if said:
        print("  " + said[-1], flush=True)
    return p.stdout


def warm_cache(a, name, compressed):
    """The view's samples warmed into cache-NAME (decoded blobs, or with
    compressed their compressed chunks only); warm is idempotent, so a
    cache the other part warmed costs nothing. Returns the cache."""
    cache = os.path.join(a.scratch, "cache-" + name)
    args = ["warm", a.store, "--cache", cache, "--view", a.view, "--only", "train", "--decode", "cpu"]
    zarrfs_cmd(a, *(args + (["--compressed"] if compressed else [])))
    return cache


def mount_cache(a, name, cache, **flags):
    """A mount of the view on an existing cache (start() makes a fresh one)."""
    m = zarrfs.Mount(a.store, os.path.join(a.scratch, "mnt-" + name), **mount_flags(a.view, cache), **flags)
    m.start()
    return m


def loader_epochs(d, decode, epochs, profile=False, after_first=False):
    """samples/s of each of epochs epochs of one Loader (batch 4) over
    directory d, the trainer reading every batch; after_first times each
    epoch from its first batch on (the loader's setup and its first batch
    left out). Returns (rates, the loader's path, its stages)."""
    l = Loader(d, 4, device=DEVICE, decode=decode, profile=profile)
    rates = []
    try:
        for _ in range(epochs):
            sync()
            t0, got, first = time.perf_counter(), 0, after_first
            for x, _ in l:
                x.sum()  # the trainer reads the batch
                if first:
                    sync()
                    t0, first = time.perf_counter(), False
                else:
                    got += len(x)
            sync()
            rates.append(got / (time.perf_counter() - t0))
        return rates, l.path_kind, l.stages()
    finally:
        l.close()


def first_batch(d, decode):
    """The first batch of directory d in order, as CPU bytes."""
    l = Loader(d, 4, device=DEVICE, decode=decode, copy=True)
    try:
        x, _ = next(iter(l))
        return x.cpu()
    finally:
        l.close()


def cache_tiers(a, cache):
    """(blob files, chunk bytes) a cache holds (zarrfs status --cache)."""
    d = json.loads(zarrfs_cmd(a, "status", "--cache", cache, "--json"))
    d = d[0] if isinstance(d, list) else d
    return d["blobs"], d["chunk_bytes"]


def part_second(a):
    """The second epoch from the compressed cache: zarrfs warm --compressed
    of the view's chunks, a mount of it whose budget holds the compressed
    chunks but not the decoded samples, Loader(decode='device') epochs (the
    device path writes no decoded file), against a Loader(decode='host')
    epoch over a mount of decoded blobs warmed the usual way; then the host
    path from the compressed tier alone (its first epoch: every blob decoded
    from the tier and written), for reference. Every core."""
    ncpu = os.cpu_count() or 1
    os.sched_setaffinity(0, set(range(ncpu)))
    blobs_cache = warm_cache(a, "blobs", compressed=False)
    m = mount_cache(a, "second-blobs", blobs_cache)
    try:
        d = os.path.join(m.path, "train")
        n, sample = len(zarrfs.SampleDir(d)), zarrfs.SampleDir(d).sample_nbytes
        want = first_batch(d, "host")
        blob_rates, blob_kind, _ = loader_epochs(d, "host", 2)
    finally:
        m.stop()
    comp_cache = warm_cache(a, "compressed", compressed=True)
    nblobs, chunk_bytes = cache_tiers(a, comp_cache)
    decoded = n * sample
    budget = int(chunk_bytes * 1.25)
    check(nblobs == 0 and chunk_bytes > 0 and budget < decoded,
          f"second: the compressed cache holds {chunk_bytes / 1e9:.2f} GB of chunks and no decoded file; its mount's "
          f"--cache-size {budget / 1e9:.2f} GB holds them but not the {decoded / 1e9:.2f} GB of decoded samples")
    m = mount_cache(a, "second-compressed", comp_cache, cache_size=str(budget))
    try:
        d = os.path.join(m.path, "train")
        got = first_batch(d, "device")
        check(torch.equal(got, want), "second: the device path's first batch from the compressed cache equals the decoded blobs'")
        dev_rates, dev_kind, _ = loader_epochs(d, "device", 2)
        st = status(a.zarrfs, m)
    finally:
        m.stop()
    c, dl, src = st["cache"], st.get("delivery") or {}, st.get("source_reads") or {}
    print(f"  second: device path status: cache {json.dumps({k: c[k] for k in ('blob_files', 'chunk_files', 'chunk_hits', 'chunk_misses', 'evictions')})}, "
          f"source bytes fetched {src.get('bytes_fetched', 0)}, device-path samples {dl.get('device_samples', 0)}, "
          f"host-path samples {dl.get('host_samples', 0)}", flush=True)
    check(c["blob_files"] == 0 and c["chunk_misses"] == 0 and c["chunk_hits"] > 0 and c["evictions"] == 0,
          "second: the device path read every chunk from the compressed tier and kept no decoded file")
    m = mount_cache(a, "second-host", comp_cache)
    try:
        host_rates, _, _ = loader_epochs(os.path.join(m.path, "train"), "host", 1, after_first=True)
        hst = status(a.zarrfs, m)["cache"]
    finally:
        m.stop()
    print(f"  second: host path from the tier: chunk hits {hst['chunk_hits']}, misses {hst['chunk_misses']}, "
          f"blobs written {hst['blob_files']}", flush=True)
    blob, dev, host = blob_rates[-1], dev_rates[-1], host_rates[0]
    print(f"RATE second, {ncpu} cores, batch 4, {n} samples: decode='device' ({dev_kind}) from the compressed cache "
          f"{' / '.join(f'{r:.1f}' for r in dev_rates)} samples/s (epochs 1 / 2); decode='host' over warm decoded blobs "
          f"({blob_kind}) {' / '.join(f'{r:.1f}' for r in blob_rates)}; decode='host' from the compressed tier "
          f"(blobs decoded and written as read, timed from its first batch) {host:.1f}", flush=True)
    print(f"MEASURE second epoch from the compressed cache, {ncpu} cores: device path {dev:.1f} / warm decoded-blob "
          f"Loader epoch {blob:.1f} samples/s = {dev / blob:.2f}x (target >= 0.8x); host path from the compressed tier "
          f"{host:.1f} = {host / blob:.2f}x", flush=True)


class RefReader:
    """The plain reader a loader is held against: threads pread whole
    samples into pinned buffers of their own (on the CPU, straight into the
    batch), each followed by one asynchronous copy into its batch on the
    GPU, batch after batch with enough in flight to keep every thread busy;
    the consumer takes the batches in order as the Loader's does. Its
    buffers are made once, outside the epochs timed."""

    def __init__(self, nbytes, threads, batch=4):
        self.nbytes, self.threads, self.batch = nbytes, threads, batch
        self.depth = -(-threads // batch) + 1
        self.free = queue.Queue()
        self.bufs, self.streams = [], []
        for i in range(threads):
            if DEVICE == "cuda":
                self.bufs.append(torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))
                self.streams.append(torch.cuda.Stream())
            self.free.put(i)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="ref")

    def close(self):
        self.pool.shutdown()

    def _one(self, path, offset, dst):
        fd = os.open(path, os.O_RDONLY)
        try:
            if DEVICE != "cuda":
                read_full(fd, memoryview(dst.numpy()), offset)
                return None
            i = self.free.get()
            s = self.streams[i]
            s.synchronize()  # its last copy is done
            read_full(fd, memoryview(self.bufs[i].numpy()), offset)
            with torch.cuda.stream(s):
                dst.copy_(self.bufs[i], non_blocking=True)
                dst.record_stream(s)
                ev = torch.cuda.Event()
                ev.record(s)
            self.free.put(i)
            return ev
        finally:
            os.close(fd)

    def epoch(self, d):
        """samples/s of one pass over sample directory d, in order."""
        sd = zarrfs.SampleDir(d)
        files, off = sd.files, sd.data_offset
        batches = [files[i:i + self.batch] for i in range(0, len(files), self.batch)]
        dev = "cuda" if DEVICE == "cuda" else "cpu"
        inflight = []

        def submit(b):
            x = torch.empty((len(batches[b]), self.nbytes), dtype=torch.uint8, device=dev)
            inflight.append((x, [self.pool.submit(self._one, f, off, x[j]) for j, f in enumerate(batches[b])]))

        sync()
        t0 = time.perf_counter()
        for b in range(min(self.depth, len(batches))):
            submit(b)
        got = 0
        for b in range(len(batches)):
            x, futures = inflight.pop(0)
            for f in futures:
                ev = f.result()
                if ev is not None:
                    torch.cuda.current_stream().wait_event(ev)
            x.view(_torch_dtype(sd.dtype)).view((len(x),) + sd.sample_shape).sum()  # the trainer reads the batch
            got += len(x)
            del x
            if b + self.depth < len(batches):
                submit(b + self.depth)
        sync()
        return got / (time.perf_counter() - t0)


def read_full(fd, mv, offset):
    done = 0
    while done < len(mv):
        n = os.preadv(fd, [mv[done:]], offset + done)
        if n <= 0:
            raise OSError(5, f"short read at {offset + done}")
        done += n


def profile_line(st, per):
    """A profiled Loader epoch's stages (Loader.stages()), ms a sample."""
    keys = ["epoch", "consumer_wait", "submit", "slot_wait", "pin", "read_wait", "close", "h2d_issue", "put_wait",
            "open", "pread", "h2d_gpu"]
    return ", ".join(f"{k} {1e3 * st.get(k, 0) / per:.2f}" for k in keys)


def part_warm(a):
    """The warm host path against its limit: the view's decoded blobs
    copied to plain files on the same filesystem, read by the reference
    reader (RefReader) and by Loader(decode='host'), each over the plain
    files and over a mount of the warm cache, in interleaved rounds (the
    median of 3 after one untimed), the Loader's default (decode='auto',
    which reads the files where the cache holds every sample) and
    decode='device' (the ring, into which the daemon copies the samples the
    cache holds, whose batches must equal decode='host''s) over the mount
    against decode='host'; then
    where a profiled Loader epoch over the mount spends its time
    (Loader(profile=True)). Every core."""
    ncpu = os.cpu_count() or 1
    os.sched_setaffinity(0, set(range(ncpu)))
    cache = warm_cache(a, "blobs", compressed=False)
    m = mount_cache(a, "warm", cache)
    try:
        mnt = os.path.join(m.path, "train")
        st = status(a.zarrfs, m)
        plain = os.path.join(a.scratch, "plain", "train")
        subprocess.run(["rm", "-rf", os.path.dirname(plain)], check=True)
        os.makedirs(os.path.dirname(plain))
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", os.path.join(st["cache"]["blob_dir"], "train"), plain], check=True)
        subprocess.run(["cp", mnt + ".json", plain + ".json"], check=True)
        print(f"  warm: the view's blobs copied to plain files in {time.perf_counter() - t0:.1f} s; the mount passes reads "
              f"through (FUSE passthrough): {st['mount']['passthrough']}", flush=True)
        sd = zarrfs.SampleDir(mnt)
        threads = min(ncpu, 16)  # the Loader's default
        ref = RefReader(sd.sample_nbytes, threads)
        loaders = {}
        readers = {
            "ref-plain": lambda: ref.epoch(plain),
            "ref-mount": lambda: ref.epoch(mnt),
            "loader-plain": lambda: epoch_of(loaders, plain, False),
            "loader-mount": lambda: epoch_of(loaders, mnt, False),
            "auto-mount": lambda: epoch_of(loaders, mnt, False, decode="auto"),
            "ring-mount": lambda: epoch_of(loaders, mnt, False, decode="device"),
        }
        rates = {k: [] for k in readers}
        for rnd in range(4):
            for k, f in readers.items():
                r = f()
                if rnd:
                    rates[k].append(r)
        ref.close()
        auto_kind = loaders[(mnt, "auto")].path_kind
        for l in loaders.values():
            l.close()
        dl = status(a.zarrfs, m).get("delivery") or {}
        check(same_epoch(mnt), "warm: every batch of Loader(decode='device') over the warm mount equals decode='host''s")
        check(auto_kind.startswith("pread"), f"warm: the Loader's default reads the files of the warm mount ({auto_kind})")
        prof = {}
        for name, d in (("mount", mnt), ("plain", plain)):
            _, _, prof[name] = loader_epochs(d, "host", 2, profile=True)
    finally:
        m.stop()
    med = {k: float(np.median(v)) for k, v in rates.items()}
    for k, v in rates.items():
        print(f"  warm: {k}: {' / '.join(f'{r:.1f}' for r in v)} samples/s", flush=True)
    for name, p in prof.items():
        per = max(1.0, p.get("samples", 0))
        busy = (p.get("open", 0) + p.get("pread", 0)) / max(1e-9, p.get("threads", 1) * p.get("epoch", 1))
        print(f"  PROFILE loader over the {name} files (ms a sample, {int(per)} samples, the second epoch): "
              f"{profile_line(p, per)}; reader threads busy {busy:.2f} of the epoch; "
              f"{p.get('bytes', 0) / max(1e-9, p.get('pread', 1)) / 1e9:.2f} GB/s a thread in preads", flush=True)
    ratio = med["loader-mount"] / med["ref-plain"]
    print(f"RATE warm, {ncpu} cores, batch 4, {len(sd)} samples, medians: reference reader on plain files "
          f"{med['ref-plain']:.1f} samples/s, over the mount {med['ref-mount']:.1f} ({med['ref-mount'] / med['ref-plain']:.2f}x); "
          f"Loader over plain files {med['loader-plain']:.1f} ({med['loader-plain'] / med['ref-plain']:.2f}x), over the mount "
          f"{med['loader-mount']:.1f}", flush=True)
    print(f"MEASURE warm host path, {ncpu} cores: Loader(decode='host') over the warm mount {med['loader-mount']:.1f} / "
          f"pread->pinned->GPU reference on plain files {med['ref-plain']:.1f} samples/s = {ratio:.2f}x (target >= 0.9x)",
          flush=True)
    print(f"MEASURE warm mount, {ncpu} cores: the Loader's default (decode='auto', {auto_kind}: the cache holds every "
          f"sample) {med['auto-mount']:.1f} / decode='host' {med['loader-mount']:.1f} samples/s = "
          f"{med['auto-mount'] / med['loader-mount']:.2f}x; decode='device' (the ring: samples the cache holds copied by "
          f"the daemon, {dl.get('cached_samples', 0)} of {dl.get('host_samples', 0)} host-path and "
          f"{dl.get('device_samples', 0)} device-path samples) {med['ring-mount']:.1f} = "
          f"{med['ring-mount'] / med['loader-mount']:.2f}x", flush=True)
    subprocess.run(["rm", "-rf", os.path.dirname(plain)])


def epoch_of(loaders, d, profile, decode="host"):
    """One epoch of the Loader over d (made at its first use, kept)."""
    if (d, decode) not in loaders:
        loaders[(d, decode)] = Loader(d, 4, device=DEVICE, decode=decode, profile=profile)
    l = loaders[(d, decode)]
    sync()
    t0, got = time.perf_counter(), 0
    for x, _ in l:
        x.sum()
        got += len(x)
    sync()
    return got / (time.perf_counter() - t0)


def same_epoch(d):
    """Whether every batch of Loader(decode='device') over d equals
    decode='host''s, batch by batch."""
    lh = Loader(d, 4, device=DEVICE, decode="host")
    ld = Loader(d, 4, device=DEVICE, decode="device")
    try:
        n = 0
        for (x, _), (y, _) in zip(lh, ld):
            if not torch.equal(x, y):
                return False
            n += 1
        return n == len(lh)  # the ring's epoch as long as the files'
    finally:
        lh.close()
        ld.close()


# The damage part's store: one array a codec the device path takes, a
# chunk a sample (so a damaged chunk is one sample's): blosc-lz4 with byte
# shuffle in blocks of 8 KiB (several blocks and streams to cut, swap and
# misstate), which the host walks as the CPU decoder reads it; zstd with a
# content checksum, which the device hashes and the host compares; zstd
# without one, which decodes on the host unless --gpu-trust-unchecked.
DAMAGE_ARRAYS = {
    "blosc": ({"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4,
                                                  "blocksize": 8192}}, "blosc"),
    "zstd": ({"name": "zstd", "configuration": {"level": 3, "checksum": True}}, "zstd"),
    "zstdnc": ({"name": "zstd", "configuration": {"level": 3, "checksum": False}}, "zstd"),
}
DAMAGE_SAMPLE = (64, 128)  # float32: 32 KiB a sample


def damage_store(path, tool, seeds):
    """Writes the damage part's store at path and damages its chunks with
    chunkdamage: in each array every kind with every seed, one sample each,
    the first 8 samples and one before every two damaged ones undamaged. Returns the
    good values (sample i of every array holds good[i]) and, per array,
    each sample's damage ("KIND seed S", or None: undamaged or the kind
    does not apply to the chunk)."""
    import numcodecs
    from make_store import meta, write_json
    kinds = subprocess.run([tool, "-kinds"], capture_output=True, text=True, check=True).stdout.split()
    # Two batches of 4 undamaged first: an epoch must hand them out before
    # the error of a later batch, which fails faster than they fill.
    plan = [None] * 8
    for kind in kinds:
        for seed in range(seeds):
            if len(plan) % 3 == 0:
                plan.append(None)
            plan.append((kind, seed))
    plan.append(None)
    n = len(plan)
    yy, xx = np.mgrid[0:DAMAGE_SAMPLE[0], 0:DAMAGE_SAMPLE[1]].astype(np.float32)
    good = []
    for i in range(n):
        f = 250 + 30 * np.sin(yy / 9 + i) * np.cos(xx / 13 - i) + np.random.default_rng(i).normal(0, 0.5, DAMAGE_SAMPLE)
        good.append((np.round(f * 64) / 64).astype(np.float32))
    subprocess.run(["rm", "-rf", path])
    write_json(os.path.join(path, "zarr.json"), {"zarr_format": 3, "node_type": "group", "attributes": {}})
    lines, which = [], {}
    for name, (cfg, cname) in DAMAGE_ARRAYS.items():
        write_json(os.path.join(path, name, "zarr.json"), meta([n, *DAMAGE_SAMPLE], [1, *DAMAGE_SAMPLE], ["time", "y", "x"], cfg, {}))
        c = cfg["configuration"]
        enc = (numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=c["blocksize"])
               if cname == "blosc" else numcodecs.Zstd(level=3, checksum=c["checksum"]))
        for i in range(n):
            chunk = os.path.join(path, name, "c", str(i), "0", "0")
            os.makedirs(os.path.dirname(chunk), exist_ok=True)
            with open(chunk, "wb") as f:
                f.write(enc.encode(good[i]))
            if plan[i] is not None:
                lines.append(f"{plan[i][0]} {cname} {plan[i][1]} {chunk}")
                which[chunk] = (name, i)
    out = subprocess.run([tool], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    damaged = {name: [None] * n for name in DAMAGE_ARRAYS}
    for line in out.splitlines():
        verdict, chunk = line.split(" ", 1)
        name, i = which[chunk]
        if verdict == "applied":
            damaged[name][i] = f"{plan[i][0]} seed {plan[i][1]}"
    return good, damaged


def one_sample(d, i, n, decode):
    """Sample i of directory d through a Loader of its own (rank i of n
    reads that sample alone): its bytes, or the error it raised."""
    try:
        l = Loader(d, 1, device=DEVICE, rank=i, world=n, decode=decode, prefetch=1, open_ahead=0, timeout=120)
    except RuntimeError as e:
        return None, e
    try:
        x, _ = next(iter(l))
        return x.cpu().numpy().tobytes(), None
    except (OSError, DeliveryError) as e:
        return None, e
    finally:
        l.close()


def file_bytes(path):
    """numpy.load of a mount's file: its data, or the error it raised."""
    try:
        return np.load(path).tobytes(), None
    except OSError as e:
        return None, e


def damage_mount(a, store, name, trust):
    flags = dict(cache=os.path.join(a.scratch, "cache-" + name), gpu_trust_unchecked=trust or None)
    if "gpu_kernels" in EXTRA:
        flags["gpu_kernels"] = EXTRA["gpu_kernels"]
    if DEVICE == "cpu":
        flags["delivery"] = "host"
    subprocess.run(["rm", "-rf", flags["cache"]])
    m = zarrfs.Mount(store, os.path.join(a.scratch, "mnt-" + name), **flags)
    m.start()
    return m


# What the daemon's ring open says once a device fault, or a kernel that
# does not end, took its GPU down for the rest of the process (gpu.NewRing).
GPU_OFF = "off until the daemon restarts"


def damage_array(a, mounts, name, good, damaged, ref, trusted):
    """Every sample of array name through decode='device', one Loader each,
    against the reference mount's file (ref: bytes or error per sample).
    mounts holds the mount, and restarts it: a damaged chunk that makes
    nvCOMP fault (the driver refuses to rebuild the context), or its kernel
    run on past the watchdog's deadline, takes the daemon's GPU down for
    the rest of its process, as integration/gpu/run.sh reports of the
    decoder; the faulting sample must still get the CPU's
    verdict, the next Loader must say why it has no ring, and the rest of
    the samples are checked on a mount started again (DamageMount.fault
    reports it). Returns the tallies, and the lines of the samples that
    broke the rule."""
    n = len(good)
    t = dict(good=0, good_device=0, rejected=0, same=0, unchecked_accepted=0, unchecked_differ=0)
    bad, faulted = [], set()
    i = 0
    while i < n:
        m = mounts.m
        d = os.path.join(m.path, name)
        files = zarrfs.SampleDir(d).names
        before = status(a.zarrfs, m)["delivery"]["device_samples"]
        got, err = one_sample(d, i, n, "device")
        if err is not None and GPU_OFF in str(err) and DEVICE == "cuda":
            if i in faulted:
                bad.append(f"{name}/{files[i]}: the GPU went down again on a mount started again: {err}")
                i += 1
                continue
            faulted.add(i)
            mounts.fault(name, err)
            continue
        mounts.last = f"{name}/{files[i]} ({damaged[i] or 'undamaged'})"  # may fault the device for the next
        want, werr = ref[i]
        what = f"{name}/{files[i]} ({damaged[i] or 'undamaged'})"
        chunk = f"{name}/c/{i}/0/0"
        if damaged[i] is None:
            t["good"] += 1
            t["good_device"] += status(a.zarrfs, m)["delivery"]["device_samples"] - before
            if err is not None or got != good[i].tobytes() or want != got:
                bad.append(f"{what}: undamaged, {'raised ' + repr(err) if err else 'other bytes'} (reference: {werr or ('equal' if want == good[i].tobytes() else 'differs')})")
        elif werr is not None:  # the CPU rejects the chunk
            if err is not None:
                msg = str(err)
                if isinstance(err, OSError) and os.path.join(d, files[i]) in msg and chunk in msg:
                    t["rejected"] += 1
                else:
                    bad.append(f"{what}: the error names not the file and chunk {chunk}: {type(err).__name__}: {msg}")
            elif trusted:
                t["unchecked_accepted"] += 1
            else:
                bad.append(f"{what}: bytes where the CPU rejects the chunk ({werr})")
        elif err is None and got == want:  # no check covers this damage: the CPU decodes it too
            t["same"] += 1
        elif err is None and trusted:
            t["unchecked_differ"] += 1
        else:
            bad.append(f"{what}: the CPU decodes it, the device path {'raised ' + repr(err) if err else 'gave other bytes'}")
        i += 1
    return t, bad


class DamageMount:
    """The damage part's mount, started again after nvCOMP took its GPU down."""

    def __init__(self, a, store, name, trust):
        self.a, self.store, self.name, self.trust = a, store, name, trust
        self.last = None  # the sample read last: the one a fault found next comes from
        self.m = damage_mount(a, store, name, trust)

    def fault(self, name, err):
        """Reports that the ring open for array name found the GPU down
        (err), and starts the mount again."""
        print(f"  NVCOMP-FAULT {name} ({'with --gpu-trust-unchecked' if self.trust else 'default'}): after "
              f"{self.last or '?'} the GPU was down until restart; the next Loader raised: {str(err)[:300]}; "
              f"the mount started again", flush=True)
        self.stop()
        self.m = damage_mount(self.a, self.store, self.name, self.trust)

    def stop(self):
        """Stops the mount: its daemon exits within its shutdown bound, its
        GPU down or not (a failed check, not the part's end, where not)."""
        t0 = time.time()
        try:
            self.m.stop()
            err = None
        except zarrfs.MountError as e:
            err = e
        check(err is None, f"damage: the daemon exited cleanly on SIGTERM in {time.time() - t0:.1f} s"
                           + (f" ({str(err)[:300]})" if err else ""))


def damage_epoch(a, mounts, name, ref):
    """A whole epoch of batches of 4: the batches before the first with a
    sample the CPU rejects equal the reference, that batch raises naming a
    file of it, and the next epoch does the same (the ring survives). On a
    mount started again where nvCOMP took the GPU down before."""
    first = min(i for i, (_, e) in enumerate(ref) if e is not None)
    want_batches = first // 4
    try:
        l = Loader(os.path.join(mounts.m.path, name), 4, device=DEVICE, decode="device", timeout=120)
    except RuntimeError as e:
        if GPU_OFF not in str(e):
            raise
        mounts.fault(name, e)
        l = Loader(os.path.join(mounts.m.path, name), 4, device=DEVICE, decode="device", timeout=120)
    d = os.path.join(mounts.m.path, name)
    files = zarrfs.SampleDir(d).names
    ok = True
    for epoch in range(2):
        seen = 0
        try:
            for x, c in l:
                b = x.cpu().numpy()
                idx = c["index"].tolist()
                ok &= all(b[j].tobytes() == ref[k][0] for j, k in enumerate(idx))
                seen += 1
            ok = False
        except OSError as e:
            named = any(os.path.join(d, files[k]) + ":" in str(e) for k in range(want_batches * 4, want_batches * 4 + 4))
            if seen != want_batches or not named:
                print(f"  epoch {epoch}: {seen} batches, then {e}", flush=True)
                ok = False
    l.close()
    check(ok, f"damage: {name}: an epoch of batches of 4 equals the reference up to batch {want_batches}, which raises naming its file, twice")


def part_damage(a):
    """The device path against the damage of the decoders' damage suite
    (internal/damage, through chunkdamage): every damaged sample the CPU
    rejects raises naming its file and chunk; no other sample differs from
    the reference mount's (the CPU's) file; with --gpu-trust-unchecked, zstd
    without a checksum may decode damaged chunks to other bytes (reported)."""
    t0 = time.time()
    tool = a.chunkdamage or os.path.join(os.path.dirname(a.zarrfs), "chunkdamage")
    if not os.access(tool, os.X_OK):
        check(False, f"damage: no chunkdamage at {tool} (CGO_ENABLED=0 go build -o {tool} ./integration/gpu/chunkdamage)")
        return
    store = os.path.join(a.scratch, "damage.zarr")
    good, damaged = damage_store(store, tool, a.damage_seeds)
    n = len(good)
    print(f"  damage store: {len(DAMAGE_ARRAYS)} arrays of {n} samples, "
          + ", ".join(f"{k} {sum(x is not None for x in v)} damaged" for k, v in damaged.items()), flush=True)
    rm = zarrfs.Mount(store, os.path.join(a.scratch, "mnt-damage-ref"), cache=os.path.join(a.scratch, "cache-damage-ref"),
                      decode="cpu", delivery="off")
    subprocess.run(["rm", "-rf", os.path.join(a.scratch, "cache-damage-ref")])
    rm.start()
    try:
        ref = {k: [file_bytes(os.path.join(rm.path, k, f)) for f in zarrfs.SampleDir(os.path.join(rm.path, k)).names]
               for k in DAMAGE_ARRAYS}
    finally:
        rm.stop()
    for trust, names in ((False, list(DAMAGE_ARRAYS)), (True, ["zstdnc"])):
        label = "with --gpu-trust-unchecked" if trust else "default"
        mounts = DamageMount(a, store, "damage-trust" if trust else "damage", trust)
        try:
            for name in names:
                t, bad = damage_array(a, mounts, name, good, damaged[name], ref[name], trusted=trust and name == "zstdnc")
                for line in bad[:10]:
                    print("  " + line, flush=True)
                print(f"  {name} ({label}): {t['good']} undamaged ({t['good_device']} filled by the device path), "
                      f"{t['rejected']} damaged rejected naming file and chunk, {t['same']} damaged decoded alike by the CPU "
                      f"(no check covers that damage), {t['unchecked_accepted']} rejected by the CPU but accepted unchecked, "
                      f"{t['unchecked_differ']} decoded to other bytes than the CPU's unchecked", flush=True)
                check(not bad, f"damage: {name} ({label}): no sample broke the rule ({len(bad)} did)")
                if DEVICE == "cuda" and name != "zstdnc" or trust:
                    check(t["good_device"] > 0, f"damage: {name} ({label}): the device path filled undamaged samples "
                                                f"({t['good_device']} of {t['good']})")
            if not trust:
                damage_epoch(a, mounts, "blosc", ref["blosc"])
            m = mounts.m
            deadline = time.time() + 15  # the daemon frees a ring once its fills returned
            while status(a.zarrfs, m)["delivery"]["rings_open"] and time.time() < deadline:
                time.sleep(0.1)
            st = status(a.zarrfs, m)["delivery"]
            check(m._proc.poll() is None and st["rings_open"] == 0, f"damage ({label}): the daemon lives, no ring left open "
                                                                   f"({st['errors']} fills failed)")
        finally:
            mounts.stop()
    print(f"  damage: {time.time() - t0:.1f} s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("zarrfs")
    ap.add_argument("store")
    ap.add_argument("view")
    ap.add_argument("scratch")
    ap.add_argument("--parts", default="equal,reader,daemon,rate,dali,second,warm,damage")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--trust-unchecked", action="store_true", help="mount with --gpu-trust-unchecked")
    ap.add_argument("--gpu-kernels", help="mount with --gpu-kernels FILE: kernels compiled from kernels.cu")
    ap.add_argument("--chunkdamage", help="the chunkdamage binary (default: beside ZARRFS)")
    ap.add_argument("--damage-seeds", type=int, default=2, help="damaged samples per kind of damage and array")
    ap.add_argument("--daemon-log", help="append every mount's log lines (the zarrfs logger) to this file")
    a = ap.parse_args()
    if a.daemon_log:
        h = logging.FileHandler(a.daemon_log)
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logging.getLogger("zarrfs").addHandler(h)
        logging.getLogger("zarrfs").setLevel(logging.INFO)
    global DEVICE
    DEVICE = a.device
    if a.trust_unchecked:
        EXTRA["gpu_trust_unchecked"] = True
    if a.gpu_kernels:
        EXTRA["gpu_kernels"] = os.path.abspath(a.gpu_kernels)
    a.zarrfs = os.path.abspath(a.zarrfs)
    os.environ["ZARRFS_BIN"] = a.zarrfs  # every zarrfs.Mount of the run
    os.makedirs(a.scratch, exist_ok=True)
    parts = a.parts.split(",")
    if DEVICE == "cuda":
        torch.cuda.init()
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, {os.cpu_count()} cores", flush=True)
    n = 0
    if "equal" in parts or "reader" in parts or "dali" in parts:
        m, ref = start(a.zarrfs, a.store, a.view, a.scratch, "check"), None
        try:
            ref = start(a.zarrfs, a.store, a.view, a.scratch, "check-ref")
            n = len(zarrfs.SampleDir(os.path.join(m.path, "train")))
            if "equal" in parts:
                part_equal(a, m, ref, n)
            if "reader" in parts:
                part_reader(a, m)
            if "dali" in parts:
                part_dali(a, m, ref, n)
        finally:
            if ref is not None:
                ref.stop()
            m.stop()
    if "daemon" in parts:
        part_daemon(a)
    if "rate" in parts:
        part_rate(a)
    if "second" in parts:
        part_second(a)
    if "warm" in parts:
        part_warm(a)
    if "damage" in parts:
        part_damage(a)
    print(f"{len(failed)} checks failed" if failed else "all checks passed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
