#!/usr/bin/env bash
# End-to-end GPU check and fill-rate comparison of zarrfs, for a machine
# with an NVIDIA GPU, its driver and nvCOMP (see run.sh for ZARRFS_NVCOMP_LIB):
#   1. gpuview writes two ERA5-like stores (20 float32 variables of
#      (time, 721, 1440), one chunk per time step; zstd level 3, and blosc
#      lz4 + byte shuffle) and prints the decode-level fill rate of a
#      20-channel sample with the CPU and the GPU decoders;
#   2. `zarrfs warm` fills a 20-channel view of each store into a cache with
#      --decode cpu and with --decode gpu (the cache on tmpfs, so that the
#      disk does not bound the rate), timed; every blob of the GPU cache must
#      equal the CPU cache's, byte for byte;
#   3. `zarrfs mount` with each decoder on a fresh cache: numpy reads every
#      view file through FUSE with 8 threads (the first epoch's read rate,
#      timed), then every view file and array sample is compared with the
#      CPU cache's blobs.
# Steps 2 and 3 fail unless the GPU decoded what the decoder promises (with
# --decode gpu every chunk), as its own counters say: warm prints them, the
# mount serves them as metrics. Otherwise "equal to the CPU's" could compare
# the CPU with itself. Auto promises no share: it starts the GPU only once
# the CPU has been busy for a while and keeps it only for codecs where it
# measured it paying, so a short fill may leave it all to the CPU.
# Usage: integration/gpu/fill.sh ZARRFS GPUVIEW   (binaries built with
#   CGO_ENABLED=0 go build -o ZARRFS ./cmd/zarrfs
#   CGO_ENABLED=0 go build -o GPUVIEW ./integration/bench/gpuview)
# Environment: STEPS (samples per store, default 64), JOBS (warm --jobs,
# default 16), WORK (scratch folder, default under /dev/shm), LOGDIR,
# DECODE (the decoders compared with the CPU, default "gpu auto"; cpu
# checks the script itself on a machine without a GPU).
set -euo pipefail
zarrfs=$(readlink -f "$1")
gpuview=$(readlink -f "$2")
steps=${STEPS:-64}
jobs=${JOBS:-16}
work=${WORK:-$(mktemp -d -p /dev/shm zarrfs-fill.XXXXXX)}
logdir=${LOGDIR:-$work}
mkdir -p "$logdir"
cleanup() {
	for m in "$work"/mnt-*; do [[ -d $m ]] && { fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }; done
	[[ -z ${WORK:-} ]] && rm -rf "$work"
	return 0
}
trap cleanup EXIT
status=0
gpu=${DECODE:-gpu auto}

# gpu_decoded DECODE ONGPU TOTAL: whether the GPU decoded what --decode
# DECODE promises: with gpu every chunk; cpu and auto promise nothing.
gpu_decoded() {
	case $1 in
	gpu) [[ -n $2 && -n $3 && $3 -gt 0 && $2 -eq $3 ]] ;;
	*) return 0 ;;
	esac
}

# gpu_share WHAT DECODE ONGPU TOTAL: says what the GPU decoded, and, where
# it decoded nothing (auto that left the fill to the CPU), that the
# comparison with the CPU's bytes was the CPU's against its own.
gpu_share() {
	[[ $2 == cpu* ]] && return 0
	if [[ -z $3 || $3 == 0 ]]; then
		echo "$1 --decode $2: the GPU decoded none of ${4:-the} chunks: its comparison is the CPU's bytes against the CPU's"
	else
		echo "$1 --decode $2: the GPU decoded $3 of $4 chunks"
	fi
}

echo "== $("$zarrfs" version | tr '\n' ' ')"
echo "== decode-level fill rate (gpuview)"
"$gpuview" -dir "$work/stores" -steps "$steps" -passes 3 -readers 1,4,8,16 -decoders cpu,gpu,auto 2>&1 | tee "$logdir/gpuview.log"

{
	echo "views:"
	echo "  - name: train"
	echo "    channels:"
	for i in $(seq -w 0 19); do echo "      - var: v$i"; done
} >"$work/view.yaml"

echo "== zarrfs warm of the 20-channel view, --decode cpu vs gpu ($steps samples, --jobs $jobs, cache on tmpfs)"
printf '%-10s %-6s %10s %12s %8s\n' store decode seconds "GB/s" "x cpu"
for store in zstd blosc-lz4; do
	declare -A rate=()
	failed=0
	for dec in cpu $gpu; do
		[[ $dec == cpu && -n ${rate[cpu]:-} ]] && dec=cpu2
		cache=$work/cache-$store-$dec
		rm -rf "$cache"
		t0=$(date +%s.%N)
		if ! "$zarrfs" warm "$work/stores/$store" --cache "$cache" --cache-size 100GiB --view "$work/view.yaml" --only train \
			--decode "${dec%2}" --jobs "$jobs" >"$logdir/warm-$store-$dec.log" 2>&1; then
			echo "warm $store --decode ${dec%2} failed:"; tail -5 "$logdir/warm-$store-$dec.log"; status=1; failed=1; continue
		fi
		t1=$(date +%s.%N)
		bytes=$(find "$cache" -path '*/train/*.npy' -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
		secs=$(awk "BEGIN {print $t1 - $t0}")
		rate[$dec]=$(awk "BEGIN {print $bytes / $secs / 1e9}")
		x=$(awk "BEGIN {print ${rate[$dec]} / ${rate[cpu]}}")
		printf '%-10s %-6s %10.2f %12.2f %8.2f\n' "$store" "$dec" "$secs" "${rate[$dec]}" "$x"
	done
	[[ $failed == 1 ]] && continue
	# Every blob of the other caches equals the CPU cache's.
	(cd "$work/cache-$store-cpu" && find . -path '*/train/*.npy' -type f | sort | xargs sha256sum) >"$work/sum-cpu"
	for dec in $gpu; do
		(cd "$work/cache-$store-$dec" && find . -path '*/train/*.npy' -type f | sort | xargs sha256sum) >"$work/sum-$dec"
		n=$(wc -l <"$work/sum-cpu")
		if [[ $n -ne $steps ]] || ! cmp -s "$work/sum-cpu" "$work/sum-$dec"; then
			echo "FAIL: $store: the blobs warmed with --decode $dec differ from the CPU's ($n files)"; status=1
		else
			echo "$store: all $n view blobs warmed with --decode $dec equal the CPU's"
		fi
		grep -h -iE 'falling back|fallback|error' "$logdir/warm-$store-$dec.log" | head -3 || true
		# The comparison means something only if the GPU decoded the
		# chunks: its own counters, printed by warm, say how many.
		ongpu='' total=''
		read -r ongpu total < <(sed -n 's/^zarrfs: the GPU decoded \([0-9]*\) of \([0-9]*\) chunks.*/\1 \2/p' "$logdir/warm-$store-$dec.log") || true
		if ! gpu_decoded "$dec" "${ongpu:-}" "${total:-}"; then
			echo "FAIL: $store: warm --decode $dec: the GPU decoded ${ongpu:-no} of ${total:-?} chunks"; status=1
		else
			gpu_share "$store: warm" "$dec" "${ongpu:-}" "${total:-}"
		fi
		[[ $store == zstd ]] || rm -rf "$work/cache-$store-$dec"
	done
done

echo "== zarrfs mount, first read of every view file by numpy (8 threads), then every file checked against the CPU-warmed blobs"
printf '%-10s %-6s %10s %12s %8s\n' store decode seconds "GB/s" "x cpu"
store=zstd
ref=$(cd "$work/cache-$store-cpu" && dirname "$(find . -path '*/train/0*.npy' | head -1)")
declare -A mrate=()
for dec in cpu $gpu; do
	[[ $dec == cpu && -n ${mrate[cpu]:-} ]] && continue
	mnt=$work/mnt-$dec
	mkdir -p "$mnt"
	rm -rf "$work/cache-mount"
	"$zarrfs" mount "$work/stores/$store" "$mnt" --cache "$work/cache-mount" --view "$work/view.yaml" --decode "$dec" \
		--metrics 127.0.0.1:0 >"$logdir/mount-$dec.log" 2>&1 &
	pid=$!
	for _ in $(seq 200); do [[ -f $mnt/train.json ]] && break; sleep 0.1; done
	metrics=$(grep -o 'http://[^ ]*/metrics' "$logdir/mount-$dec.log" | head -1)
	out=$(python3 - "$mnt" "$work/cache-$store-cpu/$ref" "$metrics" <<'PY'
import sys, os, time, urllib.request, numpy as np, concurrent.futures as cf
mnt, ref, metrics = sys.argv[1], sys.argv[2], sys.argv[3]
names = sorted(os.listdir(os.path.join(mnt, "train")))
t0 = time.monotonic()
with cf.ThreadPoolExecutor(8) as ex:
    nbytes = sum(ex.map(lambda n: np.load(os.path.join(mnt, "train", n)).nbytes, names))
dt = time.monotonic() - t0
def check(n):
    a = np.load(os.path.join(mnt, "train", n))
    b = np.load(os.path.join(ref, n))
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
with cf.ThreadPoolExecutor(8) as ex:
    ok = list(ex.map(check, names))
# the array samples too (one variable through its own directory)
v = sorted(os.listdir(os.path.join(mnt, "v07")))
same = all(np.array_equal(np.load(os.path.join(mnt, "v07", v[i])), np.load(os.path.join(ref, names[i]))[7], equal_nan=True)
           for i in range(len(v)))
# what the daemon decoded, and how much of it on the GPU (its own counters)
counts = {}
for line in urllib.request.urlopen(metrics).read().decode().splitlines():
    name, _, value = line.partition(" ")
    if name in ("zarrfs_chunks_decoded_total", "zarrfs_gpu_chunks_decoded_total"):
        counts[name] = int(float(value))
print(dt, nbytes, sum(ok), len(ok), same, counts.get("zarrfs_gpu_chunks_decoded_total", "-"), counts.get("zarrfs_chunks_decoded_total", "-"))
PY
)
	kill -TERM $pid; wait $pid || { echo "mount --decode $dec exited with $?"; status=1; }
	grep -iE 'level=error|panic' "$logdir/mount-$dec.log" | head -3 || true
	read -r secs nbytes nok nfiles same ongpu total <<<"$out"
	if [[ -z ${nfiles:-} || $nok != "$nfiles" || $nfiles == 0 || $same != True ]]; then
		echo "FAIL: mount --decode $dec: $out"; status=1; continue
	fi
	[[ $ongpu == - ]] && ongpu=''
	[[ $total == - ]] && total=''
	if ! gpu_decoded "$dec" "${ongpu:-}" "${total:-}"; then
		echo "FAIL: mount --decode $dec: the GPU decoded ${ongpu:-no} of ${total:-?} chunks"; status=1; continue
	fi
	gpu_share mount "$dec" "${ongpu:-}" "${total:-}"
	mrate[$dec]=$(awk "BEGIN {print $nbytes / $secs / 1e9}")
	printf '%-10s %-6s %10.2f %12.2f %8.2f   (%s of %s files equal the CPU-warmed ones)\n' "$store" "$dec" "$secs" "${mrate[$dec]}" \
		"$(awk "BEGIN {print ${mrate[$dec]} / ${mrate[cpu]}}")" "$nok" "$nfiles"
done

if [[ $status == 0 ]]; then echo "GPU FILL: PASS"; else echo "GPU FILL: FAIL"; fi
exit $status
