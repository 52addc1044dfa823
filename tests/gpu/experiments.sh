#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/gpu/experiments.sh: the shim review's first-GPU experiments E1-E8
# (/work/shared/research/shim-review.md §8, tests/gpu/README.md), each a small program with
# its own time budget under GPU_DEADLINE_S, each printing one verdict line and indented detail
# lines. With EMU=1 every experiment that can run on the emulated stack runs there (E4 scaled
# down); the PyTorch ones (E2, E7, E8) are N/A there and any other N/A is a failure.
#
# Usage:
#   tests/gpu/experiments.sh                 E1-E8 (EMU=1: on the emulated stack)
#   tests/gpu/experiments.sh --then-checks   E1-E8, then run.sh's checks with the time left
#
# Environment: as run.sh (EMU, BUILD, OUT, CC, CUDA_INCLUDE, KEEP_WORK); GPU_DEADLINE_S
# (default 420) bounds the experiments, and with --then-checks the whole run; RESULTS=FILE
# (default $OUT/experiments-DATE-DEVICE.txt, else tests/gpu/ or, with EMU=1, BUILD/tests/gpu/).
#
# Prints "PASS name (Xs): detail", "FAIL name: reason" or "N/A name: reason" per experiment,
# then "N passed, N failed, N not applicable". Exits 1 if any failed (or, with --then-checks,
# if run.sh failed).
set -euo pipefail

# run.sh's helpers (output, budgets, compiling and running the check programs, the receiver,
# the carried build); sourcing it runs no check.
# shellcheck source=SCRIPTDIR/run.sh
source "$(dirname "${BASH_SOURCE[0]}")/run.sh"

DEADLINE_S=${GPU_DEADLINE_S:-420}
# run.sh's globals, read by its helpers (na, build_check_programs)
# shellcheck disable=SC2034
EMU_NA_OK=(E2/capture E7/torch E8/conversion-cost)
# shellcheck disable=SC2034
CHECK_PROGRAMS=(gpu-exp-procaddr gpu-exp-remap gpu-exp-scratch gpu-exp-fake gpu-vmm-survive
	gpu-nvml)
EXP_KERNELS_HOST=tests/gpu/libgpu-exp-kernels-host.so

# Sizes: the review's on a GPU; on the emulator small enough for /dev/shm, vm.max_map_count
# and CI time.
if [[ $EMU == 1 ]]; then
	REMAP_SIZE=16M SCRATCH_ARGS=(--reserve 512M --units "2M,64M,256M") FAULT_SIZE=64M
else
	REMAP_SIZE=256M SCRATCH_ARGS=(--reserve 96G --units "2M,64M,1G") FAULT_SIZE=1G
fi

# The PyTorch experiments: why they cannot run here, or nothing.
torch_exp_why() {
	if [[ $EMU == 1 ]]; then
		echo "PyTorch's libcudart cannot run on the emulated driver (DESIGN §5); real GPU only"
	elif ! command -v python3 >/dev/null ||
		! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
			>/dev/null 2>&1; then
		echo "python3 with a CUDA-enabled torch not found"
	elif [[ ! -e $BUILD/$SHIM ]]; then
		echo "shim not built: ${NOT_BUILT:-$BUILD/$SHIM missing} (see tests/gpu/README.md)"
	elif [[ ! -x $BUILD/$RECEIVER ]]; then
		echo "the shim's test receiver is not built ($BUILD/$RECEIVER)"
	else
		unloadable "$BUILD/$SHIM"
	fi
}

# exp_torch NAME LIMIT e2|e7|e8: gpu-exp-torch.py under run_program's verdict rules.
exp_torch() {
	local name=$1 limit=$2 what=$3 why store err
	# Where it cannot run, at least its Python must parse (it then runs on the next GPU).
	if ! err=$(python3 -c 'import ast, sys
for p in sys.argv[1:]:
    ast.parse(open(p).read(), p)' "$GPU_DIR/gpu-exp-torch.py" "$GPU_DIR/receiver_log.py" 2>&1); then
		fail "$name" "gpu-exp-torch.py does not parse: $(tail -n1 <<<"$err")"
		return
	fi
	why=$(torch_exp_why)
	if [[ -n $why ]]; then
		na "$name" "$why"
		return
	fi
	if ! start_receiver; then
		fail "$name" "$RECEIVER_ERROR"
		return
	fi
	store=$(mktemp -d "$WORK/store.XXXXXX")
	run_program "$name" "$limit" env LD_LIBRARY_PATH="$(lib_path_for "$BUILD/$SHIM")" \
		python3 "$GPU_DIR/gpu-exp-torch.py" "$what" --shim "$BUILD/$SHIM" \
		--socket "$WORK/shim.sock" --receiver-log "$WORK/receiver.out" --store "$store"
}

# E6 with NVML watching for the fault's XID meanwhile (a real GPU only: the emulator raises XIDs
# only through emu-ctl); the watcher's answer is a detail line, not part of the verdict.
exp_fault() {
	local watcher="" log=$WORK/e6-xid.log
	if [[ $EMU != 1 && -z $BUILD_ERROR ]]; then
		"$BIN_DIR/gpu-nvml" --watch-xid 15 >"$log" 2>&1 &
		watcher=$!
		BG_PIDS+=("$watcher")
		wait_for_line "$log" '^watching' "$watcher" 30 || true
	fi
	run_program E6/fault-survive 90 "$BIN_DIR/gpu-vmm-survive" --case fault \
		--size "$FAULT_SIZE"
	if [[ -n $watcher ]]; then
		# it ends at the first XID, or 15 s after it started
		wait "$watcher" 2>/dev/null || true
		say "    NVML during E6: $(sed -n 's/^summary: //p' "$log" | head -n1)" \
			"($(grep -m1 '^watching' "$log" || tail -n1 "$log"))"
	elif [[ $EMU == 1 ]]; then
		say "    NVML during E6: not watched (the emulator raises XIDs only through emu-ctl)"
	fi
}

# E3 with its NCCL variant where libnccl.so.2 is found (the loader's cache, PyTorch's wheel;
# the emulated one with EMU=1), without it otherwise (said in a detail line).
exp_remap() {
	local nccl=""
	if [[ $EMU == 1 ]]; then
		run_program E3/remap 60 "$BIN_DIR/gpu-exp-remap" --size "$REMAP_SIZE" --nccl
	elif nccl=$(nccl_dir); then
		run_program E3/remap 60 env LD_LIBRARY_PATH="${nccl:+$nccl:}${LD_LIBRARY_PATH:-}" \
			"$BIN_DIR/gpu-exp-remap" --size "$REMAP_SIZE" --nccl
	else
		run_program E3/remap 60 "$BIN_DIR/gpu-exp-remap" --size "$REMAP_SIZE"
		say "    the NCCL variant did not run: libnccl.so.2 not found (loader cache, PyTorch's wheels)"
	fi
}

experiments() {
	# C over the driver API first: quick, and they run on the emulator too.
	run_program E1/procaddr 30 "$BIN_DIR/gpu-exp-procaddr"
	exp_remap
	run_program E5/fake-handles 45 "$BIN_DIR/gpu-exp-fake"
	exp_fault
	run_program E4/scratch 120 "$BIN_DIR/gpu-exp-scratch" "${SCRATCH_ARGS[@]}"
	# PyTorch: two or three interpreter starts each.
	exp_torch E2/capture 150 e2
	exp_torch E7/torch 220 e7
	exp_torch E8/conversion-cost 150 e8
}

exp_main() {
	local then_checks=0 rc=0 left
	case ${1:-} in
	--then-checks) then_checks=1 ;;
	-h | --help)
		sed -n '3,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
		return 0
		;;
	"") ;;
	*)
		echo "usage: tests/gpu/experiments.sh [--then-checks]" >&2
		return 2
		;;
	esac

	start_run belayer-gpu-exp "$BUILD/$EXP_KERNELS_HOST" || return 1
	start_results experiments "first-GPU experiments E1-E8 (tests/gpu/experiments.sh)"

	build_check_programs
	build_project
	experiments

	say "results: $RESULTS_FILE"
	say "$PASSED passed, $FAILED failed, $NOT_APPLICABLE not applicable ($(elapsed)s)"
	((FAILED == 0)) || rc=1
	if ((then_checks)); then
		left=$((DEADLINE_S - $(elapsed)))
		if ((left < 60)); then
			say "run.sh's checks not started: ${left}s left of GPU_DEADLINE_S=$DEADLINE_S"
		else
			say "run.sh's checks with the ${left}s left (their own results file)"
			env -u RESULTS GPU_DEADLINE_S="$left" bash "$GPU_DIR/run.sh" || rc=1
		fi
	fi
	return "$rc"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then exp_main "$@"; fi
