#!/bin/bash
# SPDX-License-Identifier: MIT
# belayerctl env fork (issue 20 item 4) through a real supervisor: a source environment whose
# server holds state in memory is checkpointed, goes on, and is forked eight times from that
# checkpoint. Every fork serves the checkpoint's state (not the source's later one) on the same
# port in a network namespace of its own, is listed, checkpoints and restores on its own, and
# outlives its source. Refusals: a taken name, an unknown source, a bad count; a fork whose
# restore fails leaves none of the group behind.
# Usage: test-env-fork.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2
command -v python3 >/dev/null || fail "python3 is needed for the server"

forks=(f-1 f-2 f-3 f-4 f-5 f-6 f-7 f-8)
env_fixture envfork src "${forks[@]}" bad-1 bad-2 bad-3
on_fail() { tail -n 30 "$dir/sv.log"; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
env_state_server "$dir/base"
env_conf
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }
# ask ENV REQUEST: the answer of ENV's server, inside ENV's network namespace.
ask() { env_ask "$1" "$port" "$2"; }

supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
ctl env create src --root "$dir/base" --cmd "cd /work; python3 srv.py $port & exec sleep infinity" >/dev/null
for _ in $(seq 200); do [[ -e $dir/state/envs/src/root/work/ready ]] && break; sleep 0.05; done
[[ $(ask src "set turn-3") == "turn-3 1" ]] || fail "the source's server did not answer"
ctl env checkpoint src --turn 3 >/dev/null
[[ $(ask src "set later") == "later 2" ]] || fail "the source moved on wrongly"

# Eight forks of the checkpoint, at once.
t0=$(date +%s%N)
out=$(ctl env fork src --as f --count 8) || fail "fork failed: $out"
t1=$(date +%s%N)
echo "8 forks in $(((t1 - t0) / 1000000)) ms (belayerctl's wall time, every one restored)"
[[ $(grep -c '^f-' <<<"$out") == 8 ]] || fail "fork did not answer 8 environments: $out"
for f in "${forks[@]}"; do
	[[ $(ask "$f" get) == "turn-3 2" ]] || fail "$f does not serve the checkpoint's state: $(ask "$f" get)"
	grep -q "^$f " < <(ctl env list) || fail "$f is not listed"
done
# Each counts on its own; the source kept its own state.
[[ $(ask f-1 "set only-f-1") == "only-f-1 3" ]] || fail "f-1's server"
[[ $(ask f-2 get) == "turn-3 3" ]] || fail "f-2 sees f-1's state"
[[ $(ask src get) == "later 3" ]] || fail "the source was changed by a fork: $(ask src get)"

# Refusals, with nothing made.
err=$(ctl env fork src --as f-1 2>&1) && fail "a taken name was accepted"
grep -q "exists" <<<"$err" || fail "taken name: $err"
err=$(ctl env fork nosuch --as x 2>&1) && fail "an unknown source was accepted"
grep -q "no environment nosuch" <<<"$err" || fail "unknown source: $err"
ctl env fork src --as y --count 65 2>/dev/null && fail "--count 65 was accepted"
ctl env fork src 2>/dev/null && fail "a fork without --as was accepted"

# A fork lives on its own: checkpoint, change, restore; then without its source.
ctl env checkpoint f-3 --turn 4 >/dev/null
ask f-3 "set f-3-later" >/dev/null
ctl env restore f-3 >/dev/null
[[ $(ask f-3 get) == "turn-3 3" ]] || fail "f-3 did not restore its own checkpoint: $(ask f-3 get)"
ctl env destroy src >/dev/null
[[ $(ask f-4 get) == "turn-3 3" ]] || fail "f-4 died with its source"
ctl env fork f-4 --as src >/dev/null || fail "a fork of a fork failed"
[[ $(ask src get) == "turn-3 2" ]] || fail "the fork of a fork: $(ask src get)"

# All or none: a checkpoint whose CRIU images are broken forks into nothing.
ctl env checkpoint src --turn 5 >/dev/null
head=$(ctl env list src | tail -n1 | awk '{print $2}')
printf 'garbage' >"$dir/state/envs/src/ckpt/$head/criu/pstree.img"
err=$(ctl env fork src --checkpoint "$head" --as bad --count 3 2>&1) && fail "a broken checkpoint forked"
grep -q "fork failed" <<<"$err" || fail "broken checkpoint: $err"
ctl env list | grep -q '^bad-' && fail "a failed group left forks: $(ctl env list)"
for b in bad-1 bad-2 bad-3; do [[ -d $cg/$b ]] && fail "$b's cgroup is left"; done
for f in "${forks[@]}"; do ctl env destroy "$f" >/dev/null; done
echo "PASS"
