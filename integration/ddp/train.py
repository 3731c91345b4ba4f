#!/usr/bin/env python3
"""A data-parallel training input pipeline on one zarrfs mount (one process per rank, torchrun).

Usage: torchrun --nproc_per_node=N integration/ddp/train.py --dir MOUNT/VIEW [options]

Each rank reads its share of a view's samples with the reader named by --reader and trains a small
U-Net-like stack of convolutions on them with DistributedDataParallel:
  dali      zarrfs.dali.numpy_reader (device "gpu" through cuFile on a --direct mount, else "cpu" then .gpu())
  loader    zarrfs.torch.Loader (preads into pinned memory, copies to the GPU)
  baseline  xarray + zarr-python + DataLoader with a DistributedSampler over the Zarr store (--store, --view-yaml)
Per epoch it reports samples/s per rank and in total, and checks on rank 0 that every sample was seen
exactly once across ranks. Prints one JSON line per epoch on rank 0. Runs on GPUs (NCCL; with
--share-gpu several ranks use one GPU, through gloo) or on CPUs (gloo, --cpu).
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


class Net(nn.Module):
    """Down, bottleneck, up, with a skip: a U-Net in miniature."""

    def __init__(self, c, width=32):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(c, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU())
        self.mid = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(width, width, 2, stride=2)
        self.out = nn.Conv2d(width + c, c, 3, padding=1)

    def forward(self, x):
        h = self.up(self.mid(self.down(x)))
        h = h[..., : x.shape[-2], : x.shape[-1]]
        if h.shape[-2:] != x.shape[-2:]:
            h = nn.functional.pad(h, (0, x.shape[-1] - h.shape[-1], 0, x.shape[-2] - h.shape[-2]))
        return self.out(torch.cat([h, x], 1))


_loader = {}


def batches_loader(a, rank, world, device, epoch):
    from zarrfs.torch import Loader
    if "l" not in _loader:  # one Loader for the run: its pinned buffers are kept across epochs
        _loader["l"] = Loader(a.dir, a.batch, device=str(device), rank=rank, world=world, shuffle=True, seed=a.seed,
                              open_ahead=a.open_ahead)
    l = _loader["l"]
    l.set_epoch(epoch)
    for x, c in l:
        yield x, c["index"].tolist()


_dali = {}


def batches_dali(a, rank, world, device, epoch):
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    import zarrfs.dali
    if "it" not in _dali:
        on_gpu = device.type == "cuda"
        direct = os.path.islink(zarrfs.SampleDir(a.dir).files[0]) if len(zarrfs.SampleDir(a.dir)) else False
        reader_device = "gpu" if on_gpu and direct else "cpu"

        @pipeline_def(batch_size=a.batch, num_threads=4, device_id=device.index if on_gpu else None, seed=a.seed)
        def pipe():
            data = zarrfs.dali.numpy_reader(a.dir, device=reader_device, rank=rank, world=world, shuffle=True, name="r")
            info = fn.get_property(data, key="source_info")
            if on_gpu and reader_device == "cpu":
                data = data.gpu()
            return data, info

        p = pipe()
        p.build()
        _dali["it"] = DALIGenericIterator([p], ["x", "info"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)
        _dali["reader"] = reader_device
    for out in _dali["it"]:
        x = out[0]["x"]
        info = out[0]["info"].cpu().numpy()
        idx = [int(os.path.basename(bytes(row).rstrip(b"\0").decode())[:-4]) for row in info]
        yield x.to(device, non_blocking=True), idx


def batches_baseline(a, rank, world, device, epoch):
    import xarray as xr
    import yaml
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler
    spec = yaml.safe_load(open(a.view_yaml))["views"][0]
    ds = xr.open_zarr(a.store, consolidated=False)
    n = ds.sizes[spec.get("sample_dim", "time")]

    class Samples(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, t):
            chans = []
            for ch in spec["channels"]:
                v = ds[ch["var"]]
                if "time" in v.dims:
                    v = v.isel(time=t)
                arr = np.asarray(v.values, dtype=np.float32)
                chans.extend(arr if arr.ndim == 3 else [arr])
            return torch.from_numpy(np.stack(chans)), t

    sampler = DistributedSampler(Samples(), num_replicas=world, rank=rank, shuffle=True, seed=a.seed, drop_last=False)
    sampler.set_epoch(epoch)
    dl = DataLoader(Samples(), batch_size=a.batch, sampler=sampler, num_workers=a.workers, pin_memory=device.type == "cuda")
    for x, t in dl:
        yield x.to(device, non_blocking=True), t.tolist()


def baseline_shape(a):
    """A sample's shape (channels, lat, lon) as batches_baseline stacks it, and the number of samples,
    from the metadata alone."""
    import xarray as xr
    import yaml
    spec = yaml.safe_load(open(a.view_yaml))["views"][0]
    ds = xr.open_zarr(a.store, consolidated=False)
    c, hw = 0, None
    for ch in spec["channels"]:
        v = ds[ch["var"]]
        dims = [n for d, n in zip(v.dims, v.shape) if d != "time"]
        c += dims[0] if len(dims) == 3 else 1
        hw = dims[-2:]
    return (c, *hw), ds.sizes[spec.get("sample_dim", "time")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="the view's sample directory on the mount")
    ap.add_argument("--reader", choices=["dali", "loader", "baseline"], default="loader")
    ap.add_argument("--store", help="baseline: the Zarr store")
    ap.add_argument("--view-yaml", help="baseline: the view file")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--open-ahead", type=int, default=8, help="loader: samples opened ahead (0: none)")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--share-gpu", action="store_true", help="all ranks on GPU 0 (gloo), where there is one GPU")
    ap.add_argument("--label", default="")
    a = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if a.cpu:
        device, backend = torch.device("cpu"), "gloo"
    else:
        device = torch.device("cuda", 0 if a.share_gpu else local)
        torch.cuda.set_device(device)
        backend = "gloo" if a.share_gpu else "nccl"
    dist.init_process_group(backend)
    read = {"dali": batches_dali, "loader": batches_loader, "baseline": batches_baseline}[a.reader]

    import zarrfs
    if a.reader == "baseline":
        channels = None
        shape, total = baseline_shape(a)
    else:
        d = zarrfs.SampleDir(a.dir)
        channels, total, shape = d.sample_shape[0], d.total, tuple(d.sample_shape)
    # The model, DDP and the GPU's kernels start before the first epoch's
    # clock: an epoch's time is its reading and training.
    model = Net(shape[0]).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" and not a.share_gpu else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.zeros((a.batch, *shape), device=device)
    nn.functional.mse_loss(model(x), x).backward()
    opt.zero_grad()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    for epoch in range(a.epochs):
        seen = []
        n = 0
        t0 = time.perf_counter()
        for x, idx in read(a, rank, world, device, epoch):
            x = torch.nan_to_num(x.float())
            loss = nn.functional.mse_loss(model(x), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += idx
            n += x.shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        gathered = [None] * world
        dist.all_gather_object(gathered, {"rank": rank, "seen": seen, "seconds": dt})
        if rank == 0:
            all_seen = sorted(i for g in gathered for i in g["seen"])
            if channels is not None:
                once = all_seen == list(range(total))
            else:
                # DistributedSampler pads the ranks to equal lengths with
                # repeats: every sample at least once is what it promises.
                once = set(all_seen) == set(range(total))
            per_rank = [round(len(g["seen"]) / g["seconds"], 2) for g in gathered]
            slowest = max(g["seconds"] for g in gathered)
            print(json.dumps({"label": a.label, "reader": a.reader + (f"/{_dali.get('reader')}" if a.reader == "dali" else ""),
                              "world": world, "epoch": epoch, "samples": len(all_seen),
                              "samples_per_s_per_rank": per_rank, "samples_per_s_total": round(len(all_seen) / slowest, 2),
                              "every_sample_once": once}), flush=True)
            if not once:
                raise SystemExit(f"epoch {epoch}: samples seen {len(all_seen)}, duplicates or missing")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
