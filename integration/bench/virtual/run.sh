#!/usr/bin/env bash
# Virtual-store benchmark (BENCHMARKS.md, virtual stores), on one machine in one run:
#  1. cold fill of a two-channel view over a kerchunk reference set of
#     ERA5-like NetCDF4 files, against the same view over the equivalent
#     plain Zarr store on the same disk (both with `zarrfs warm`, fresh cache
#     each), and against xarray + kerchunk (fsspec) reading the same
#     samples, the three alternating, ROUNDS times, medians compared;
#  2. opening a 10,000-file reference set (JSON and Parquet) and listing
#     the mount, with the daemon's RSS.
# Environment: BENCH_DIR (default .cache/bench/virtual), ROUNDS (3),
# FILES (3 monthly files), STEPS (8 time steps each), PYTHON (python3).
# The page cache is dropped before every fill when the kernel lets us;
# otherwise every source file is read once first, so that both sources
# come from memory alike.
set -euo pipefail
cd "$(dirname "$0")/../../.."
DIR=${BENCH_DIR:-.cache/bench/virtual}
ROUNDS=${ROUNDS:-3}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
$PY integration/bench/virtual/make_era5_nc.py "$DIR" --files "${FILES:-3}" --steps "${STEPS:-8}"
make -s build
BIN=$PWD/bin/zarrfs
drop() {
  sync
  if ! echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
    find "$DIR/nc" "$DIR/plain.zarr" -type f -exec cat {} + > /dev/null
    echo "(page cache not dropped: both sources read from memory)" >&2
  fi
}
fill() { # SRC -> seconds of a cold warm of the view
  local c; c=$(mktemp -d)
  drop
  local s; s=$(date +%s.%N)
  "$BIN" warm "$1" --cache "$c" --view "$DIR/view.yaml" --only train > /dev/null
  local e; e=$(date +%s.%N)
  rm -rf "$c"
  echo "$e - $s" | bc -l
}
echo "== $(nproc) CPUs, load average $(cut -d' ' -f1 /proc/loadavg)"
ref=(); plain=(); peer=()
for r in $(seq "$ROUNDS"); do
  ref+=("$(fill "$DIR/refs.json")")
  plain+=("$(fill "$DIR/plain.zarr")")
  drop
  peer+=("$($PY integration/bench/virtual/xarray_kerchunk.py "$DIR" | $PY -c 'import json, sys; print(json.load(sys.stdin)["seconds"])')")
  echo "round $r: kerchunk ${ref[-1]} s, plain zarr ${plain[-1]} s, xarray + kerchunk ${peer[-1]} s"
done
# The two mounts serve the same bytes.
m1=$(mktemp -d); m2=$(mktemp -d); c1=$(mktemp -d); c2=$(mktemp -d)
"$BIN" mount "$DIR/refs.json" "$m1" --cache "$c1" --view "$DIR/view.yaml" > /dev/null & p1=$!
"$BIN" mount "$DIR/plain.zarr" "$m2" --cache "$c2" --view "$DIR/view.yaml" > /dev/null & p2=$!
for _ in $(seq 100); do [ -e "$m1/train" ] && [ -e "$m2/train" ] && break; sleep 0.1; done
same=yes
for f in "$m1"/train/*.npy; do cmp -s "$f" "$m2/train/$(basename "$f")" || same=no; done
kill -TERM $p1 $p2; wait $p1 $p2 || true
echo "view samples identical over both sources: $same"
$PY - "${ref[*]}" "${plain[*]}" "${peer[*]}" <<'PYEOF'
import statistics, sys
ref, plain, peer = ([float(x) for x in a.split()] for a in sys.argv[1:4])
r, p, x = statistics.median(ref), statistics.median(plain), statistics.median(peer)
print(f"median fill: kerchunk {r:.2f} s, plain zarr {p:.2f} s -> kerchunk/plain speed {p / r:.2f}x (target >= 0.8x)")
print(f"median xarray + kerchunk {x:.2f} s -> zarrfs over kerchunk {x / r:.2f}x (target >= 3x)")
PYEOF
$PY integration/bench/virtual/open_bench.py "$BIN" "$DIR"
