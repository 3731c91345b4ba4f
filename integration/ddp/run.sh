#!/usr/bin/env bash
# Data-parallel training on one zarrfs mount: one `zarrfs mount --direct` of an
# ERA5-like view, the cache warmed rank by rank (`zarrfs warm --rank/--world`,
# the share zarrfs.dali reads), then torchrun of integration/ddp/train.py with
# each reader for 1 and WORLD ranks, epoch 0 on a cold cache and epoch 1 warm,
# and the xarray + zarr-python + DataLoader (DistributedSampler) baseline.
# Prints one JSON line per run and epoch: samples/s per rank and in total, and
# whether every sample was seen exactly once; and after each cold run, where
# the chunks were decoded (by codec and device, and by GPU). With `gpus`, the
# cold epoch of WORLD ranks runs again with --decode cpu, to compare.
# Usage: integration/ddp/run.sh ZARRFS [cpu|share-gpu|gpus]
#   cpu        ranks on the CPUs (gloo): the development machine
#   share-gpu  WORLD ranks on one GPU (gloo): a one-GPU machine
#   gpus       one rank per GPU (NCCL); --gpus 0..WORLD-1 decode with --decode auto
# Environment: WORLD (default 2), STEPS (default 16), LAT/LON (default 721/1440;
# 32/64 on cpu), WORK (scratch), READERS (default "loader dali"), PYTHON.
set -uo pipefail
zarrfs=$(readlink -f "$1")
mode=${2:-gpus}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
world=${WORLD:-2}
steps=${STEPS:-16}
py=${PYTHON:-python3}
work=${WORK:-$(mktemp -d /tmp/zarrfs-ddp.XXXXXX)}
readers=${READERS:-loader dali}
lat=${LAT:-721} lon=${LON:-1440}
flags=()
case $mode in
cpu) flags=(--cpu); lat=${LAT:-32}; lon=${LON:-64} ;;
share-gpu) flags=(--share-gpu) ;;
gpus) ;;
*) echo "mode $mode: want cpu, share-gpu or gpus" >&2; exit 2 ;;
esac
export PYTHONPATH=$root/python/src${PYTHONPATH:+:$PYTHONPATH}
mnt=$work/mnt
status=0
cleanup() { "$zarrfs" unmount "$mnt" >/dev/null 2>&1; return 0; }
trap cleanup EXIT

$py "$root/integration/gpu/make_store.py" "$work/src" --steps "$steps" --lat "$lat" --lon "$lon" >&2 || exit 1
store=$work/src/era5.zarr view=$work/src/train.yaml
decode=(--decode auto)
[[ $mode == gpus ]] && decode+=(--gpus "$(seq -s, 0 $((world - 1)))")

torchrun_() { $py -m torch.distributed.run --standalone --nproc_per_node="$1" "$root/integration/ddp/train.py" "${@:2}" "${flags[@]}"; }

# mount_ CACHE DECODE...: mounts the view, direct, and waits until it is live.
mount_() {
	mkdir -p "$mnt"
	"$zarrfs" mount "$store" "$mnt" --cache "$1" --view "$view" --direct "${@:2}" >"$work/mount.log" 2>&1 &
	for _ in $(seq 300); do grep -q mounted "$work/mount.log" && break; sleep 0.1; done
}
# decoded LABEL: one JSON line of where the mount's chunks were decoded.
decoded() {
	"$zarrfs" status "$mnt" --json | $py -c '
import json, sys
d = json.load(sys.stdin)["decode"]
print(json.dumps({"label": sys.argv[1], "placement": d["placement"], "decoded": d["decoded"],
                  "gpus": [{"device": g["device"], "chunks": g.get("Chunks", 0)} for g in d.get("gpus") or []]}))' "$1"
}

for r in $readers; do
	for w in 1 "$world"; do
		# Epoch 0 reads a cold cache (the mount fills as it goes); then each
		# rank's share is warm for epoch 1. With several GPUs, the cold
		# epoch again with the CPUs alone decoding.
		colds=("${decode[*]}")
		[[ $mode == gpus && $w == "$world" ]] && colds+=("--decode cpu")
		for d in "${colds[@]}"; do
			label=$r-world$w-cold-then-warm
			[[ $d == "--decode cpu" ]] && label=$r-world$w-cold-cpu-decode-then-warm
			rm -rf "$work/cache"
			# shellcheck disable=SC2086
			mount_ "$work/cache" $d
			torchrun_ "$w" --dir "$mnt/train" --reader "$r" --epochs 2 --label "$label" || status=1
			decoded "$label" || status=1
			"$zarrfs" unmount "$mnt" || status=1
		done
		# The recommended order: warm each rank's share, then train.
		for rank in $(seq 0 $((w - 1))); do
			"$zarrfs" warm "$store" --cache "$work/cache2" --view "$view" --only train --rank "$rank" --world "$w" "${decode[@]}" >/dev/null || status=1
		done
		mount_ "$work/cache2" "${decode[@]}"
		torchrun_ "$w" --dir "$mnt/train" --reader "$r" --epochs 2 --label "$r-world$w-warmed" || status=1
		"$zarrfs" unmount "$mnt" || status=1
		rm -rf "$work/cache2"
	done
done
for w in 1 "$world"; do
	torchrun_ "$w" --reader baseline --store "$store" --view-yaml "$view" --epochs 1 --label "baseline-world$w" || status=1
done
exit $status
