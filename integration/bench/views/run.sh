#!/usr/bin/env bash
# View benchmark: cold fill of a 20-channel ERA5-like view (721 x 1440 float32, source chunked
# 10 time steps x 1 level, zstd) by zarrfs against xarray + zarr-python in the same run.
# Prints the ratio, the zarr decode counter against the distinct source chunks, and checks that
# sample 0 is byte-identical between the two.
#
# Environment:
#   BENCH_DIR      where the store lives (default .cache/bench/views; reused when complete)
#   VIEW_SAMPLES   samples filled (default 20; the store has 20 time steps unless VIEW_STEPS)
#   VIEW_STEPS     time steps in the store (default 20)
#   PYTHON         python with numpy, zarr and xarray (default python3)
# Both readers find the store in the page cache (it is read once before the runs), so the
# comparison is about decoding and assembly, not the disk.
set -euo pipefail
cd "$(dirname "$0")/../../.."
DIR=${BENCH_DIR:-.cache/bench/views}
N=${VIEW_SAMPLES:-20}
STEPS=${VIEW_STEPS:-20}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
$PY integration/bench/views/make_store.py "$DIR" --steps "$STEPS"
CGO_ENABLED=0 go build -o "$DIR/viewbench" ./integration/bench/views
find "$DIR/era5_views.zarr" -type f -exec cat {} + >/dev/null
echo "== $(nproc) CPUs, load average $(cut -d' ' -f1 /proc/loadavg)"
"$DIR/viewbench" -n "$N" -python "$PY" "$DIR"
