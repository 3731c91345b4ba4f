#!/usr/bin/env bash
# make demo: write a small ERA5-like store, mount it, look at it with ls and
# numpy, unmount. It needs the Go build and numpy alone: python3's own when
# it has numpy, else a small environment of the checkout's own
# (.cache/demo-venv) with numpy in it, made once.
set -euo pipefail
cd "$(dirname "$0")/.."

py=${DEMO_PYTHON:-python3}
if ! "$py" -c 'import numpy' 2>/dev/null; then
  venv=.cache/demo-venv
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import numpy' 2>/dev/null; then
    echo "== numpy for the demo, into $venv (python3 has none)"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q numpy
  fi
  py=$venv/bin/python
fi
work=$(mktemp -d /tmp/zarrfs-demo.XXXXXX)
store=$work/era5.zarr mnt=$work/mnt cache=$work/cache
mkdir -p "$mnt"
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; wait "$pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== writing an example store"
go run ./integration/demo/mkstore "$store"
echo
echo "== zarrfs inspect $store"
bin/zarrfs inspect "$store"
echo
echo "== zarrfs mount $store $mnt"
bin/zarrfs mount "$store" "$mnt" --cache "$cache" > "$work/mount.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  grep -q "mounted" "$work/mount.log" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/mount.log"; exit 1; }
  sleep 0.1
done
grep "mounted" "$work/mount.log"
echo
echo "== ls -l $mnt $mnt/t"
ls -l "$mnt"
ls -l "$mnt/t"
echo
echo "== numpy.load($mnt/t/3.npy)"
"$py" - "$mnt" <<'PY'
import json, sys, numpy as np
mnt = sys.argv[1]
a = np.load(f"{mnt}/t/3.npy")
print("shape", a.shape, "dtype", a.dtype, "mean %.3f" % a.mean())
side = json.load(open(f"{mnt}/t.json"))
print("sidecar: dims", side["dims"], "sample_dim", side["sample_dim"], "files", side["files"])
print("lsm.npy land fraction %.3f" % np.load(f"{mnt}/lsm.npy").mean())
PY
echo
echo "== unmounting (SIGTERM)"
kill -TERM "$pid"; wait "$pid"; pid=
echo "zarrfs exited 0; demo done"
