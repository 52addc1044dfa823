#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# belayer-bench recovery leaves no process behind when it is stopped from outside: by SIGTERM
# (what timeout(1) sends; the bench's handler stops its world) and by SIGKILL (no handler runs:
# its children die with it through PR_SET_PDEATHSIG, the supervisor's engine groups through
# setpriv --pdeathsig). Each case starts the bench, waits until an engine of its world serves
# (a real condition: a process of the run listening, under the shim), stops the bench, then
# waits (bounded) for every process of the run to be gone.
#
# Usage: test-recovery-kill.sh BELAYER-BENCH BUILD-DIR
# A process belongs to the run when its environment holds the run's own TMPDIR (the bench's
# children inherit it, and so do the supervisor's engines and their ranks).
set -euo pipefail

BENCH=$1
BUILD=$2
RUN=$(mktemp -d "${TMPDIR:-/tmp}/belayer-bench-kill.XXXXXX")
MARK="TMPDIR=$RUN"
BENCH_PID=""

cleanup() {
	local p
	for p in $(run_pids); do kill -KILL "$p" 2>/dev/null || true; done
	rm -rf "$RUN"
}
trap cleanup EXIT

# Pids of the run's processes (this script's own excluded).
run_pids() {
	local f p
	while IFS= read -r f; do
		p=${f#/proc/}
		p=${p%/environ}
		[[ $p == "$$" || $p == "$BASHPID" ]] || echo "$p"
	done < <(grep -laF -- "$MARK" /proc/[0-9]*/environ 2>/dev/null || true)
}

# Counts the run's engine stand-ins.
engines() {
	local p n=0
	for p in $(run_pids); do
		[[ $(cat "/proc/$p/comm" 2>/dev/null) == belayer-test-* ]] && n=$((n + 1))
	done
	echo "$n"
}

# Waits up to $1 s for $2 (a function) to succeed.
wait_until() {
	local end=$(($(date +%s) + $1))
	while (($(date +%s) < end)); do
		"$2" && return 0
		sleep 0.05
	done
	return 1
}

two_engines() { (($(engines) >= 2)); }
bench_gone() { ! kill -0 "$BENCH_PID" 2>/dev/null; }
none_left() { [[ -z $(run_pids) ]]; }

one_case() {
	local sig=$1 left
	TMPDIR=$RUN "$BENCH" recovery --sizes 8M --tp 2 --paths sampled --build-dir "$BUILD" \
		--plot "$RUN/plot.png" --timeout 60 >"$RUN/bench-$sig.log" 2>&1 &
	BENCH_PID=$!
	# A primary and a shadow group (TP=2: ranks too) of the supervisor's are up.
	if ! wait_until 60 two_engines; then
		echo "FAIL $sig: the bench's engines never came up"
		cat "$RUN/bench-$sig.log"
		return 1
	fi
	kill "-$sig" "$BENCH_PID"
	wait_until 20 bench_gone || { echo "FAIL $sig: the bench did not exit"; return 1; }
	{ wait "$BENCH_PID" || true; } 2>/dev/null
	if ! wait_until 10 none_left; then
		left=$(run_pids)
		echo "FAIL $sig: processes left behind:"
		for p in $left; do echo "  $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-200)"; done
		return 1
	fi
	echo "ok $sig: nothing of the run left"
}

one_case TERM
one_case KILL
