#!/usr/bin/env bash
# A store that grows: `zarrfs warm` of a warmed store after 1% more time
# steps were appended, against the first warm of the same store, in one run
# (the bar in BENCHMARKS.md: at most 2% more). Two arrays, as ERA5 copies have them:
# chunked 1 along time (the append writes new chunks only) and 24 (it also
# rewrites the last, partial chunk, whose samples are filled again).
#
# Environment:
#   BENCH_DIR     where the store is written (default .cache/bench)
#   GROW_STEPS    time steps before the append (default 2000; +1% appended)
#   GROW_GRID     latitudes,longitudes of a sample (default 361,720: a
#                 half-degree float32 field, 1 MB)
#   KEEP          set to keep the store and cache afterwards
set -euo pipefail
cd "$(dirname "$0")/../../.."
DIR=${BENCH_DIR:-.cache/bench}
N=${GROW_STEPS:-2000}
GRID=${GROW_GRID:-361,720}
PY=${PYTHON:-python3}
go build -o bin/zarrfs ./cmd/zarrfs
mkdir -p "$DIR"
work=$(mktemp -d "$DIR/grow.XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
grow() { # $1: create|append, $2: steps
  $PY - "$work/grow.zarr" "$1" "$2" "$GRID" <<'PY'
import sys
import numpy as np, zarr
path, op, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
Y, X = map(int, sys.argv[4].split(','))
def values(t0, t1):
    t = np.arange(t0, t1, dtype=np.float32)[:, None, None]
    y = np.linspace(-1.5, 1.5, Y, dtype=np.float32)[None, :, None]
    x = np.linspace(0, 6.28, X, dtype=np.float32)[None, None, :]
    rng = np.random.default_rng(t0)
    v = 280 + 20 * np.cos(y) * np.sin(x + t / 24) + rng.normal(0, 0.5, (t1 - t0, Y, X))
    return v.astype(np.float32)
if op == 'create':
    g = zarr.open_group(path, mode='w', zarr_format=3)
    for name, chunk in (('t2m', 1), ('sp', 24)):
        g.create_array(name, shape=(0, Y, X), chunks=(chunk, Y, X), dtype='f4', dimension_names=('time', 'latitude', 'longitude'))
    g.create_array('time', shape=(0,), chunks=(100000,), dtype='i8', dimension_names=('time',))
g = zarr.open_group(path, mode='r+')
n = g['time'].shape[0]
for t0 in range(n, n + k, 240):
    t1 = min(t0 + 240, n + k)
    v = values(t0, t1)
    for name in ('t2m', 'sp'):
        g[name].append(v, axis=0)
    g['time'].append(np.arange(t0, t1), axis=0)
PY
  # The writer's data reaches the disk before the warm is timed: a warm
  # syncs the filesystem before it trusts its blobs, and would otherwise
  # pay for the writer's flush.
  sync
}
timed() { # prints seconds, then the warm's summary line on stderr
  local t0 t1
  t0=$(date +%s.%N)
  bin/zarrfs warm "$work/grow.zarr" --cache "$work/cache" --log-level debug >"$work/out" 2>"$work/err" ||
    { echo "warm failed: $(tail -1 "$work/err")" >&2; exit 1; }
  t1=$(date +%s.%N)
  tail -1 "$work/out" >&2
  grep -o 'chunks_decoded=[0-9]* requests=[0-9]* listings=[0-9]*' "$work/err" >&2
  echo "$t1 - $t0" | bc -l
}
echo "== $N steps of t2m (chunk 1) and sp (chunk 24), ${GRID/,/x} float32"
grow create "$N"
first=$(timed) || exit 1
grow append $((N / 100))
second=$(timed) || exit 1
printf 'first warm %.2f s; warm after appending %d steps (1%%) %.3f s: %.1f%%\n' "$first" $((N / 100)) "$second" "$(echo "100 * $second / $first" | bc -l)"
