#!/usr/bin/env bash
# Decode benchmark: zarrfs's reader against zarr-python 3 and tensorstore on the same
# ERA5-like stores (float32 (T, 721, 1440), one chunk per time step; zstd 3, blosc lz4 shuffle,
# gzip 5), each decoding to at least BENCH_GB x 10^9 bytes. Entry point of `make bench`.
#
# Environment:
#   BENCH_GB     decoded size per store, 10^9 bytes (default 4)
#   BENCH_DIR    where stores and results live (default .cache/bench in the repository)
#   BENCH_CODECS comma-separated subset of zstd,blosc,gzip (default all)
#   BENCH_BATCH  time steps per zarrfs Read call and per peer batch read (default 8)
#   BENCH_CACHE  cold: drop the page cache before every run (needs root; the default when
#                permitted); warm: read each store once before its runs so every reader finds it
#                in the page cache (the fallback otherwise)
#   BENCH_EXTRA  1 adds batched peer reads (zarr-python a[t:t+N], tensorstore a[t:t+N])
set -euo pipefail
cd "$(dirname "$0")/../.."
GB=${BENCH_GB:-4}
DIR=${BENCH_DIR:-.cache/bench}
CODECS=${BENCH_CODECS:-zstd,blosc,gzip}
BATCH=${BENCH_BATCH:-8}
PY=${PYTHON:-python3}
mkdir -p "$DIR"

echo "== generating stores in $DIR (${GB} GB decoded each; reused when complete)"
$PY integration/bench/make_era5.py "$DIR" --gb "$GB" --codecs "$CODECS"

echo "== building readbench"
CGO_ENABLED=0 go build -o "$DIR/readbench" ./integration/bench/readbench

CACHE=${BENCH_CACHE:-}
if [[ -z $CACHE ]]; then
  if sync && echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then CACHE=cold; else CACHE=warm; fi
fi
if [[ $CACHE == cold ]] && ! echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then
  echo "run.sh: BENCH_CACHE=cold needs permission to write /proc/sys/vm/drop_caches" >&2
  exit 1
fi
echo "== page cache: $CACHE ($([[ $CACHE == cold ]] && echo 'dropped before every run' || echo 'each store read once first; every reader finds it cached'))"
read -r load1 _ </proc/loadavg
echo "== $(nproc) CPUs, load average $load1$(awk -v l="$load1" -v n="$(nproc)" 'BEGIN{if (l > n) print " (busy machine: numbers will be noisy)"}')"

prepare() { # store
  if [[ $CACHE == cold ]]; then
    sync
    echo 3 >/proc/sys/vm/drop_caches
  fi
}

failed=0
RESULTS="$DIR/results-$(date +%Y%m%d-%H%M%S).jsonl"
: >"$RESULTS"
IFS=, read -ra list <<<"$CODECS"
for c in "${list[@]}"; do
  store="$DIR/era5_$c.zarr"
  echo "== $c"
  if [[ $CACHE == warm ]]; then
    find "$store" -type f -exec cat {} + >/dev/null
  fi
  runs=(
    "$DIR/readbench -batch $BATCH $store"
    "$PY integration/bench/peers.py $store --reader zarr-python --mode step"
    "$PY integration/bench/peers.py $store --reader tensorstore --mode step"
    "$PY integration/bench/peers.py $store --reader tensorstore --mode whole"
  )
  if [[ ${BENCH_EXTRA:-0} == 1 ]]; then
    runs+=(
      "$PY integration/bench/peers.py $store --reader zarr-python --mode batch --batch $BATCH"
      "$PY integration/bench/peers.py $store --reader tensorstore --mode batch --batch $BATCH"
    )
  fi
  for cmd in "${runs[@]}"; do
    prepare "$store"
    if line=$($cmd); then
      echo "$line" | tee -a "$RESULTS"
    else
      echo "FAILED: $cmd" >&2
      failed=1
    fi
  done
done

echo "== results in $RESULTS"
$PY integration/bench/table.py "$RESULTS" || failed=1
exit $failed
