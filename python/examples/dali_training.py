"""A training input pipeline: zarrfs mount -> DALI -> PyTorch.

One process per GPU (torchrun sets RANK, WORLD_SIZE and LOCAL_RANK). Each
node first warms the share its ranks read, then mounts; with --direct, DALI
reads the samples with GPUDirect Storage (cuFile) from the cache's files:

    zarrfs warm  /data/era5.zarr --cache /nvme/zarrfs --view train.yaml --rank $RANK --world $WORLD_SIZE
    zarrfs mount /data/era5.zarr /mnt/era5 --cache /nvme/zarrfs --view train.yaml --direct &
    torchrun --nproc-per-node 8 dali_training.py /mnt/era5/train --epochs 10

With --ring, the mount decodes each batch on the rank's GPU straight into
device memory shared with the process (zarrfs.dali.ring_reader: only
compressed bytes cross PCIe, nothing is written to the cache), for a mount
that decodes on the GPUs (no --direct needed).

Without a GPU (or with --cpu) the same pipeline runs on the CPU (with
--ring, against a mount's test mode: zarrfs mount --delivery host).
"""

import argparse
import os
import time

try:
    import torch
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
except ImportError as e:  # pragma: no cover
    raise SystemExit(f"this example needs DALI and PyTorch: {e}")

import zarrfs
import zarrfs.dali


def make_loader(sample_dir, *, rank, world, batch_size, gpu, device_id, seed=42, ring=False):
    """A DALI iterator of (N, C, H, W) float32 batches of the rank's samples."""
    d = zarrfs.SampleDir(sample_dir)
    if ring:
        @pipeline_def(batch_size=batch_size, num_threads=4, device_id=device_id if gpu else None,
                      prefetch_queue_depth=2, seed=seed)
        def ring_pipeline():
            x = zarrfs.dali.ring_reader(sample_dir, device="gpu" if gpu else "cpu", rank=rank, world=world,
                                        shuffle=True, seed=seed)
            return fn.cast(x, dtype=types.FLOAT)

        # An epoch ends when the ring's source does: no reader_name, no padding.
        return DALIGenericIterator([ring_pipeline()], ["x"], auto_reset=True), d
    # cuFile reads only through a --direct mount; otherwise read on the CPU
    # and copy each batch to the GPU.
    reader_device = "gpu" if gpu and d.is_direct() else "cpu"

    @pipeline_def(batch_size=batch_size, num_threads=4, device_id=device_id if gpu else None,
                  prefetch_queue_depth=2, seed=seed)
    def pipeline():
        x = zarrfs.dali.numpy_reader(sample_dir, device=reader_device, rank=rank, world=world,
                                     shuffle=True, seed=seed)
        if gpu and reader_device == "cpu":
            x = x.gpu()
        return fn.cast(x, dtype=types.FLOAT)

    pipe = pipeline()
    # reader_name gives the iterator the rank's epoch size; PARTIAL drops the
    # padding of the last batch, so every sample is seen once per epoch.
    it = DALIGenericIterator([pipe], ["x"], reader_name=d.name, last_batch_policy=LastBatchPolicy.PARTIAL,
                             auto_reset=True)
    return it, d


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sample_dir", help="MOUNT/VIEW or MOUNT/ARRAY")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--cpu", action="store_true", help="run without a GPU")
    ap.add_argument("--ring", action="store_true", help="batches decoded by the mount into a ring shared with this process")
    args = ap.parse_args(argv)

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    gpu = not args.cpu and torch.cuda.is_available()
    dev = torch.device("cuda", local) if gpu else torch.device("cpu")

    loader, d = make_loader(args.sample_dir, rank=rank, world=world, batch_size=args.batch_size,
                            gpu=gpu, device_id=local, ring=args.ring)
    shape = d.sample_shape if len(d.sample_shape) == 3 else (1,) + d.sample_shape[-2:]
    channels = shape[0]
    # A toy model: reconstruct the input through one convolution.
    model = torch.nn.Conv2d(channels, channels, 3, padding=1).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)

    for epoch in range(args.epochs):
        t0, seen, loss = time.perf_counter(), 0, None
        for batch in loader:
            x = batch[0]["x"].reshape((-1,) + tuple(shape)).to(dev, non_blocking=True)
            loss = ((model(x) - x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += x.shape[0]
        dt = time.perf_counter() - t0
        # loss.item(): float() of a tensor that requires grad warns.
        last = loss.item() if loss is not None else float("nan")
        print(f"rank {rank}/{world} epoch {epoch}: {seen} samples in {dt:.2f}s "
              f"({seen / dt:.1f} samples/s), loss {last:.4g}", flush=True)


if __name__ == "__main__":
    main()
