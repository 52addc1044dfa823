#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/gpu/run.sh: the real-GPU validation (tests/gpu/README.md). On a GPU machine it
# answers what the emulated GPU cannot: does VMM memory survive its creator's SIGKILL, are
# address hints honored, does NVML answer, does the shim hold up inside PyTorch, how does the
# engine stand-in start on real kernels. With EMU=1 the same checks run against the emulated
# stack of the meson build, so the script stays working in CI.
#
# The shim review's experiments E1-E8 have their own script, tests/gpu/experiments.sh (run it
# first on a GPU: `experiments.sh --then-checks` runs these checks with the time left).
#
# Usage:
#   tests/gpu/run.sh            run every check (EMU=1: on the emulated stack)
#   tests/gpu/run.sh --bundle   (on the build machine) copy the shared libraries the built
#                               shim, receiver, engine and tools need beside them, under
#                               BUILD/gpu-bundle/, for carrying BUILD to a GPU machine
#
# Environment:
#   EMU=1          use the emulated libcuda/libnccl/libnvidia-ml of BUILD/tests/emu
#   BUILD=DIR      meson build directory (default: build/ at the repository root); on a GPU
#                  machine, a carried build whose shim/engine/receiver are used if present
#   RESULTS=FILE   where the results go (default: $OUT/results-DATE-DEVICE.txt when OUT is
#                  set, else tests/gpu/results-DATE-DEVICE.txt; with EMU=1 under BUILD)
#   GPU_DEADLINE_S total time budget in seconds (default 480); later checks get what is left
#   CC, CUDA_INCLUDE  compiler and directory of cuda.h for the check programs (GPU mode)
#   KEEP_WORK=1    keep the temporary directory (logs of every check)
#
# Prints one line per check: "PASS name (Xs): detail", "FAIL name: reason" or
# "N/A name: reason", then "N passed, N failed". Exits 1 if any check failed. With EMU=1 an
# N/A is a failure, except for the checks that cannot exist on the emulator (EMU_NA_OK).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
GPU_DIR=$ROOT/tests/gpu
EMU=${EMU:-0}
BUILD=${BUILD:-$ROOT/build}
[[ $BUILD == /* ]] || BUILD=$ROOT/$BUILD
DEADLINE_S=${GPU_DEADLINE_S:-480}

# The only N/A results allowed on the emulated stack: PyTorch's libcudart cannot run there
# (DESIGN §5).
EMU_NA_OK=(shim-pytorch/default shim-pytorch/expandable)

# Binaries of the meson build that checks use (relative to BUILD).
SHIM=shim/libbelayer.so
RECEIVER=tests/shim/shim-receiver
ENGINE=tests/engine/belayer-test-engine
GEN_WEIGHTS=tests/engine/gen-weights
ENGINE_HOST_KERNELS=tests/engine/libengine-kernels-host.so
BENCH=tools/bench/belayer-bench
CARRIED=("$SHIM" "$RECEIVER" "$ENGINE" "$GEN_WEIGHTS" "$BENCH")
CHECK_PROGRAMS=(gpu-vmm-survive gpu-va-hint gpu-nvml)

# Sizes: large enough on the GPU to be a real engine's kind of allocation, small on the
# emulator (memfds in /dev/shm).
if [[ $EMU == 1 ]]; then
	VMM_SIZE=64M VA_TRIES=5 MODEL_SIZE=8M KV_BYTES=64M
else
	VMM_SIZE=2G VA_TRIES=10 MODEL_SIZE=512M KV_BYTES=4G
fi

START=$(date +%s)
PASSED=0
FAILED=0
NOT_APPLICABLE=0
BG_PIDS=()
CUR_PID="" # the timeout(1) of the check program running now (run_program)
WORK=""
RESULTS_FILE=""
EMU_KERNELS=""

# --- output ----------------------------------------------------------------------------------

say() {
	printf '%s\n' "$*"
	if [[ -n $RESULTS_FILE ]]; then printf '%s\n' "$*" >>"$RESULTS_FILE"; fi
}

# Indented detail lines from a file.
details() {
	local line
	[[ -s $1 ]] || return 0
	while IFS= read -r line; do
		say "    $line"
	done <"$1"
}

pass() {
	PASSED=$((PASSED + 1))
	say "PASS $1 ($2s)${3:+: $3}"
}

fail() {
	FAILED=$((FAILED + 1))
	say "FAIL $1: $2"
}

in_emu_na_ok() {
	local n
	for n in "${EMU_NA_OK[@]}"; do [[ $n == "$1" ]] && return 0; done
	return 1
}

na() {
	if [[ $EMU == 1 ]] && ! in_emu_na_ok "$1"; then
		fail "$1" "not applicable on the emulated stack, which must run it: $2"
		return
	fi
	NOT_APPLICABLE=$((NOT_APPLICABLE + 1))
	say "N/A $1: $2"
}

elapsed() { echo $(($(date +%s) - START)); }

# Seconds a step may take: its own limit, capped by what is left of the budget.
budget() {
	local left=$((DEADLINE_S - $(elapsed)))
	if ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# Seconds since $1 (date +%s.%N), with two decimals.
since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }'; }

cleanup() {
	local pid
	for pid in "${BG_PIDS[@]}"; do
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	# The device runner brings back only $OUT: keep the checks' logs (text, small) there.
	if [[ -n ${OUT:-} && -n $WORK && -d $WORK ]]; then
		mkdir -p "$OUT/gpu-logs"
		find "$WORK" -maxdepth 1 -type f \( -name '*.log' -o -name '*.out' -o -name '*.err' \
			-o -name '*.details' -o -name '*.stdout' \) -size -4M -exec cp {} "$OUT/gpu-logs/" \;
	fi
	if [[ -n $WORK && ${KEEP_WORK:-0} != 1 ]]; then rm -rf "$WORK"; fi
}

# SIGTERM to process $1, SIGKILL if it still lives $2 seconds later; reaped either way.
# Returns 1 when it had to be killed.
stop_pid() {
	local end=$(($(date +%s) + $2)) rc=0
	kill -TERM "$1" 2>/dev/null || true
	while kill -0 "$1" 2>/dev/null && (($(date +%s) < end)); do sleep 0.1; done
	if kill -0 "$1" 2>/dev/null; then
		kill -KILL "$1" 2>/dev/null || true
		rc=1
	fi
	wait "$1" 2>/dev/null || true
	return "$rc"
}

# SIGTERM (an outer timeout), SIGINT, SIGHUP: stop the running check program, whose timeout(1)
# passes the signal to its whole process group (and SIGKILLs it 5 s later), then exit; the
# EXIT trap (cleanup) stops the background helpers. Without it the program ran on to its own
# limit, and a second SIGKILL left its children behind.
on_signal() {
	trap - TERM INT HUP
	[[ -z $CUR_PID ]] || stop_pid "$CUR_PID" 10 || true
	echo "run.sh: stopped by SIG$1" >&2
	exit $((128 + $2))
}

# --- environment ------------------------------------------------------------------------------

# The site-packages directory PyTorch is installed in (its nvidia-* wheels are beside it).
torch_site() {
	command -v python3 >/dev/null || return 0
	python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
		2>/dev/null || true
}

# The directory of cuda.h (and cudaTypedefs.h): $CUDA_INCLUDE, the toolkit nvcc reports
# (tools/find-cuda-include), the usual places, else the headers of PyTorch's nvidia-* wheels.
cuda_include() {
	local nvcc beside="" d site
	nvcc=$(command -v nvcc || true)
	[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
	beside=$("$ROOT/tools/find-cuda-include" "$nvcc")
	for d in "${CUDA_INCLUDE:-}" "$beside" /usr/local/cuda/include \
		/usr/local/cuda/targets/x86_64-linux/include /usr/local/cuda/targets/sbsa-linux/include; do
		if [[ -n $d && -r $d/cuda.h && -r $d/cudaTypedefs.h ]]; then
			printf '%s\n' "$d"
			return 0
		fi
	done
	site=$(torch_site)
	[[ -n $site && -d $site/nvidia ]] || return 1
	while read -r d; do
		d=$(dirname "$d")
		if [[ -r $d/cuda.h ]]; then
			printf '%s\n' "$d"
			return 0
		fi
	done < <(find "$site/nvidia" -name cudaTypedefs.h 2>/dev/null)
	return 1
}

device_name() {
	local n=""
	if [[ $EMU == 1 ]]; then
		n=emulated
	elif command -v nvidia-smi >/dev/null; then
		n=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)
	fi
	n=${n:-unknown-gpu}
	n=${n// /-}
	printf '%s\n' "${n//[^A-Za-z0-9._-]/}"
}

# A directory to add to LD_LIBRARY_PATH for a carried binary whose libraries are missing
# here: the copies --bundle made (empty when nothing is missing).
bundle_dir_for() {
	local bin=$1 dir deps
	dir=$BUILD/gpu-bundle/$(basename "$bin")
	deps=$(ldd "$bin" 2>/dev/null || true)
	if grep -q 'not found' <<<"$deps" && [[ -d $dir ]]; then
		printf '%s\n' "$dir"
	fi
}

# LD_LIBRARY_PATH for running carried binary $1: the emulated stack in EMU mode, the bundle
# when libraries are missing, then what was there.
lib_path_for() {
	local p=${LD_LIBRARY_PATH:-} b
	b=$(bundle_dir_for "$1")
	[[ -n $b ]] && p=$b${p:+:$p}
	printf '%s\n' "$p"
}

# Why carried binary $1 cannot run here, or nothing when it can.
unloadable() {
	local out
	out=$(LD_LIBRARY_PATH=$(lib_path_for "$1") ldd "$1" 2>&1 | grep 'not found' || true)
	[[ -n $out ]] && printf 'missing libraries: %s\n' "$(tr -s ' \t\n' ' ' <<<"$out")"
	return 0
}

# Copies the non-glibc libraries of each carried binary into BUILD/gpu-bundle/NAME/.
bundle() {
	local rel bin dir lib n=0
	for rel in "${CARRIED[@]}"; do
		bin=$BUILD/$rel
		[[ -e $bin ]] || { echo "bundle: $rel not built, skipped"; continue; }
		dir=$BUILD/gpu-bundle/$(basename "$bin")
		rm -rf "$dir"
		mkdir -p "$dir"
		while read -r lib; do
			case $(basename "$lib") in
			libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | \
				libresolv.so.* | libcuda.so.* | libnccl.so.* | libnvidia-ml.so.*) continue ;;
			esac
			cp -L "$lib" "$dir/"
			n=$((n + 1))
		done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
		echo "bundle: $rel: $(find "$dir" -type f -printf '%f ' | sed 's/ $//')"
	done
	# The device runner copies the working tree without .git: record what was built.
	mkdir -p "$BUILD/gpu-bundle"
	git -C "$ROOT" describe --always --dirty >"$BUILD/gpu-bundle/commit" 2>/dev/null || true
	echo "bundle: $n libraries under $BUILD/gpu-bundle; $BUILD is $(du -sh "$BUILD" | cut -f1)" \
		"(the device runner carries at most 64 MiB)"
}

# --- the project's binaries on a GPU machine -------------------------------------------------

# Why the shim/engine are not available, for the N/A lines ("" when BUILD has them).
NOT_BUILT=""

# The meson entry point: a meson binary, or the Python package's module.
meson_cmd() {
	if command -v meson >/dev/null; then
		echo meson
	elif command -v python3 >/dev/null && python3 -c 'import mesonbuild' 2>/dev/null; then
		echo "python3 -m mesonbuild.mesonmain"
	else
		return 1
	fi
}

# GPU mode, when BUILD holds no shim: configure and build just the needed targets in WORK with
# what exists here. The project's Debian dependencies (msgpack, libevent, json-c, cmocka, BPF
# tools) are usually absent on GPU machines, so this mostly explains why carrying a build is
# the way (tests/gpu/README.md).
build_project() {
	local meson inc log=$WORK/meson.log dir=$WORK/build t0 err rel
	local -a targets=()
	[[ $EMU == 1 || -e $BUILD/$SHIM ]] && return 0
	t0=$(date +%s.%N)
	if ! meson=$(meson_cmd); then
		NOT_BUILT="no carried build in $BUILD and meson is not available"
		return 0
	fi
	if ! inc=$(cuda_include); then
		NOT_BUILT="no carried build in $BUILD and cuda.h not found (set CUDA_INCLUDE)"
		return 0
	fi
	# shellcheck disable=SC2086 # $meson is a command with arguments
	if ! timeout "$(budget 120)" $meson setup "$dir" "$ROOT" -Dcuda-include="$inc" >"$log" 2>&1; then
		err=$(grep -m1 'ERROR:' "$log" || tail -n1 "$log")
		NOT_BUILT="no carried build in $BUILD; meson setup here failed: ${err#*ERROR: }"
		return 0
	fi
	for rel in "$SHIM" "$RECEIVER" "$ENGINE" "$GEN_WEIGHTS" "$BENCH"; do targets+=("$rel"); done
	if ! timeout "$(budget 240)" ninja -C "$dir" "${targets[@]}" >>"$log" 2>&1; then
		err=$(grep -m1 -E 'error|FAILED' "$log" || tail -n1 "$log")
		NOT_BUILT="no carried build in $BUILD; building here failed: $err"
		return 0
	fi
	say "built the shim, receiver and engine stand-in here in $(since "$t0")s ($dir)"
	BUILD=$dir
}

# --- check programs ---------------------------------------------------------------------------

BIN_DIR=""
BUILD_ERROR=""

# EMU: the meson build's. GPU: compiled here with cc, CUDA's headers and -ldl; if that is not
# possible, the carried build's.
build_check_programs() {
	local inc p cc=${CC:-cc} log
	if [[ $EMU == 1 ]]; then
		BIN_DIR=$BUILD/tests/gpu
		for p in "${CHECK_PROGRAMS[@]}"; do
			[[ -x $BIN_DIR/$p ]] || BUILD_ERROR="$BIN_DIR/$p not built (ninja -C $BUILD)"
		done
		return 0
	fi
	BIN_DIR=$WORK/bin
	mkdir -p "$BIN_DIR"
	log=$WORK/cc.log
	if ! command -v "$cc" >/dev/null; then
		BUILD_ERROR="no C compiler ($cc)"
	elif ! inc=$(cuda_include); then
		BUILD_ERROR="cuda.h/cudaTypedefs.h not found (set CUDA_INCLUDE)"
	else
		for p in "${CHECK_PROGRAMS[@]}"; do
			if ! "$cc" -std=gnu11 -O2 -Wall -D_GNU_SOURCE -I"$inc" -I"$ROOT/common" \
				-I"$ROOT/shim" -I"$GPU_DIR" -o "$BIN_DIR/$p" "$GPU_DIR/$p.c" "$GPU_DIR/gpu-check.c" \
				-ldl >>"$log" 2>&1; then
				BUILD_ERROR="compiling $p: $(grep -m1 'error' "$log" || tail -n1 "$log")"
				break
			fi
		done
		[[ -z $BUILD_ERROR ]] && say "check programs compiled with $cc against $inc"
	fi
	if [[ -n $BUILD_ERROR && -x $BUILD/tests/gpu/gpu-vmm-survive ]]; then
		say "check programs: $BUILD_ERROR; using the carried $BUILD/tests/gpu"
		BIN_DIR=$BUILD/tests/gpu
		BUILD_ERROR=""
	fi
}

# run_program NAME LIMIT CMD...: runs a check program, PASS/FAIL/N/A from its exit status
# (0, 77, other) and its first "summary:" line; its output goes below as details.
run_program() {
	local name=$1 limit=$2 t0 rc=0 log summary
	shift 2
	if [[ -n $BUILD_ERROR ]]; then
		fail "$name" "check program not available: $BUILD_ERROR"
		return
	fi
	limit=$(budget "$limit")
	if ((limit < 5)); then
		fail "$name" "no time left (GPU_DEADLINE_S=$DEADLINE_S)"
		return
	fi
	log=$WORK/$(tr / - <<<"$name").log
	t0=$(date +%s.%N)
	# In the background and waited for: a SIGTERM/^C to this script is handled at once
	# (on_signal stops the program) instead of after the program's own limit.
	timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1 </dev/null &
	CUR_PID=$!
	wait "$CUR_PID" || rc=$?
	CUR_PID=""
	summary=$(sed -n 's/^summary: //p' "$log" | head -n1 || true)
	grep -v '^summary: ' "$log" >"$log.details" || true
	case $rc in
	0) pass "$name" "$(since "$t0")" "$summary" ;;
	77) na "$name" "${summary:-not applicable}" ;;
	124 | 137) fail "$name" "timed out after ${limit}s${summary:+ ($summary)}" ;;
	*) fail "$name" "${summary:-exit status $rc: $(tail -n1 "$log")}" ;;
	esac
	details "$log.details"
}

# Waits until file $1 has a line matching $2, process $3 lives and $4 seconds have not
# passed. Returns 0 when the line came.
wait_for_line() {
	local end=$(($(date +%s) + $4))
	while (($(date +%s) < end)); do
		grep -q -- "$2" "$1" 2>/dev/null && return 0
		kill -0 "$3" 2>/dev/null || { grep -q -- "$2" "$1" 2>/dev/null; return; }
		sleep 0.05
	done
	return 1
}

# --- checks -----------------------------------------------------------------------------------

check_vmm_survive() {
	local c
	for c in fd-only imported; do
		run_program "vmm-survive/$c" 120 "$BIN_DIR/gpu-vmm-survive" --case "$c" \
			--size "$VMM_SIZE"
	done
}

check_va_hint() {
	local limit
	limit=$(budget 150)
	# Tries stop starting well before the limit, so a slow cuInit still gives a rate.
	run_program va-hint "$limit" "$BIN_DIR/gpu-va-hint" --tries "$VA_TRIES" \
		--max-seconds $((limit * 2 / 3))
}

check_nvml() {
	run_program nvml 60 "$BIN_DIR/gpu-nvml"
}

# "ok|detail" from shim-torch.py's JSON line in file $1 (with the baseline's in $2, or "").
torch_report() {
	python3 - "$1" "$2" <<'EOF'
import json, sys
def load(p):
    if not p:
        return None
    for line in reversed(open(p, errors="replace").read().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None
r, b = load(sys.argv[1]), load(sys.argv[2])
if r is None:
    print("bad|no result line")
    sys.exit()
d = []
if "announced" in r:
    d.append(f"{r['segments']} segments ({r['segment_bytes'] >> 20} MiB) >= threshold, "
             f"{r['announced']} regions announced, classes {r['classes']}")
if b:
    def pct(x, y):
        return f"{100.0 * (x - y) / y:+.1f}%" if y else "n/a"
    d.append(f"loop {r['loop_s']:.3f}s vs {b['loop_s']:.3f}s without the shim "
             f"({pct(r['loop_s'], b['loop_s'])}), large allocations {r['alloc_s']:.3f}s vs "
             f"{b['alloc_s']:.3f}s ({pct(r['alloc_s'], b['alloc_s'])})")
if r["errors"]:
    d.insert(0, "; ".join(r["errors"]))
print(("ok|" if r["ok"] else "bad|") + "; ".join(d))
EOF
}

# One PyTorch run of shim-torch.py: with_shim (0/1), allocator conf, output file. Returns the
# program's exit status.
torch_run() {
	local with_shim=$1 conf=$2 out=$3 limit store rc=0
	local -a env=(env)
	limit=$(budget 180)
	store=$(mktemp -d "$WORK/store.XXXXXX")
	[[ $conf == expandable ]] && env+=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
	if [[ $with_shim == 1 ]]; then
		env+=(LD_PRELOAD="$BUILD/$SHIM" LD_LIBRARY_PATH="$(lib_path_for "$BUILD/$SHIM")"
			BELAYER_SOCKET="$WORK/shim.sock" BELAYER_ENGINE_ID=gpu-check)
		timeout --kill-after=5 "$limit" "${env[@]}" python3 "$GPU_DIR/shim-torch.py" \
			--store "$store" --receiver-log "$WORK/receiver.out" >"$out" 2>&1 || rc=$?
	else
		timeout --kill-after=5 "$limit" "${env[@]}" python3 "$GPU_DIR/shim-torch.py" \
			--store "$store" >"$out" 2>&1 || rc=$?
	fi
	return "$rc"
}

# The shim's test receiver (tests/shim/shim-receiver) on $WORK/shim.sock, writing one line per
# message to $WORK/receiver.out; started once. Returns 1 with RECEIVER_ERROR set on failure.
RECEIVER_PID=""
RECEIVER_ERROR=""
start_receiver() {
	[[ -n $RECEIVER_PID ]] && return 0
	[[ -z $RECEIVER_ERROR ]] || return 1
	RECEIVER_ERROR=$(unloadable "$BUILD/$RECEIVER")
	[[ -x $BUILD/$RECEIVER ]] || RECEIVER_ERROR="the shim's test receiver is not built ($BUILD/$RECEIVER)"
	[[ -z $RECEIVER_ERROR ]] || return 1
	LD_LIBRARY_PATH=$(lib_path_for "$BUILD/$RECEIVER") \
		"$BUILD/$RECEIVER" "$WORK/shim.sock" "$WORK/receiver.out" >"$WORK/receiver.stdout" \
		2>&1 &
	BG_PIDS+=("$!")
	if ! wait_for_line "$WORK/receiver.stdout" '^ready' "$!" 10; then
		RECEIVER_ERROR="shim-receiver did not start: $(tail -n1 "$WORK/receiver.stdout")"
		return 1
	fi
	RECEIVER_PID=$!
}

check_shim_pytorch() {
	local conf why t0 rc res
	local -a names=(shim-pytorch/default shim-pytorch/expandable)
	why=""
	if [[ $EMU == 1 ]]; then
		why="PyTorch's libcudart cannot run on the emulated driver (DESIGN §5); real GPU only"
	elif ! command -v python3 >/dev/null ||
		! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
			>/dev/null 2>&1; then
		why="python3 with a CUDA-enabled torch not found"
	elif [[ ! -e $BUILD/$SHIM ]]; then
		why="shim not built: ${NOT_BUILT:-$BUILD/$SHIM missing} (see tests/gpu/README.md)"
	elif [[ ! -x $BUILD/$RECEIVER ]]; then
		why="the shim's test receiver is not built ($BUILD/$RECEIVER)"
	else
		why=$(unloadable "$BUILD/$SHIM")
		[[ -z $why ]] && why=$(unloadable "$BUILD/$RECEIVER")
	fi
	if [[ -n $why ]]; then
		for conf in "${names[@]}"; do na "$conf" "$why"; done
		return
	fi

	if ! start_receiver; then
		for conf in "${names[@]}"; do fail "$conf" "$RECEIVER_ERROR"; done
		return
	fi

	for conf in default expandable; do
		t0=$(date +%s.%N)
		rc=0
		torch_run 0 "$conf" "$WORK/torch-$conf-base.out" || rc=$?
		if ((rc != 0)); then
			fail "shim-pytorch/$conf" "the program fails even without the shim (exit $rc)"
			details "$WORK/torch-$conf-base.out"
			continue
		fi
		rc=0
		torch_run 1 "$conf" "$WORK/torch-$conf-shim.out" || rc=$?
		res=$(torch_report "$WORK/torch-$conf-shim.out" "$WORK/torch-$conf-base.out" || true)
		if ((rc == 0)) && [[ $res == ok\|* ]]; then
			pass "shim-pytorch/$conf" "$(since "$t0")" "${res#ok|}"
		elif ((rc > 128 && rc != 137)); then
			fail "shim-pytorch/$conf" "crashed under the shim (signal $((rc - 128)))"
		elif ((rc == 124 || rc == 137)); then
			fail "shim-pytorch/$conf" "timed out under the shim"
		else
			fail "shim-pytorch/$conf" "${res#*|} (exit $rc)"
		fi
		grep -v '^{' "$WORK/torch-$conf-shim.out" | tail -n 20 >"$WORK/torch-$conf.details" || true
		grep '^{' "$WORK/torch-$conf-shim.out" >>"$WORK/torch-$conf.details" || true
		details "$WORK/torch-$conf.details"
	done
	say "    receiver: $(grep -c '^announce' "$WORK/receiver.out" || true) announcements in all runs"
}

# Where libnccl.so.2 is: nothing printed when the loader finds it, else the directory of the
# one PyTorch ships (its nvidia-nccl wheel, or torch/lib). Fails when it is in neither place.
nccl_dir() {
	local site lib cache
	cache=$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)
	grep -q 'libnccl\.so\.2 ' <<<"$cache" && return 0
	site=$(torch_site)
	[[ -n $site ]] || return 1
	lib=$(find "$site/nvidia" "$site/torch/lib" -name libnccl.so.2 -print -quit 2>/dev/null || true)
	[[ -n $lib ]] || return 1
	dirname "$lib"
}

# Starts the engine stand-in on the model in $WORK (extra env in "$@", e.g. LD_PRELOAD), waits
# for its ready line, asks one greedy /generate and stops it. Sets ENGINE_READY (the JSON ready
# line), ENGINE_TOKENS (the output ids), ENGINE_PID; returns 1 with ENGINE_ERROR on failure.
ENGINE_READY="" ENGINE_TOKENS="" ENGINE_PID="" ENGINE_ERROR="" ENGINE_LIB_PATH=""
engine_run() {
	local tag=$1 pid port reply body
	shift
	ENGINE_READY="" ENGINE_TOKENS="" ENGINE_ERROR=""
	env LD_LIBRARY_PATH="$ENGINE_LIB_PATH" ${EMU_KERNELS:+BELAYER_EMU_KERNELS="$EMU_KERNELS"} \
		"$@" "$BUILD/$ENGINE" --model "$WORK/model.safetensors" --port 0 \
		--kv-cache-bytes "$KV_BYTES" >"$WORK/engine-$tag.out" 2>"$WORK/engine-$tag.err" &
	pid=$!
	ENGINE_PID=$pid
	BG_PIDS+=("$pid")
	if wait_for_line "$WORK/engine-$tag.out" '"event":"ready"' "$pid" "$(budget 120)"; then
		ENGINE_READY=$(grep -m1 '"event":"ready"' "$WORK/engine-$tag.out")
		port=$(sed -n 's/.*"port":\([0-9]*\).*/\1/p' <<<"$ENGINE_READY")
		body='{"input_ids":[1,2,3,4],"sampling_params":{"max_new_tokens":8,"temperature":0}}'
		reply=$(http_post "$port" /generate "$body" || true)
		ENGINE_TOKENS=$(grep -o '"output_ids":\[[0-9,]*\]' <<<"$reply" || true)
		[[ -n $ENGINE_TOKENS ]] || ENGINE_ERROR="ready, but /generate failed: ${reply:-no reply}"
	else
		ENGINE_ERROR="no ready line: $(tail -n1 "$WORK/engine-$tag.err")"
	fi
	stop_pid "$pid" 10 || ENGINE_ERROR+="${ENGINE_ERROR:+; }it did not exit within 10 s of SIGTERM (killed)"
	[[ -z $ENGINE_ERROR ]]
}

# The engine stand-in's cold start on this device (PTX kernels), the same engine under the
# shim (its regions announced and classified, the same tokens), then shadow promotion.
check_engine_recovery() {
	local why="" nccl t0 help
	if [[ ! -x $BUILD/$ENGINE || ! -x $BUILD/$GEN_WEIGHTS ]]; then
		why="engine stand-in not built: ${NOT_BUILT:-$BUILD/$ENGINE missing} (see tests/gpu/README.md)"
	elif [[ $EMU == 1 && ! -e $BUILD/$ENGINE_HOST_KERNELS ]]; then
		why="host kernels for the emulated driver not built ($BUILD/$ENGINE_HOST_KERNELS)"
	else
		why=$(unloadable "$BUILD/$ENGINE")
		[[ -z $why ]] && why=$(unloadable "$BUILD/$GEN_WEIGHTS")
	fi
	ENGINE_LIB_PATH=$(lib_path_for "$BUILD/$ENGINE")
	if [[ -z $why && $EMU != 1 ]]; then
		if nccl=$(nccl_dir); then
			[[ -n $nccl ]] && ENGINE_LIB_PATH=$nccl${ENGINE_LIB_PATH:+:$ENGINE_LIB_PATH}
		else
			why="libnccl.so.2 not found (neither in the loader cache nor PyTorch's wheels)"
		fi
	fi
	t0=$(date +%s.%N)
	if [[ -z $why ]] && ! LD_LIBRARY_PATH=$(lib_path_for "$BUILD/$GEN_WEIGHTS") \
		timeout "$(budget 120)" "$BUILD/$GEN_WEIGHTS" --out "$WORK/model.safetensors" \
		--size "$MODEL_SIZE" >"$WORK/gen-weights.log" 2>&1; then
		why="gen-weights failed: $(tail -n1 "$WORK/gen-weights.log")"
		fail engine-recovery/cold-start "$why"
		fail shim-engine "$why"
		why=skip
	fi

	if [[ $why == skip ]]; then
		:
	elif [[ -n $why ]]; then
		na engine-recovery/cold-start "$why"
		na shim-engine "$why"
	else
		if engine_run plain; then
			pass engine-recovery/cold-start "$(since "$t0")" \
				"ready in $(sed -n 's/.*"total_s":\([0-9.]*\).*/\1/p' <<<"$ENGINE_READY") s (weights $MODEL_SIZE, KV $KV_BYTES); greedy /generate: $ENGINE_TOKENS"
			say "    $ENGINE_READY"
		else
			fail engine-recovery/cold-start "$ENGINE_ERROR"
			details "$WORK/engine-plain.err"
		fi
		check_shim_engine "$ENGINE_TOKENS"
	fi

	# The subcommand list of belayer-bench --help says whether recovery exists yet.
	help=""
	if [[ -x $BUILD/$BENCH ]]; then
		help=$(LD_LIBRARY_PATH=$(lib_path_for "$BUILD/$BENCH") "$BUILD/$BENCH" --help 2>&1 || true)
	fi
	if grep -q '^ *recovery ' <<<"$help"; then
		# The emulated run keeps to CI sizes; a GPU runs the full table (256M, 1G, 4G).
		local sizes=()
		[[ $EMU == 1 ]] && sizes=(--quick)
		# The bench's own bound ends it with its reason well before run_program's limit.
		local bound
		bound=$(($(budget 240) - 30))
		((bound >= 10)) || bound=10
		run_program engine-recovery/shadow-promotion 240 env \
			LD_LIBRARY_PATH="$(lib_path_for "$BUILD/$BENCH")" "$BUILD/$BENCH" \
			--shim "$BUILD/$SHIM" recovery --build-dir "$BUILD" \
			--plot "$(dirname "$RESULTS_FILE")/recovery.png" --timeout "$bound" "${sizes[@]}"
	else
		na engine-recovery/shadow-promotion \
			"belayer-bench recovery does not exist yet (the shadow-worker recovery issue)"
	fi
}

# The engine stand-in under LD_PRELOAD=libbelayer.so: it must start, answer with the tokens it
# gave without the shim ($1), and its regions must reach the receiver classified the way the
# phase heuristic promises (weights before the cuMemGetInfo probe, kv after).
check_shim_engine() {
	local plain=$1 t0 why="" ann weights kv
	t0=$(date +%s.%N)
	if [[ ! -e $BUILD/$SHIM ]]; then
		why="shim not built: ${NOT_BUILT:-$BUILD/$SHIM missing} (see tests/gpu/README.md)"
	else
		why=$(unloadable "$BUILD/$SHIM")
	fi
	if [[ -n $why ]]; then
		na shim-engine "$why"
		return
	fi
	if ! start_receiver; then
		fail shim-engine "$RECEIVER_ERROR"
		return
	fi
	if ! engine_run shim LD_PRELOAD="$BUILD/$SHIM" BELAYER_SOCKET="$WORK/shim.sock" \
		BELAYER_ENGINE_ID=gpu-check-engine; then
		fail shim-engine "under the shim: $ENGINE_ERROR"
		details "$WORK/engine-shim.err"
		return
	fi
	# The receiver writes as messages arrive; the engine has exited, so everything it sent is
	# there once its eof line is.
	wait_for_line "$WORK/receiver.out" "^eof pid=$ENGINE_PID\$" "$RECEIVER_PID" 10 || true
	ann=$(grep "^announce pid=$ENGINE_PID " "$WORK/receiver.out" || true)
	weights=$(grep -c ' class=weights ' <<<"$ann" || true)
	kv=$(grep -c ' class=kv ' <<<"$ann" || true)
	if [[ -n $plain && $ENGINE_TOKENS != "$plain" ]]; then
		fail shim-engine "different tokens under the shim: $ENGINE_TOKENS vs $plain"
	elif ((weights < 1 || kv < 1)); then
		fail shim-engine "regions announced: $weights weights, $kv kv (want at least one of each)"
	else
		pass shim-engine "$(since "$t0")" \
			"$(grep -c . <<<"$ann") regions announced ($weights weights, $kv kv), same tokens as without the shim; ready in $(sed -n 's/.*"total_s":\([0-9.]*\).*/\1/p' <<<"$ENGINE_READY") s"
	fi
	grep "^announce pid=$ENGINE_PID " "$WORK/receiver.out" >"$WORK/engine-shim.announced" || true
	details "$WORK/engine-shim.announced"
}

# POSTs JSON $3 to 127.0.0.1:$1$2 with bash's /dev/tcp; prints the response body.
http_post() {
	local fd
	exec {fd}<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf 'POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
		"$2" "${#3}" "$3" >&"$fd"
	timeout 60 cat <&"$fd" | sed -n '/^\r\{0,1\}$/,$p' | tail -n +2
	exec {fd}<&-
}

# start_run TAG KERNEL_LIB: the work directory ($TMPDIR/TAG.XXXXXX), the signal traps and, with
# EMU=1, the emulated stack's environment, its host kernels from KERNEL_LIB (also for
# programs started later, such as the engine under belayer-bench recovery). Returns 1 when the
# emulated stack is not built.
start_run() {
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
	trap cleanup EXIT
	trap 'on_signal TERM 15' TERM
	trap 'on_signal INT 2' INT
	trap 'on_signal HUP 1' HUP
	[[ $EMU == 1 ]] || return 0
	if [[ ! -e $BUILD/tests/emu/libcuda.so.1 || ! -e $2 ]]; then
		echo "${0##*/}: EMU=1 needs the emulated stack and $2 in $BUILD (ninja -C $BUILD)" >&2
		return 1
	fi
	export LD_LIBRARY_PATH=$BUILD/tests/emu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export BELAYER_EMU_DIR=$WORK/emu EMU_CTL=$BUILD/tests/emu/emu-ctl
	EMU_KERNELS=$2
	export BELAYER_EMU_KERNELS=$EMU_KERNELS
	mkdir -p "$BELAYER_EMU_DIR"
}

# start_results PREFIX TITLE: RESULTS_FILE (RESULTS, else $OUT/PREFIX-DATE-DEVICE.txt, else under
# BUILD with EMU=1, else tests/gpu/), emptied, and its header lines.
start_results() {
	local device date commit
	device=$(device_name)
	date=$(date -u +%Y-%m-%d)
	if [[ -n ${RESULTS:-} ]]; then
		RESULTS_FILE=$RESULTS
	elif [[ -n ${OUT:-} ]]; then
		RESULTS_FILE=$OUT/$1-$date-$device.txt
	elif [[ $EMU == 1 ]]; then
		RESULTS_FILE=$BUILD/tests/gpu/$1-$date-$device.txt
	else
		RESULTS_FILE=$GPU_DIR/$1-$date-$device.txt
	fi
	mkdir -p "$(dirname "$RESULTS_FILE")"
	: >"$RESULTS_FILE"

	commit=$(git -C "$ROOT" describe --always --dirty 2>/dev/null ||
		cat "$BUILD/gpu-bundle/commit" 2>/dev/null || echo unknown)
	say "# Belayer $2, $(date -u '+%Y-%m-%d %H:%M UTC')"
	say "# mode: $([[ $EMU == 1 ]] && echo "emulated stack ($BUILD/tests/emu)" || echo "real GPU")," \
		"device: $device, host: $(uname -n), commit: $commit, build: $BUILD, deadline: ${DEADLINE_S}s"
	if [[ $EMU != 1 ]] && command -v nvidia-smi >/dev/null; then
		say "# driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null |
			head -n1 || true), $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' || true)," \
			"GPUs: $(nvidia-smi -L 2>/dev/null | wc -l)"
	fi
	if [[ $EMU != 1 ]] && command -v python3 >/dev/null; then
		say "# python: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo "no torch")"
	fi
}

# --- main -------------------------------------------------------------------------------------

main() {
	case ${1:-} in
	--bundle)
		bundle
		return 0
		;;
	-h | --help)
		sed -n '3,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
		return 0
		;;
	"") ;;
	*)
		echo "usage: tests/gpu/run.sh [--bundle]" >&2
		return 2
		;;
	esac

	start_run belayer-gpu "$BUILD/$ENGINE_HOST_KERNELS" || return 1
	start_results results "real-GPU checks (tests/gpu/run.sh)"

	build_check_programs
	build_project
	check_vmm_survive
	check_va_hint
	check_nvml
	check_shim_pytorch
	check_engine_recovery

	say "results: $RESULTS_FILE"
	say "$PASSED passed, $FAILED failed, $NOT_APPLICABLE not applicable ($(elapsed)s)"
	((FAILED == 0))
}

# Sourcing defines the functions only (for trying them by hand).
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then main "$@"; fi
