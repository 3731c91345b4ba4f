#!/usr/bin/env bash
# The fill's roofline and its peers, in one run (make bench-fill; also run
# by integration/gpu/e2e.sh). For each store of the ERA5-like 21-channel
# view (integration/gpu/make_store.py: "mixed", zstd upper levels and blosc
# surface fields; "blosc", every variable blosc-lz4 shuffle):
#   roofline  the floors (read every chunk file, write blob-sized files)
#             and the fill's CPU by stage (integration/bench/fill)
#   peers     zarr-python 3, zarr-python 3 + zarrs, tensorstore reading the
#             view's arrays into RAM (peers.py)
#   warm      `zarrfs warm` of the view, whole command, into a fresh cache:
#             --decode cpu, and gpu and auto where a GPU decodes; ZARRFS_OLD
#             (another zarrfs binary) in the same run for before/after
#   cores     the same on 4 and 8 cores (taskset; CORES), where the machine
#             has 16, REPEAT times, the decoders interleaved, with each flag
#             set of VARIANTS: `auto` against `cpu` and `gpu` by core count
#             and flags (summary.py)
#   epoch     the first epoch over a cold mount: zarrfs.torch.Loader (batch
#             4, in order and shuffled) and one reader of one sample at a
#             time (plain reads; --readahead 0 and the default; and the
#             plain reader again once the mount is warm, its ceiling),
#             against `zarrfs warm` of the same samples on the same cache
#             device;
#             and, where CUDA runs, the Loader's ring slot pinned its way
#             against torch's (pin.py)
# Usage: integration/bench/fill/run.sh ZARRFS
# Environment: STEPS (samples, default 32), STORES ("mixed blosc"), PARTS
# ("roofline peers warm cores epoch"), SHM (tmpfs scratch, default
# /dev/shm/zarrfs-fill), DISK (disk scratch, default /var/tmp/zarrfs-fill),
# CACHES (cache devices of the epoch part: "shm disk"), ZARRFS_OLD,
# LOGDIR (default $DISK/logs), REUSE (1: keep stores an earlier run made), PYTHON, GO (builds the roofline tool unless
# FILLBENCH names a built one), LAT/LON (field size, default 721x1440),
# DECODERS (default cpu, and gpu and auto where a GPU decodes), PROFILE
# (a folder: the epoch part's daemons write CPU profiles there); for the
# cores part: CORES (CPU lists for taskset, or "all"; default "0-3 0-7"),
# REPEAT (runs of each, default 1; the summary takes the best and the
# median), VARIANTS (flag sets of warm, ";"-separated NAME=FLAGS, default
# "default=": none; e.g. "default=;gpu8=--gpu-memory 8GiB").
set -uo pipefail
zarrfs=$(readlink -f "$1")
old=${ZARRFS_OLD:+$(readlink -f "$ZARRFS_OLD")}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
steps=${STEPS:-32}
stores=${STORES:-mixed blosc}
parts=${PARTS:-roofline peers warm cores epoch}
shm=${SHM:-/dev/shm/zarrfs-fill}
disk=${DISK:-/var/tmp/zarrfs-fill}
caches=${CACHES:-shm disk}
logdir=${LOGDIR:-$disk/logs}
py=${PYTHON:-python3}
lat=${LAT:-721} lon=${LON:-1440}
mkdir -p "$shm" "$disk" "$logdir"
res=$logdir/fill.jsonl
status=0
ncpu=$(nproc)

log() { echo "$*" | tee -a "$logdir/fill.log" >&2; }
record() { echo "$1" >>"$res"; log "$1"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

fillbench=${FILLBENCH:-}
if [ -z "$fillbench" ] && [[ " $parts " == *" roofline "* ]]; then
	fillbench=$disk/fillbench
	(cd "$root" && ${GO:-go} build -o "$fillbench" ./integration/bench/fill) || { log "cannot build the roofline tool"; exit 1; }
fi

gpu=no
if "$zarrfs" version 2>/dev/null | grep -q "^GPU: .*nvCOMP"; then gpu=yes; fi
"$zarrfs" version >"$logdir/version.txt" 2>&1 || true
decoders="cpu"
if [ "$gpu" = yes ]; then decoders="cpu gpu auto"; fi
decoders=${DECODERS:-$decoders}
cores=${CORES:-0-3 0-7}
repeat=${REPEAT:-1}
IFS=';' read -r -a variants <<<"${VARIANTS:-default=}"

# warm_once LABEL BIN CACHE CPUS DECODE [ARGS...]: one whole `zarrfs warm` of
# the view into a fresh cache, timed; records the seconds.
warm_once() {
	local label=$1 bin=$2 cache=$3 cpus=$4 dec=$5
	shift 5
	rm -rf "$cache"
	local pin=()
	[ "$cpus" != all ] && pin=(taskset -c "$cpus")
	local t0 t1
	t0=$(now)
	if ! "${pin[@]}" "$bin" warm "$store" --cache "$cache" --view "$view" --only train --decode "$dec" "$@" >"$logdir/warm-$name-$label.log" 2>&1; then
		log "warm $label failed: $(tail -3 "$logdir/warm-$name-$label.log")"
		status=1
		return 1
	fi
	t1=$(now)
	local s dir got
	s=$(secs "$t0" "$t1")
	# The data bytes of the blobs warm wrote (their sizes less the
	# 4096-byte header), from the directory it prints for the view.
	dir=$(awk -F'\t' '$1 == "train" || $1 == "train/" { print $2 }' "$logdir/warm-$name-$label.log")
	got=$(find "$dir" -name '*.npy' -printf '%s\n' 2>/dev/null | awk '{ s += $1 - 4096 } END { printf "%d", s }')
	if [ "${got:-0}" -le 0 ]; then
		log "warm $label: no blobs found in '$dir'"
		status=1
		return 1
	fi
	# What the GPU took, as warm reports it (auto's share; none without).
	local ongpu
	ongpu=$(grep -o 'the GPU decoded [0-9]* of [0-9]* chunks' "$logdir/warm-$name-$label.log" | awk '{ print $4 "/" $6 }')
	record "{\"what\": \"warm\", \"store\": \"$name\", \"label\": \"$label\", \"decode\": \"$dec\", \"cpus\": \"$cpus\", \"flags\": \"$*\", \"gpu_chunks\": \"${ongpu:-0}\", \"seconds\": $s, \"bytes\": $got, \"gbps\": $(awk -v b="$got" -v s="$s" 'BEGIN { printf "%.3f", b / s / 1e9 }')}"
}

for name in $stores; do
	src=$disk/$name
	# REUSE=1 keeps a store an earlier run wrote with the same settings.
	[ "${REUSE:-}" = 1 ] && [ -f "$src/made" ] && [ "$(cat "$src/made")" = "$steps $name $lat $lon" ] ||
	(cd "$root" && rm -f "$src/made" && $py integration/gpu/make_store.py "$src" --steps "$steps" --unique $((steps < 24 ? steps : 24)) --codecs "$name" --lat "$lat" --lon "$lon" && echo "$steps $name $lat $lon" >"$src/made") >>"$logdir/fill.log" 2>&1 ||
		{ log "make_store $name failed"; status=1; continue; }
	store=$src/era5.zarr view=$src/train.yaml
	cat $(find "$store" -type f) >/dev/null
	log "== $name: $steps samples, $(du -sh "$store" | cut -f1) compressed, $ncpu CPUs, GPU $gpu"

	if [[ " $parts " == *" roofline "* ]]; then
		for dec in $decoders; do
			log "-- roofline, --decode $dec, cache on tmpfs"
			"$fillbench" -store "$store" -view "$view" -cache "$shm/roofline" -decode "$dec" -label "$name" -json "$res" 2>&1 | tee -a "$logdir/fill.log" || status=1
		done
		rm -rf "$shm/roofline"
	fi

	if [[ " $parts " == *" peers "* ]]; then
		for r in zarr-python zarrs tensorstore; do
			out=$($py "$here/peers.py" "$store" "$view" --reader "$r" 2>>"$logdir/fill.log") || { log "peer $r failed"; continue; }
			record "$(echo "$out" | $py -c "import json,sys; d=json.loads(sys.stdin.read()); d['store']='$name'; print(json.dumps(d))")"
		done
	fi

	if [[ " $parts " == *" warm "* ]]; then
		for dec in $decoders; do
			warm_once "new-$dec" "$zarrfs" "$shm/warm" all "$dec"
			[ -n "$old" ] && warm_once "old-$dec" "$old" "$shm/warm" all "$dec"
			warm_once "new-$dec-2" "$zarrfs" "$shm/warm" all "$dec"
			[ -n "$old" ] && warm_once "old-$dec-2" "$old" "$shm/warm" all "$dec"
		done
	fi

	if [[ " $parts " == *" cores "* ]] && [ "$ncpu" -ge 16 ]; then
		# Labels new-DECODE-CPUS[-VARIANT]; a label's runs are its repeats.
		for _ in $(seq "$repeat"); do
			for cpus in $cores; do
				for v in "${variants[@]}"; do
					vname=${v%%=*} vflags=${v#*=} sfx=
					[ "$vname" != default ] && sfx=-$vname
					for dec in $decoders; do
						# shellcheck disable=SC2086 # the variant's flags split into words
						warm_once "new-$dec-$cpus$sfx" "$zarrfs" "$shm/warm" "$cpus" "$dec" $vflags
						# shellcheck disable=SC2086
						[ -n "$old" ] && warm_once "old-$dec-$cpus$sfx" "$old" "$shm/warm" "$cpus" "$dec" $vflags
					done
				done
			done
		done
	fi
	rm -rf "$shm/warm"

	if [[ " $parts " == *" epoch "* ]]; then
		# The Loader's ring slots, pinned its way and torch's (GPU only).
		if [ "$gpu" = yes ] || $py -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
			out=$(PYTHONPATH=$root/python/src${PYTHONPATH:+:$PYTHONPATH} $py "$here/pin.py" 2>>"$logdir/fill.log") && record "$(echo "$out" | $py -c "import json,sys; d=json.loads(sys.stdin.read()); d['store']='$name'; print(json.dumps(d))")"
		fi
		# epoch HOW: one epoch.py run over the mount; epoch_fields HOW DCPU:
		# its JSON line (stdin) as recorded, against this cache's warm.
		epoch() { PYTHONPATH=$root/python/src${PYTHONPATH:+:$PYTHONPATH} $py "$here/epoch.py" "$mnt/train" --how "$1" 2>>"$logdir/fill.log"; }
		epoch_fields() { $py -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(how='$1', store='$name', cache='$where', daemon_cpu_s=$2, warm_samples_per_s=round($steps/$warm_s, 2), vs_warm=round(d['samples_per_s']*$warm_s/$steps, 3)); print(json.dumps(d))"; }
		for where in $caches; do
			case $where in shm) base=$shm ;; *) base=$disk ;; esac
			cache=$base/epoch-cache
			warm_once "epoch-warm-$where" "$zarrfs" "$cache" all cpu
			warm_s=$(tail -1 "$res" | $py -c "import json,sys; print(json.loads(sys.stdin.read())['seconds'])")
			for how in loader loader-shuffled plain plain-ra0; do
				rm -rf "$cache"
				mnt=$disk/mnt
				umount -l "$mnt" 2>/dev/null
				mkdir -p "$mnt"
				ra=()
				[ "$how" = plain-ra0 ] && ra=(--readahead 0)
				prof=()
				[ -n "${PROFILE:-}" ] && prof=(--cpuprofile "$PROFILE/$name-$where-$how.prof")
				"$zarrfs" mount "$store" "$mnt" --cache "$cache" --view "$view" --decode cpu "${ra[@]}" "${prof[@]}" >"$logdir/mount-$name-$how.log" 2>&1 &
				mpid=$!
				for _ in $(seq 200); do grep -q "mounted" "$logdir/mount-$name-$how.log" && break; sleep 0.1; done
				out=$(epoch "$how") || { log "epoch $how failed"; status=1; }
				# The daemon's CPU seconds (user and system) over its life:
				# the fills of the epoch, beside the reader's own cpu_s.
				dcpu=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$mpid/stat" 2>/dev/null)
				# The same reader again over the mount its epoch warmed: what
				# one reader of one sample at a time gets with no fill to
				# wait for, the ceiling of the cold plain epochs.
				again=
				if [ "$how" = plain-ra0 ]; then
					again=$(epoch plain) || { log "plain reader of the warm mount failed"; status=1; }
				fi
				"$zarrfs" unmount "$mnt" >/dev/null 2>&1 || umount -l "$mnt"
				wait "$mpid"
				# The daemon's CPU, taken before the warm read, is the cold
				# epoch's; the warm read is recorded without it.
				[ -n "$out" ] && record "$(echo "$out" | epoch_fields "$how" "${dcpu:-None}")"
				[ -n "$again" ] && record "$(echo "$again" | epoch_fields plain-warm None)"
			done
			rm -rf "$cache"
		done
	fi
done
$py "$here/summary.py" "$res" | tee "$logdir/fill-summary.md"
exit $status
