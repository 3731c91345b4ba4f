#!/usr/bin/env bash
# Device delivery on a GPU machine (part of make test-gpu): zarrfs.torch.Loader
# with decode="device" (the mount's ring in GPU memory) against decode="host"
# on the ERA5-like view of make_store.py, for both codec mixes: byte
# equality, a killed reader's ring freed (status and nvidia-smi), a killed
# daemon raising in the Loader, and first-epoch samples/s of both paths with
# the daemon on 4 cores and on all (integration/gpu/deliver_check.py).
# Builds nothing: ZARRFS is a binary built elsewhere (CGO_ENABLED=0 go build).
# Usage: integration/gpu/deliver.sh ZARRFS
# Environment: STEPS (samples, default 32), SCRATCH (default
# /dev/shm/zarrfs-deliver), CODECS (default "blosc mixed"), PARTS (the
# checker's parts, default all), PYTHON (default python3), STORE_DIR (stores
# already written by make_store.py: STORE_DIR/CODEC/era5.zarr and train.yaml).
set -uo pipefail
zarrfs=$(readlink -f "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
steps=${STEPS:-32}
scratch=${SCRATCH:-/dev/shm/zarrfs-deliver}
export PYTHONPATH="$root/python/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$scratch"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/nvidia-smi: /'
status=0
for codecs in ${CODECS:-blosc mixed}; do
	src=${STORE_DIR:+$STORE_DIR/$codecs}
	if [[ -z $src ]]; then
		src=$scratch/src-$codecs
		if [[ ! -d $src/era5.zarr ]]; then
			t0=$(date +%s)
			"$py" "$here/make_store.py" "$src" --steps "$steps" --unique 8 --codecs "$codecs" >/dev/null || exit 1
			echo "store $codecs: $steps samples written in $(($(date +%s) - t0)) s"
		fi
		find "$src/era5.zarr" -type f -exec cat {} + >/dev/null # into the page cache
	fi
	echo "== $codecs store"
	"$py" "$here/deliver_check.py" "$zarrfs" "$src/era5.zarr" "$src/train.yaml" "$scratch/run-$codecs" \
		--parts "${PARTS:-equal,reader,daemon,rate}" || status=1
	rm -rf "$scratch/run-$codecs"
done
exit $status
