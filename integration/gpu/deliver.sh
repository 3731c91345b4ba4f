#!/usr/bin/env bash
# Device delivery on a GPU machine (part of make test-gpu): zarrfs.torch.Loader
# with decode="device" (the mount's ring in GPU memory) against decode="host"
# on the ERA5-like view of make_store.py, for both codec mixes: byte
# equality, a killed reader's ring freed (status and nvidia-smi), a killed
# daemon raising in the Loader, and the figures of the device path's
# measures (integration/gpu/deliver_check.py): first-epoch samples/s of
# both paths with the daemon on 4 cores and on all, bytes to the GPU
# against the compressed bytes, the daemon's CPU a sample on each path,
# and where the device path's fills spend their time; the second epoch from
# the compressed cache against a warm decoded-blob epoch, and the Loader over
# a warm mount against plain preads of the same files (with where its time
# goes); then, once, the decoders' damage suite on the device path (deliver_check.py's damage part,
# its chunks damaged by chunkdamage).
#
# The GPU kernels are first compiled from gpu/kernels/kernels.cu (nvcc, or
# NVRTC from PyTorch's CUDA wheels: integration/gpu/ptx.py) into
# PTX_DIR/kernels.ptx, for the checked-in kernels.ptx; with GPU_TEST (the
# gpu package's test binary) their GPU tests run on that PTX, and when they
# pass the mounts load it (--gpu-kernels), so kernels not yet checked in
# are measured in the same run.
#
# Builds nothing: ZARRFS is a binary built elsewhere (CGO_ENABLED=0 go build),
# GPU_TEST too (CGO_ENABLED=0 go test -c -o gpu.test ./gpu), and CHUNKDAMAGE
# (default: chunkdamage beside ZARRFS; CGO_ENABLED=0 go build -o chunkdamage
# ./integration/gpu/chunkdamage).
# Usage: integration/gpu/deliver.sh ZARRFS
# Environment: STEPS (samples, default 96), SCRATCH (default
# /dev/shm/zarrfs-deliver), CODECS (default "blosc mixed"), PARTS (the
# checker's parts, default all: equal,reader,daemon,rate,dali,second,warm,damage),
# PYTHON (default python3), STORE_DIR (stores
# already written by make_store.py: STORE_DIR/CODEC/era5.zarr and
# train.yaml), PTX_DIR (default $OUT, else SCRATCH), GPU_TEST, KERNELS
# (0: mount with the binary's own kernels), DEVICE (cpu: every check against
# the mount's test mode, to try the script without a GPU), STORE_ARGS (more
# make_store.py arguments: --lat 64 --lon 128 for small stores),
# DELIVER_LOG_DIR (the mounts' log lines of each store and of the damage
# part, in a file each there).
set -uo pipefail
zarrfs=$(readlink -f "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
steps=${STEPS:-96}
scratch=${SCRATCH:-/dev/shm/zarrfs-deliver}
ptxdir=${PTX_DIR:-${OUT:-$scratch}}
export PYTHONPATH="$root/python/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$scratch" "$ptxdir"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/nvidia-smi: /'
echo "CPU cores: $(nproc)"
t_start=$(date +%s)
status=0

kernels=()
if "$py" "$here/ptx.py" "$root/gpu/kernels/kernels.cu" "$ptxdir/kernels.ptx"; then
	if [[ -n ${GPU_TEST:-} ]]; then
		gt=$(readlink -f "$GPU_TEST")
		# The kernels' GPU tests on the compiled PTX: every codec's vectors,
		# byte swaps, and the device's zstd checksum into a ring slot.
		out=$(cd "$root/gpu" && "$gt" -test.v -test.timeout 300s -test.run 'TestGPU(Vectors|ByteSwap|RingXXH64)$' \
			-gpu.ptx="$ptxdir/kernels.ptx" 2>&1)
		grep -E '^(--- |ok|FAIL|PASS|panic)' <<<"$out" | sed 's/^/kernels: /'
		if grep -q '^PASS' <<<"$out" && ! grep -q -- '--- SKIP: TestGPURingXXH64' <<<"$out"; then
			echo "kernels: the compiled PTX passes the GPU tests: the mounts load it (--gpu-kernels)"
			[[ ${KERNELS:-1} == 1 ]] && kernels=(--gpu-kernels "$ptxdir/kernels.ptx")
		else
			echo "FAIL kernels: the compiled PTX fails its GPU tests; the mounts keep the binary's kernels"
			grep -vE '^(=== RUN|--- PASS)' <<<"$out" | tail -30
			status=1
		fi
	fi
fi

parts=${PARTS:-equal,reader,daemon,rate,dali,second,warm,damage}
# The parts that read the ERA5-like stores, run once per store.
store_parts=$(tr , '\n' <<<"$parts" | grep -vx damage | paste -sd, -)
for codecs in ${CODECS:-blosc mixed}; do
	[[ -z $store_parts ]] && break
	src=${STORE_DIR:+$STORE_DIR/$codecs}
	if [[ -z $src ]]; then
		src=$scratch/src-$codecs
		t0=$(date +%s)
		# shellcheck disable=SC2086 # STORE_ARGS are words
		"$py" "$here/make_store.py" "$src" --steps "$steps" --unique 8 --codecs "$codecs" ${STORE_ARGS:-} >/dev/null || exit 1
		echo "store $codecs: $steps samples ready in $(($(date +%s) - t0)) s"
		find "$src/era5.zarr" -type f -exec cat {} + >/dev/null # into the page cache
	fi
	echo "== $codecs store"
	# The mixed store's zstd frames carry no checksum: the GPU takes them
	# with the opt-in only (--gpu-trust-unchecked), as BENCHMARKS.md's
	# device-delivery measures run it.
	trust=()
	[[ $codecs == mixed ]] && trust=(--trust-unchecked)
	"$py" "$here/deliver_check.py" "$zarrfs" "$src/era5.zarr" "$src/train.yaml" "$scratch/run-$codecs" \
		--parts "$store_parts" --device "${DEVICE:-cuda}" "${trust[@]}" "${kernels[@]}" \
		${DELIVER_LOG_DIR:+--daemon-log "$DELIVER_LOG_DIR/$codecs.log"} || status=1
	rm -rf "$scratch/run-$codecs"
done
if [[ ,$parts, == *,damage,* ]]; then
	echo "== damaged chunks on the device path"
	"$py" "$here/deliver_check.py" "$zarrfs" - - "$scratch/run-damage" --parts damage --device "${DEVICE:-cuda}" \
		--chunkdamage "${CHUNKDAMAGE:-$(dirname "$zarrfs")/chunkdamage}" "${kernels[@]}" \
		${DELIVER_LOG_DIR:+--daemon-log "$DELIVER_LOG_DIR/damage.log"} || status=1
	rm -rf "$scratch/run-damage"
fi
echo "deliver.sh: $(($(date +%s) - t_start)) s"
exit $status
