#!/bin/bash
# SPDX-License-Identifier: MIT
# Pins belong to one supervisor (issue 16 item 7): two supervisors with different state dirs
# trace at once, each with its pin set in a directory of its own; a third given the first's
# directory ([env] pin_dir) is refused and leaves those pins alone, and so does its stop;
# stopping the second leaves the first's pins as they were (the same pinned objects: the same
# bpffs inodes). Before, every supervisor pinned at /sys/fs/bpf/belayer/envtrace: each one
# replaced the other's pins and a clean stop removed them.
# Usage: test-envtrace-pins.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
on_fail() {
	for n in a b c; do
		[[ -f $dir/$n.log ]] && sed "s/^/  $n: /" "$dir/$n.log"
	done
}
((EUID == 0)) || skip "needs root"
[[ -d /sys/kernel/tracing/events/syscalls || -d /sys/kernel/debug/tracing/events/syscalls ]] ||
	mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true

dir=$(mktemp -d /tmp/belayer-pins.XXXXXX)
declare -A pid=()
cleanup() {
	for n in "${!pid[@]}"; do
		kill "${pid[$n]}" 2>/dev/null && wait "${pid[$n]}" 2>/dev/null
	done
	rm -rf "$dir"
}
trap cleanup EXIT

# start NAME [SETTING...]: a supervisor with state dir $dir/NAME that loads its tracer at start
# (before it answers on its socket)
start() {
	local n=$1 i
	shift
	local args=(--config /dev/null --socket "$dir/$n.sock" --state-dir "$dir/$n"
		-o health.interval=0 -o journal.enabled=no -o env.trace_preload=yes)
	for s in "$@"; do args+=(-o "$s"); done
	"$supervisor" "${args[@]}" >"$dir/$n.log" 2>&1 &
	pid[$n]=$!
	for ((i = 0; i < 300; i++)); do
		"$ctl_bin" --socket "$dir/$n.sock" status >/dev/null 2>&1 && return 0
		kill -0 "${pid[$n]}" 2>/dev/null || fail "supervisor $n exited during startup"
		sleep 0.05
	done
	fail "supervisor $n did not answer within 15 s"
}
stop() {
	kill -TERM "${pid[$1]}"
	wait "${pid[$1]}" || fail "supervisor $1 did not stop cleanly"
	unset "pid[$1]"
}
# The pin directory belayerctl bpf names for supervisor NAME.
pin_dir() {
	"$ctl_bin" --socket "$dir/$1.sock" bpf --no-run | sed -n 's|^\$ bpftool map show pinned \(.*\)/watched$|\1|p'
}
# The inodes of a pin set: the same pinned objects while they stay the same.
inodes() {
	stat -c '%n %i' "$1/watched" "$1/events" "$1/env_stats" "$1/progs/enter_openat"
}

start a
grep -q "BPF unavailable" "$dir/a.log" && skip "the tracer does not load here: $(grep 'BPF unavailable' "$dir/a.log")"
start b
da=$(pin_dir a)
db=$(pin_dir b)
[[ -n $da && -n $db ]] || fail "belayerctl bpf names no pin directory (a: '$da', b: '$db')"
[[ $da != "$db" ]] || fail "both supervisors pin at $da"
[[ $da == /sys/fs/bpf/belayer/* && $db == /sys/fs/bpf/belayer/* ]] ||
	fail "pin directories outside /sys/fs/bpf/belayer: $da $db"
ia=$(inodes "$da") || fail "supervisor a's pins are missing in $da"
inodes "$db" >/dev/null || fail "supervisor b's pins are missing in $db"

# A third supervisor told to pin in a's directory: refused, a's pins untouched.
start c "env.pin_dir=$da"
grep -q "held by another running supervisor" "$dir/c.log" ||
	fail "supervisor c did not refuse a's pin directory"
[[ $(inodes "$da") == "$ia" ]] || fail "supervisor c replaced a's pins"
stop c
[[ $(inodes "$da" 2>/dev/null) == "$ia" ]] || fail "supervisor c's stop removed or replaced a's pins"

# Stopping b removes b's pins, not a's.
stop b
[[ ! -e $db/watched ]] || fail "supervisor b's clean stop left its pins in $db"
[[ $(inodes "$da" 2>/dev/null) == "$ia" ]] || fail "supervisor b's stop removed or replaced a's pins"
stop a
[[ ! -e $da/watched ]] || fail "supervisor a's clean stop left its pins in $da"
echo "ok: a at $da, b at $db; c refused a's directory; each stop removed only its own pins"
