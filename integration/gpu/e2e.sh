#!/usr/bin/env bash
# End-to-end runs of zarrfs on a GPU machine, on an ERA5-like 21-channel view
# (make_store.py), every figure a ratio against a peer measured in the same run:
#   store   write the store (on disk), read it once into the page cache
#   warm    `zarrfs warm` of the view on the disk against its parallel write
#           ceiling (dd, 4 writers, fsync), before/after when ZARRFS_OLD is
#           given; on tmpfs with --decode cpu, gpu and auto (decode-bound),
#           GPU and auto blobs compared with the CPU's byte for byte
#   cold    the first epoch through a cold mount (DALI's CPU reader, batch 4,
#           8 threads) against `zarrfs warm` of the same samples, per decoder
#           and readahead depth
#   direct  direct mode: DALI's GPU reader (cuFile) and CPU reader over a warm
#           direct mount against plain .npy files with the same bytes on the
#           same filesystem; the first epoch over a cold direct mount; kvikio
#           CuFile (compatibility mode on and off) through direct links, cold
#           and warm; every sample checked against numpy
#   loader  zarrfs.torch.Loader from a warm mount against plain preads into
#           pinned memory then the GPU on plain files, and DALI's CPU reader
#   memory  GPU memory of the daemon (nvidia-smi) while filling with the
#           default --gpu-memory, and after --gpu-idle; fill rate at the default
#           budget against a large one
#   baseline xarray + zarr-python + DataLoader (16 workers) over the store
#   fill    the fill's roofline and its peers (integration/bench/fill/run.sh,
#           both codec mixes, STEPS samples), logged under $LOGDIR/fill
# Usage: integration/gpu/e2e.sh ZARRFS   (PARTS="store warm ..." picks parts)
# Environment: STEPS (samples, default 64), DISK (scratch on the machine's
# disk, default /var/tmp/zarrfs-e2e), SHM (tmpfs scratch, default
# /dev/shm/zarrfs-e2e), LOGDIR (default $DISK/logs), PYTHON, ZARRFS_OLD,
# FILL_PARTS (the parts of bench/fill/run.sh that the fill part runs, default
# all of them) and FILLBENCH (its roofline tool, built with Go when unset).
set -uo pipefail
zarrfs=$(readlink -f "$1")
old=${ZARRFS_OLD:+$(readlink -f "$ZARRFS_OLD")}
here=$(cd "$(dirname "$0")" && pwd)
steps=${STEPS:-64}
disk=${DISK:-/var/tmp/zarrfs-e2e}
shm=${SHM:-/dev/shm/zarrfs-e2e}
logdir=${LOGDIR:-$disk/logs}
py=${PYTHON:-python3}
parts=${PARTS:-store warm cold direct loader memory baseline fill}
mkdir -p "$disk" "$shm" "$logdir"
res=$logdir/results.jsonl
store=$disk/src/era5.zarr view=$disk/src/train.yaml
status=0
rm -f "$logdir/warm-failed"
mounts=()

log() { echo "$*" | tee -a "$logdir/e2e.log" >&2; }
record() { echo "$1" >>"$res"; log "$1"; }
now() { date +%s.%N; }
rate() { awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN { printf "%.2f", n / (b - a) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "null" }'; }
# train_blobs CACHE: the cache's folder of the view's samples.
train_blobs() { find "$1/blobs" -mindepth 2 -maxdepth 2 -type d -name train | head -1; }
cleanup() {
	for m in "${mounts[@]}"; do
		"$zarrfs" unmount "$m" --timeout 10s >/dev/null 2>&1 || umount -l "$m" 2>/dev/null || true
	done
	return 0
}
trap cleanup EXIT

# cuFile in a VM without a udev database cannot tell a block device's
# filesystem: give it the record it looks for (compatibility mode).
udev_for() {
	local d
	d=$(stat -c %D "$1")
	mkdir -p /run/udev/data
	printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(stat -f -c %T "$1")" >"/run/udev/data/b$((16#${d:0:-2})):$((16#${d: -2}))"
}

# mount_view NAME CACHE ARGS...: mounts the store with the view at
# $disk/mnt-NAME; sets mnt (the mountpoint) and mpid (the daemon).
mount_view() {
	local name=$1 cache=$2
	shift 2
	mnt=$disk/mnt-$name
	umount -l "$mnt" 2>/dev/null || true
	mkdir -p "$mnt"
	"$zarrfs" mount "$store" "$mnt" --cache "$cache" --view "$view" "$@" >"$logdir/mount-$name.log" 2>&1 &
	mpid=$!
	mounts+=("$mnt")
	for _ in $(seq 300); do
		grep -q "mounted" "$logdir/mount-$name.log" && return 0
		kill -0 "$mpid" 2>/dev/null || break
		sleep 0.1
	done
	log "mount $name failed: $(tail -3 "$logdir/mount-$name.log")"
	status=1
}
unmount() {
	"$zarrfs" unmount "$1" --timeout 30s 2>>"$logdir/e2e.log" || umount -l "$1" 2>/dev/null
	return 0
}

reader() { # KIND ROOT LABEL [args]: one JSON line into the results
	local kind=$1 root=$2 label=$3
	shift 3
	local out
	rm -f "$logdir/last-rate"
	out=$($py "$here/readers.py" "$kind" "$root" --label "$label" "$@" 2>>"$logdir/readers.err")
	# kvikio with compatibility mode off needs true GDS (nvidia-fs): its
	# failure there is the machine's, reported but not failed.
	[[ $? == 0 || ${KVIKIO_COMPAT_MODE:-} == OFF ]] || status=1
	record "$out"
	echo "$out" | sed -n 's/.*"rate": \([0-9.]*\).*/\1/p' >"$logdir/last-rate"
}
last_rate() {
	local r
	r=$(cat "$logdir/last-rate" 2>/dev/null)
	echo "${r:-0}"
}

warm_view() { # BINARY CACHE DECODE [VIEW]: warms the view, echoes samples/s
	local bin=$1 cache=$2 dec=$3 t0 t1 v=${4:-$view}
	rm -rf "$cache"
	sync
	t0=$(now)
	if ! "$bin" warm "$store" --cache "$cache" --view "$v" --only train --decode "$dec" >>"$logdir/warm.log" 2>&1; then
		log "warm $dec failed: $(tail -1 "$logdir/warm.log")"
		# Called in $(...): a subshell's status would be lost.
		touch "$logdir/warm-failed"
		echo 0
		return
	fi
	t1=$(now)
	rate "$steps" "$t0" "$t1"
}

log "== $("$zarrfs" version | tr '\n' ' ') | $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader) | $(nproc) cores"

if [[ $parts == *store* ]]; then
	log "== store: $steps steps"
	$py "$here/make_store.py" "$disk/src" --steps "$steps" 2>&1 | tee -a "$logdir/e2e.log"
fi
cat $(find "$store" -type f) >/dev/null

if [[ $parts == *warm* ]]; then
	log "== warm: disk ceiling (dd, 4 writers, 1 GiB each, fsync)"
	t0=$(now)
	for i in 1 2 3 4; do dd if=/dev/zero of="$disk/dd.$i" bs=16M count=64 conv=fsync status=none & done
	wait
	t1=$(now)
	rm -f "$disk"/dd.*
	ceiling=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", 4 * 1.073741824 / (b - a) }')
	sample_gb=$(awk 'BEGIN { printf "%.5f", (4096 + 21 * 721 * 1440 * 4) / 1e9 }')
	for dec in cpu auto; do
		r=$(warm_view "$zarrfs" "$disk/cache-warm-$dec" "$dec")
		gbs=$(awk -v r="$r" -v s="$sample_gb" 'BEGIN { printf "%.2f", r * s }')
		record "{\"part\":\"warm-disk\",\"decode\":\"$dec\",\"rate\":$r,\"gbs\":$gbs,\"ceiling_gbs\":$ceiling,\"x_ceiling\":$(ratio "$gbs" "$ceiling")}"
		rm -rf "$disk/cache-warm-$dec"
	done
	if [[ -n $old ]]; then
		r0=$(warm_view "$old" "$disk/cache-warm-old" cpu "$disk/src/train-levels.yaml")
		r1=$(warm_view "$zarrfs" "$disk/cache-warm-new" cpu)
		record "{\"part\":\"warm-disk-before-after\",\"old_rate\":$r0,\"new_rate\":$r1,\"x_old\":$(ratio "$r1" "$r0")}"
		rm -rf "$disk/cache-warm-old" "$disk/cache-warm-new"
	fi
	log "== warm on tmpfs: cpu / gpu / auto"
	declare -A tr=()
	for dec in cpu gpu auto; do
		tr[$dec]=$(warm_view "$zarrfs" "$shm/cache-$dec" "$dec")
	done
	for dec in gpu auto; do
		same=$(diff -rq "$shm/cache-cpu/blobs" "$shm/cache-$dec/blobs" >/dev/null 2>&1 && echo true || echo false)
		[[ $same == true ]] || status=1
		record "{\"part\":\"warm-tmpfs\",\"decode\":\"$dec\",\"rate\":${tr[$dec]},\"cpu_rate\":${tr[cpu]},\"x_cpu\":$(ratio "${tr[$dec]}" "${tr[cpu]}"),\"blobs_equal_cpu\":$same}"
	done
	rm -rf "$shm"/cache-*
fi

if [[ $parts == *cold* ]]; then
	log "== cold first epoch through the mount (DALI CPU reader, batch 4, 8 threads) vs warm"
	wr=$(warm_view "$zarrfs" "$disk/cache-cold-ref" cpu)
	rm -rf "$disk/cache-cold-ref"
	for cfg in "cpu 8" "auto 8" "cpu 2" "auto 16"; do
		set -- $cfg
		rm -rf "$disk/cache-cold"
		mount_view cold "$disk/cache-cold" --decode "$1" --readahead "$2"
		reader dali-cpu "$mnt/train" "cold-$1-ra$2" --batch 4 --threads 8
		record "{\"part\":\"cold\",\"decode\":\"$1\",\"readahead\":$2,\"rate\":$(last_rate),\"warm_rate\":$wr,\"x_warm\":$(ratio "$(last_rate)" "$wr")}"
		unmount "$mnt"
	done
	rm -rf "$disk/cache-cold"
fi

if [[ $parts == *direct* ]]; then
	log "== direct mode"
	cache=$disk/cache-direct
	warm_view "$zarrfs" "$cache" cpu >/dev/null
	blobdir=$(train_blobs "$cache")
	rm -rf "$disk/plain"
	mkdir -p "$disk/plain"
	cp -r "$blobdir" "$disk/plain/train"
	udev_for "$(ls -d "$disk"/plain/train/*.npy | head -1)"
	mount_view direct "$cache" --direct
	ref=$disk/plain/train
	reader dali-gpu "$ref" "dali-gpu-plain" --batch 4 --threads 8
	plain=$(last_rate)
	reader dali-gpu "$mnt/train" "dali-gpu-direct-warm" --batch 4 --threads 8
	record "{\"part\":\"direct\",\"what\":\"dali-gpu warm direct vs plain\",\"x_plain\":$(ratio "$(last_rate)" "$plain")}"
	reader dali-gpu "$mnt/train" "dali-gpu-direct-warm-checked" --batch 4 --threads 8 --check "$ref"
	reader dali-cpu "$ref" "dali-cpu-plain" --batch 4 --threads 8
	plain=$(last_rate)
	reader dali-cpu "$mnt/train" "dali-cpu-direct-warm" --batch 4 --threads 8
	record "{\"part\":\"direct\",\"what\":\"dali-cpu warm direct vs plain\",\"x_plain\":$(ratio "$(last_rate)" "$plain")}"
	reader dali-cpu "$mnt/train" "dali-cpu-direct-warm-checked" --batch 4 --threads 8 --check "$ref"
	for compat in ON OFF; do
		KVIKIO_COMPAT_MODE=$compat reader kvikio "$mnt/train" "kvikio-compat-$compat-warm" --threads 8 --check "$ref"
	done
	unmount "$mnt"
	wr=$(warm_view "$zarrfs" "$disk/cache-direct-ref" cpu)
	rm -rf "$disk/cache-direct-ref" "$disk/cache-direct-cold"
	mount_view direct-cold "$disk/cache-direct-cold" --direct
	reader dali-gpu "$mnt/train" "dali-gpu-direct-cold" --batch 4 --threads 8 --files
	record "{\"part\":\"direct\",\"what\":\"dali-gpu cold direct first epoch vs warm\",\"rate\":$(last_rate),\"warm_rate\":$wr,\"x_warm\":$(ratio "$(last_rate)" "$wr")}"
	reader dali-gpu "$mnt/train" "dali-gpu-direct-cold-then-checked" --batch 4 --threads 8 --files --check "$ref"
	dmnt=$mnt
	mount_view direct-ref "$disk/cache-direct-ref"
	pmnt=$mnt
	for compat in ON OFF; do
		KVIKIO_COMPAT_MODE=$compat reader kvikio "$dmnt/t" "kvikio-compat-$compat-cold-array" --threads 8 --check "$pmnt/t"
	done
	unmount "$dmnt"
	unmount "$pmnt"
	rm -rf "$disk/cache-direct-cold" "$disk/cache-direct-ref"
fi

if [[ $parts == *loader* ]]; then
	log "== loader: zarrfs.torch.Loader vs plain pread -> pinned -> GPU, and DALI"
	cache=$disk/cache-direct
	[[ -d $cache ]] || warm_view "$zarrfs" "$cache" cpu >/dev/null
	[[ -d $disk/plain/train ]] || { mkdir -p "$disk/plain"; cp -r "$(train_blobs "$cache")" "$disk/plain/train"; }
	cat "$disk"/plain/train/* >/dev/null
	mount_view loader "$cache"
	cat "$mnt"/train/* >/dev/null
	reader pread "$disk/plain/train" "pread-plain" --threads 16
	limit=$(last_rate)
	reader pread "$mnt/train" "pread-mount" --threads 16
	reader loader "$mnt/train" "loader-mount" --batch 4 --threads 16
	lr=$(last_rate)
	reader dali-cpu "$mnt/train" "dali-cpu-mount" --batch 4 --threads 8
	record "{\"part\":\"loader\",\"rate\":${lr:-0},\"pread_limit\":$limit,\"x_limit\":$(ratio "${lr:-0}" "$limit"),\"x_dali\":$(ratio "${lr:-0}" "$(last_rate)")}"
	unmount "$mnt"
	rm -rf "$disk/cache-loader-cold"
	mount_view loader-cold "$disk/cache-loader-cold"
	reader loader "$mnt/train" "loader-cold" --batch 4 --threads 16 --epochs 1
	unmount "$mnt"
	rm -rf "$disk/cache-loader-cold"
fi

if [[ $parts == *memory* ]]; then
	log "== GPU memory of the daemon (nvidia-smi) during a fill (cat of every sample) and after --gpu-idle"
	for cfg in default big; do
		args=(--decode gpu --gpu-idle 15s)
		[[ $cfg == big ]] && args+=(--gpu-memory 16GiB --pinned-memory 16GiB)
		rm -rf "$shm/cache-mem"
		mount_view mem "$shm/cache-mem" "${args[@]}"
		pid=$mpid
		# The daemon's GPU memory as nvidia-smi sees it (context included),
		# and what zarrfs status says the decoder holds (context excluded).
		(while kill -0 "$pid" 2>/dev/null; do
			smi=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | awk -v p="$pid" -F', ' '$1 == p { print $2 }')
			held=$("$zarrfs" status "$mnt" --json 2>/dev/null | $py -c 'import json,sys; d=json.load(sys.stdin)["decode"]; print(d["gpu_device_bytes"] >> 20, d["gpu_pinned_bytes"] >> 20)' 2>/dev/null)
			echo "$(date +%s.%N) ${smi:-na} ${held:-na na}"
			sleep 0.25
		done) >"$logdir/mem-$cfg.txt" &
		poll=$!
		t0=$(now)
		cat "$mnt"/train/*.npy >/dev/null
		r=$(rate "$steps" "$t0" "$(now)")
		peak=$(awk '$2 != "na" { print $2 }' "$logdir/mem-$cfg.txt" | sort -n | tail -1)
		peakheld=$(awk '$3 != "na" { print $3 }' "$logdir/mem-$cfg.txt" | sort -n | tail -1)
		sleep 25
		after=$(tail -1 "$logdir/mem-$cfg.txt" | awk '{ print $2 }')
		afterheld=$(tail -1 "$logdir/mem-$cfg.txt" | awk '{ print $3 }')
		rss=$(awk '/VmHWM/ { print $2 }' "/proc/$pid/status")
		kill "$poll" 2>/dev/null
		record "{\"part\":\"memory\",\"budget\":\"$cfg\",\"rate\":$r,\"smi_peak_mib\":\"${peak:-na}\",\"smi_after_idle_mib\":\"${after:-na}\",\"held_device_peak_mib\":\"${peakheld:-na}\",\"held_device_after_idle_mib\":\"${afterheld:-na}\",\"peak_rss_kib\":${rss:-0}}"
		unmount "$mnt"
	done
	rm -rf "$shm/cache-mem"
fi

if [[ $parts == *baseline* ]]; then
	log "== baseline: xarray + zarr-python + DataLoader (16 workers)"
	reader baseline "$store" "baseline" --view "$view" --threads 16 --batch 4 --n 32
fi
if [[ $parts == *fill* ]]; then
	log "== fill: roofline, peers, warm, first epoch (integration/bench/fill/run.sh)"
	# run.sh reads PARTS too: it gets its own (FILL_PARTS), not this script's.
	PARTS=${FILL_PARTS:-roofline peers warm cores epoch} STEPS=$steps LOGDIR=$logdir/fill DISK=$disk/fill SHM=$shm/fill \
		bash "$here/../bench/fill/run.sh" "$zarrfs" || status=1
	rm -rf "$shm/fill"
fi
[[ -e $logdir/warm-failed ]] && status=1
log "== e2e status $status"
exit $status
