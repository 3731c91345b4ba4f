#!/usr/bin/env bash
# GPU checks of zarrfs (the `make test-gpu` suite), for a machine with an
# NVIDIA GPU, its driver and nvCOMP:
#   1. every GPU test of package gpu: the codec test vectors (written by
#      numcodecs) and many generated chunks of every codec decoded on the GPU
#      and compared byte for byte with the CPU decoder, byte swapping,
#      concurrent callers;
#   2. damaged chunks mixed with good ones (run on their own, one process
#      per codec and damage, so that a device fault cannot spoil the other
#      results), in the shipped configuration and with each opt-in option
#      (Options.Deflate, Options.Unverified): none may return a wrong byte,
#      accept a chunk that the CPU decoder rejects, call corrupt one it
#      decodes, or hold its callers past the watchdog when nvCOMP hangs;
#      and what nvCOMP's deflate decoder does to its neighbours, and that
#      the fence stops it;
#   3. decode throughput on ERA5-like chunks (721x1440 float32, zstd level 3,
#      blosc lz4 + shuffle, blosc zstd + shuffle, lz4): GPU against the CPU decoder on one core and
#      on all cores, in one run, printed as a table.
#
# Usage: integration/gpu/run.sh [TEST_BINARY]
#   Without TEST_BINARY, Go builds it. A machine without Go runs a binary
#   built elsewhere with:
#     CGO_ENABLED=0 go test -c -o gpu.test ./gpu
# Environment:
#   ZARRFS_NVCOMP_LIB  libnvcomp.so.6 (or its folder), when not on the
#                      loader path nor in a Python site-packages folder
#                      (pip install nvidia-libnvcomp-cu13)
#   GPU_CHUNKS         chunks per codec in the throughput run (default 128)
#   GPU_SEEDS          damaged copies per chunk and kind of damage (default 8)
#   REGEN_PTX=1        compile gpu/kernels/kernels.cu with nvcc and test that
#                      PTX instead of the embedded one (a copy lands in LOGDIR)
#   LOGDIR             where logs go (default: a temporary folder)
#   SKIP_THROUGHPUT=1  tests only
#   GPU_UNVERIFIED_TIMEOUT  the limit of each Options.Unverified case (60s):
#                      nvCOMP may hang on damaged blosc-zstd there; the
#                      watchdog (Options.RoundTimeout, 5 s and more for
#                      larger rounds) must release the test well before
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
logdir=${LOGDIR:-$(mktemp -d)}
mkdir -p "$logdir"
bin=${1:-}
if [[ -z $bin ]]; then
	bin=$logdir/gpu.test
	(cd "$root" && CGO_ENABLED=0 go test -c -o "$bin" ./gpu) || exit 1
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/nvidia-smi: /'
echo "CPU cores: $(nproc)"

ptxflag=()
if [[ ${REGEN_PTX:-0} == 1 ]]; then
	# The checked-in PTX is made by this same command (see kernels.cu).
	nvcc -ptx -arch=sm_75 -O3 -o "$logdir/kernels.ptx" "$root/gpu/kernels/kernels.cu" || exit 1
	ptxflag=(-gpu.ptx="$logdir/kernels.ptx")
	echo "kernels: compiled $(wc -c <"$logdir/kernels.ptx") bytes of PTX with $(nvcc --version | tail -1)"
fi

cd "$root/gpu" # the tests read ../codec/testdata
status=0
echo "== GPU tests"
"$bin" -test.v -test.timeout 300s -test.run 'Probe|NewBad|TestGPU(Vectors|ManyChunks|Pinned|ByteSwap|Concurrent|Cancelled|RingXXH64|RingDecodeRuns)' "${ptxflag[@]}" 2>&1 |
	tee "$logdir/tests.log" | grep -E '^(--- |=== RUN|ok|FAIL|PASS|panic)|gpu_test.go|nogpu_test.go' || true
grep -q '^PASS' "$logdir/tests.log" || status=1
grep -q -- '--- SKIP: TestGPUVectors' "$logdir/tests.log" && { echo "GPU tests skipped: no GPU decoding on this machine"; status=1; }

echo "== damaged chunks"
# A device fault poisons a CUDA context for the rest of its process, so the
# damaged chunks run in processes of their own: this shows which inputs
# nvCOMP survives, and that good chunks decoded alongside stay right. Every
# kind of damage (gpu/damage_test.go) with GPU_SEEDS seeds per chunk.
# TestGPUCorrupt: default Options, as shipped (deflate codecs and zstd
# without a checksum on the CPU). TestGPUCorruptDeflate: Options.Deflate on
# (gzip, zlib and blosc-zlib on the GPU, their CRC-32 / Adler-32 checked on
# the host). TestGPUCorruptUnverified: Options.Unverified on (zstd without a
# checksum and blosc-zstd on the GPU after header checks only).
# TestGPUCorruptWalk: Options.WalkOnDevice on (LZ4 blocks walked on the GPU
# instead of the host, before nvCOMP reads them). In every
# configuration a good chunk with a wrong byte, a damaged chunk the GPU
# accepts that the CPU rejects or decodes otherwise, a chunk the GPU calls
# corrupt that the CPU decodes, or a process still waiting at its limit
# (nvCOMP hung and the watchdog did not release the callers) fails the
# suite. nvCOMP faulting or hanging is no failure when the decoder then
# sends every job to the CPU (reported, and run again one process per kind
# of damage, to show which damage does it).
# One process per codec for all kinds at once.
kinds="flip-header flip-body flips trunc-block trunc-inside trunc-tail swap-blocks size-nbytes size-fields zeros garbage extend"
: >"$logdir/corrupt.log"
faulted=0
corrupt_case() { # test codec kind-regexp
	local out tmo=300s
	[[ $1 == TestGPUCorruptUnverified ]] && tmo=${GPU_UNVERIFIED_TIMEOUT:-60s}
	out=$("$bin" -test.v -test.timeout "$tmo" -test.run "^$1\$" -gpu.corrupt="^$2.*/$3\$" -gpu.seeds "${GPU_SEEDS:-8}" "${ptxflag[@]}" 2>&1)
	echo "### $1 $2 $3" >>"$logdir/corrupt.log"
	echo "$out" >>"$logdir/corrupt.log"
	local name=$2 kind=$3
	[[ $kind == '.*' ]] && kind=all
	[[ $1 == TestGPUCorruptDeflate ]] && name="$2 (Deflate)"
	[[ $1 == TestGPUCorruptUnverified ]] && name="$2 (Unverified)"
	[[ $1 == TestGPUCorruptWalk ]] && name="$2 (WalkOnDevice)"
	faulted=0
	if grep -q 'KNOWN nvCOMP deflate defect' <<<"$out"; then
		status=1
		printf '%-26s %-13s FAIL KNOWN nvCOMP deflate defect past the fence: %s\n' "$name" "$kind" "$(grep -c WRONG-BYTES <<<"$out") wrong good chunks (see corrupt.log)"
	elif grep -q '^PASS' <<<"$out" && grep -q 'NVCOMP-HUNG' <<<"$out"; then
		faulted=1
		printf '%-26s %-13s ok, but nvCOMP hung: %s\n' "$name" "$kind" \
			"$(grep -m1 'NVCOMP-HUNG' <<<"$out" | sed -E 's/.*(the watchdog retired the GPU after [^:]*):.*/\1, jobs sent to the CPU/')"
	elif grep -q '^PASS' <<<"$out" && grep -q 'NVCOMP-FAULT' <<<"$out"; then
		faulted=1
		printf '%-26s %-13s ok, but nvCOMP faulted: GPU off, jobs sent to the CPU\n' "$name" "$kind"
	elif grep -q '^PASS' <<<"$out"; then
		printf '%-26s %-13s ok   %s; %s%s\n' "$name" "$kind" \
			"$(grep -m1 'damaged (' <<<"$out" | sed -E 's/.* ([0-9]+) damaged .*, ([0-9]+) of them.*/\1 damaged, \2 reach nvCOMP/')" \
			"$(grep -m1 'round 0:' <<<"$out" | sed 's/.*round 0: //; s/ (Stats: [^)]*)//')" \
			"$(grep -q 'fence caught' <<<"$out" && echo ' [fence caught a deflate overrun]')"
	else
		status=1
		local why
		why=$(grep -m1 -E 'good chunk|accepted what|error of no known|calls corrupt|Stats says|clean batch|panic|timed out|FAIL' <<<"$out" | sed 's/^ *//')
		grep -q 'test timed out' <<<"$out" && why="still waiting at the ${tmo} limit: the watchdog did not release the callers ($why)"
		printf '%-26s %-13s FAIL %s%s\n' "$name" "$kind" "$why" \
			"$(grep -q 'GPU-ONLY:' <<<"$out" && echo " [$(grep -m1 'GPU-ONLY:' <<<"$out" | sed 's/.*GPU-ONLY: //')]")"
	fi
}
corrupt_codec() { # test codec
	corrupt_case "$1" "$2" '.*'
	if [[ $faulted == 1 ]]; then
		for k in $kinds; do
			corrupt_case "$1" "$2" "$k"
		done
	fi
}
for c in zstd lz4 gzip zlib blosc-lz4- blosc-zstd- blosc-zlib- blosc-snappy- blosc-raw; do
	corrupt_codec TestGPUCorrupt "$c"
done
for c in gzip zlib blosc-zlib-; do
	corrupt_codec TestGPUCorruptDeflate "$c"
done
for c in zstd blosc-zstd-; do
	corrupt_codec TestGPUCorruptUnverified "$c"
done
for c in lz4 blosc-lz4-; do
	corrupt_codec TestGPUCorruptWalk "$c"
done
echo "== nvCOMP deflate on damaged streams (overrun past the output, neighbours with and without the fence)"
"$bin" -test.v -test.timeout 300s -test.run '^TestGPUDeflateOverrun$' -gpu.corrupt=. "${ptxflag[@]}" 2>&1 |
	tee "$logdir/overrun.log" | grep -E 'overrun_test.go|^(--- |ok|FAIL|PASS|panic)' | sed 's/^ *overrun_test.go:[0-9]*: //'
grep -qE '^PASS' "$logdir/overrun.log" || status=1

if [[ ${SKIP_THROUGHPUT:-0} != 1 ]]; then
	echo "== throughput"
	"$bin" -test.v -test.timeout 600s -test.run 'TestThroughputSummary|TestHostBandwidth' -gpu.throughput \
		-gpu.chunks "${GPU_CHUNKS:-128}" "${ptxflag[@]}" 2>&1 | tee "$logdir/throughput.log" | grep -vE '^\s+throughput_test.go' || true
	grep -q '^PASS' "$logdir/throughput.log" || status=1
fi
echo "logs in $logdir"
if [[ $status == 0 ]]; then echo "GPU SUITE: PASS"; else echo "GPU SUITE: FAIL"; fi
exit $status
