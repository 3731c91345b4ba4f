#!/usr/bin/env bash
# Warm throughput: `zarrfs warm` filling the blob cache from a local zstd
# store, against zarr-python reading the same samples and writing them with
# numpy.save, in one run, on the same files (BENCHMARKS.md, warm).
#
# Environment:
#   BENCH_DIR      where the decode benchmark keeps its stores (default .cache/bench)
#   WARM_SAMPLES   samples of t2m to fill (default 200, 4.15 MB each)
set -euo pipefail
cd "$(dirname "$0")/../../.."
DIR=${BENCH_DIR:-.cache/bench}
N=${WARM_SAMPLES:-200}
PY=${PYTHON:-python3}
STORE=$DIR/era5_zstd.zarr
if [[ ! -f $STORE/t2m/zarr.json ]]; then
  echo "== generating $STORE"
  $PY integration/bench/make_era5.py "$DIR" --gb 1 --codecs zstd
fi
go build -o bin/zarrfs ./cmd/zarrfs
work=$(mktemp -d "$DIR/warm.XXXXXX")
trap 'rm -rf "$work"' EXIT
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }

drop
t0=$(date +%s.%N)
bin/zarrfs warm "$STORE" --cache "$work/cache" --only t2m --samples "0:$N" >/dev/null
t1=$(date +%s.%N)
zbytes=$(find "$work/cache/blobs" -name '*.npy' -printf '%s\n' | awk '{s+=$1} END {print s}')

drop
$PY - "$STORE" "$work/peer" "$N" > "$work/peer.json" <<'PY'
import json, os, sys, time
import numpy as np, zarr
store, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(out)
a = zarr.open_array(store, path="t2m", mode="r")
t0 = time.perf_counter()
for t in range(n):
    np.save(os.path.join(out, f"{t:04d}.npy"), a[t])
    # numpy.save does not sync; neither reader is charged for fsync below
dt = time.perf_counter() - t0
size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
print(json.dumps({"seconds": dt, "bytes": size}))
PY
# Cold fill through the mount: numpy.load of every sample of a fresh mount
# (each open decodes its chunk and writes the blob), once with readahead off
# (each sample timed where it is read) and once with the default readahead.
coldmount() { # $1: readahead, $2: result file
  drop
  rm -rf "$work/mnt" "$work/mcache"; mkdir -p "$work/mnt"
  bin/zarrfs mount "$STORE" "$work/mnt" --cache "$work/mcache" --readahead "$1" >"$work/mount.log" 2>&1 &
  mpid=$!
  for _ in $(seq 200); do grep -q mounted "$work/mount.log" 2>/dev/null && break; sleep 0.05; done
  $PY - "$work/mnt/t2m" "$N" > "$2" <<'PY'
import json, os, sys, time
import numpy as np
d, n = sys.argv[1], int(sys.argv[2])
names = sorted(os.listdir(d))[:n]
t0 = time.perf_counter()
size = 0
for f in names:
    size += np.load(os.path.join(d, f)).nbytes
print(json.dumps({"seconds": time.perf_counter() - t0, "bytes": size}))
PY
  kill -TERM "$mpid"; wait "$mpid" || true
}
coldmount 0 "$work/mount.json"
coldmount 2 "$work/mount_ra.json"
read -r mbytes msec < <($PY -c "import json; d=json.load(open('$work/mount.json')); print(d['bytes'], d['seconds'])")
read -r rbytes rsec < <($PY -c "import json; d=json.load(open('$work/mount_ra.json')); print(d['bytes'], d['seconds'])")
read -r pbytes psec < <($PY -c "import json,sys; d=json.load(open('$work/peer.json')); print(d['bytes'], d['seconds'])")
zsec=$($PY -c "print($t1 - $t0)")
$PY - "$zbytes" "$zsec" "$pbytes" "$psec" "$N" "$mbytes" "$msec" "$rbytes" "$rsec" <<'PY'
import sys
zb, zs, pb, ps, n, mb, ms, rb, rs = map(float, sys.argv[1:10])
n = int(n)
z, p, m = zb / zs / 1e9, pb / ps / 1e9, mb / ms / 1e9
print(f"warm of {n} samples of t2m (721x1440 float32, zstd 3), page cache dropped before each:")
print(f"  zarrfs warm (fsync'd, checksummed blobs)   {z:6.3f} GB/s  ({zs:.2f} s, process start included)")
print(f"  zarr-python a[t] + numpy.save              {p:6.3f} GB/s  ({ps:.2f} s)")
print(f"  ratio zarrfs warm / zarr-python          {z / p:6.2f}x")
print(f"cold numpy.load of the same samples through a fresh mount:")
r = rb / rs / 1e9
print(f"  zarrfs mount, --readahead 0                {m:6.3f} GB/s  ({ms:.2f} s)   {m / p:5.2f}x zarr-python")
print(f"  zarrfs mount, --readahead 2 (default)      {r:6.3f} GB/s  ({rs:.2f} s)   {r / p:5.2f}x zarr-python")
PY
