#!/bin/bash
# SPDX-License-Identifier: MIT
# Checkpoint kinds (issue 23 item 3) through a real supervisor with its tracer: a turn that
# changed nothing is skipped (the head's id, kind "skipped"); a file written through env write
# while no process ran makes an fs-only checkpoint (the head's process images, hard-linked);
# a restore of it gives the processes as of the last full dump and the files as of it; a
# process that served a request, an exec, a restore, or a busy loop that never makes a syscall
# make the next one full; a fork of an fs-only checkpoint is as its restore. --new takes a
# checkpoint even when nothing changed.
# Usage: test-env-kinds.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2
command -v python3 >/dev/null || fail "python3 is needed for the server"

env_fixture envkinds k1 k2 k3 k1f k4
on_fail() { tail -n 30 "$dir/sv.log"; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
env_state_server "$dir/base"
env_conf
sed -i 's/^trace = no$/trace_preload = yes/' "$dir/conf.ini"
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }
ask() { env_ask "$1" "$port" "$2"; }
# ckpt ENV TURN [ARGS]: checkpoints, prints "ID KIND" (its whole reply in $dir/last.json).
ckpt() {
	local out
	out=$(ctl --json env checkpoint "$1" --turn "$2" "${@:3}") || fail "checkpoint $1 turn $2: $out"
	printf '%s\n' "$out" >"$dir/last.json"
	python3 -c 'import json, sys; j = json.loads(sys.argv[1]); print(j["checkpoint"], j["kind"])' "$out"
}
put() { printf '%s' "$3" >"$dir/in"; ctl env write "$1" "$2" <"$dir/in" >/dev/null; }
get() { ctl env read "$1" "$2"; }
expect() { [[ $2 == "$3" ]] || fail "$1: got '$2', expected '$3'"; }

supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
grep -q "Environment tracing on" "$dir/sv.log" || fail "tracer not loaded: $(cat "$dir/sv.log")"
ctl env create k1 --root "$dir/base" --cmd "cd /work; exec python3 srv.py $port" >/dev/null
for _ in $(seq 200); do [[ -e $dir/state/envs/k1/root/work/ready ]] && break; sleep 0.05; done
expect "first request" "$(ask k1 "set A")" "A 1"
put k1 /work/f.txt one

read -r c1 kind < <(ckpt k1 1)
expect "the first checkpoint's kind" "$kind" full
# Nothing happened since: no checkpoint, the head answers.
read -r id kind < <(ckpt k1 2)
expect "an unchanged turn" "$id $kind" "$c1 skipped"
read -r id kind < <(ckpt k1 3)
expect "a second unchanged turn" "$id $kind" "$c1 skipped"
ls "$dir/state/envs/k1/ckpt" | grep -qvx "$c1" && fail "a skipped turn left a checkpoint: $(ls "$dir/state/envs/k1/ckpt")"

# A file written from outside, no process ran: the file system only.
put k1 /work/f.txt two
read -r c2 kind < <(ckpt k1 4)
expect "a turn that only wrote a file" "$kind" fs-only
[[ $c2 != "$c1" ]] || fail "the fs-only checkpoint kept the head's id"
img=$(cd "$dir/state/envs/k1/ckpt/$c1/criu" && ls ./*.img | head -n1)
[[ $(stat -c %i "$dir/state/envs/k1/ckpt/$c1/criu/$img") == $(stat -c %i "$dir/state/envs/k1/ckpt/$c2/criu/$img") ]] ||
	fail "the fs-only checkpoint's images are not the full one's (hard links)"
ctl --json env list k1 | grep "\"checkpoint\":\"$c2\"" | grep -q '"kind":"fs-only"' ||
	fail "env list does not say fs-only: $(ctl --json env list k1)"
read -r id kind < <(ckpt k1 5)
expect "unchanged after an fs-only one" "$id $kind" "$c2 skipped"
read -r c2b kind < <(ckpt k1 5 --new)
expect "--new when unchanged" "$kind" fs-only
[[ $c2b != "$c2" ]] || fail "--new kept the head's id"

# The server served a request: its processes ran, the next checkpoint dumps them.
expect "second request" "$(ask k1 "set C")" "C 2"
put k1 /work/f.txt three
read -r c3 kind < <(ckpt k1 6)
expect "a turn whose process ran" "$kind" full

# The fs-only checkpoint restores the processes of the full one before it and its own files.
ctl env restore k1 --checkpoint "$c2" >/dev/null
expect "f.txt as of the fs-only checkpoint" "$(get k1 /work/f.txt)" two
expect "the server as of the full dump" "$(ask k1 get)" "A 2"
# A fork of it is the same: its images are links to the full dump's.
ctl env fork k1 --checkpoint "$c2" --as k1f >/dev/null
expect "the fork's f.txt" "$(get k1f /work/f.txt)" two
expect "the fork's server" "$(ask k1f get)" "A 2"
ctl env destroy k1f >/dev/null
# A restore resets the baseline: the restored tasks ran. Then skipped again.
read -r c4 kind < <(ckpt k1 7)
expect "the first checkpoint after a restore" "$kind" full
read -r id kind < <(ckpt k1 8)
expect "unchanged after it" "$id $kind" "$c4 skipped"
# An exec is activity.
ctl env exec k1 -- true >/dev/null
read -r id kind < <(ckpt k1 9)
expect "a turn with an exec" "$kind" full
read -r id kind < <(ckpt k1 10)
expect "unchanged after the exec's" "$kind" skipped

# The policy's view at a step end: nothing changed is "clean" (no checkpoint); a process that ran
# while no file changed is not clean any more (the policy took it for clean before).
why() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["why"])' "$1"; }
ctl --json step end tk k1 --turn 1 --tps 100 >"$dir/s1.json"
expect "a step end with nothing changed" "$(why "$dir/s1.json")" clean
ask k1 get >/dev/null
ctl --json step end tk k1 --turn 2 --tps 100 >"$dir/s2.json"
[[ $(why "$dir/s2.json") != clean ]] || fail "a step end after the server ran is called clean"

# A busy loop that makes no syscall (dash arithmetic on a builtin) is caught in user mode.
ctl env create k2 --root "$dir/base" --cpus 0.1 --cmd 'i=0; while :; do i=$((i + 1)); done' >/dev/null
read -r id kind < <(ckpt k2 1)
expect "k2's first" "$kind" full
for t in 2 3 4; do
	read -r id kind < <(ckpt k2 $t)
	expect "k2 turn $t (a process running)" "$kind" full
done
# A file a process holds open, rewritten from outside while nothing ran: the images hold its old
# size (CRIU refuses to restore against another), so the checkpoint dumps; and it restores.
# (A base file held open and replaced is saved as a CRIU ghost file: env-remap.)
ctl env create k3 --root "$dir/base" --cmd 'echo held >/work/held; exec 3</work/held; exec sleep infinity' >/dev/null
for _ in $(seq 100); do [[ -e $dir/state/envs/k3/upper/work/held ]] && break; sleep 0.05; done
read -r id kind < <(ckpt k3 1)
expect "k3's first" "$kind" full
put k3 /work/other "not held"
read -r id kind < <(ckpt k3 2)
expect "k3: a file nobody holds written" "$kind" fs-only
# Its delta was pre-copied (issue 23 item 2): the reply says so, and its bytes add up.
pc=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(j["path"], j["precopy_rounds"] >= 1, j["fs_bytes"] == j["precopy_bytes"] + j["precopy_frozen_bytes"])' "$dir/last.json")
expect "k3's pre-copy in the reply" "$pc" "dirty-set True True"
put k3 /work/held "held, and now longer"
read -r k3c kind < <(ckpt k3 3)
expect "k3: a held file written" "$kind" full
ctl env restore k3 --checkpoint "$k3c" >/dev/null || fail "k3's checkpoint does not restore"
expect "k3's held file" "$(get k3 /work/held)" "held, and now longer"
ctl env destroy k3 >/dev/null

# The counts by kind, and the memory mode, in belayerctl status.
ctl --json status >"$dir/st.json"
counts=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
k = {x["labels"]["kind"]: x["value"] for x in m if x["name"] == "belayer_env_checkpoints_total"}
sd = [x["value"] for x in m if x["name"] == "belayer_env_memory_soft_dirty"]
print(k.get("full"), k.get("fs-only"), k.get("skipped"), sd)' "$dir/st.json")
# full: k1 turns 1, 6, 7, 9, k2's four, k3's 1 and 3; fs-only: k1 4, 5 --new, k3 2;
# skipped: k1 2, 3, 5, 8, 10
# Soft-dirty tracking as CRIU probes it: a page just written reads soft-dirty (pagemap bit 55).
sd=$(python3 -c '
import ctypes, mmap, os, struct
m = mmap.mmap(-1, mmap.PAGESIZE); m[0] = 1
a = ctypes.addressof(ctypes.c_char.from_buffer(m))
f = os.open("/proc/self/pagemap", os.O_RDONLY)
print(struct.unpack("Q", os.pread(f, 8, a // mmap.PAGESIZE * 8))[0] >> 55 & 1)')
expect "checkpoints by kind in status" "$counts" "10 3 5 [$sd]"
# The mode is the kernel's capability (issue 23 item 3): "pre-dump" with soft-dirty tracking,
# "full" without (this kernel: no pre-dump is attempted).
mode=full why="no soft-dirty"
if [[ $sd == 1 ]]; then
	mode=pre-dump why="soft-dirty tracking"
fi
grep -q "Environment memory checkpoints: $mode ($why" "$dir/sv.log" ||
	fail "the memory mode ($mode) is not in the log"
ctl --json env list | grep '"env":"k1"' |
	grep -q "\"memory_mode\":\"$mode\",\"soft_dirty\":$([[ $sd == 1 ]] && echo true || echo false)" ||
	fail "env list lacks the memory mode $mode: $(ctl --json env list)"
[[ $sd == 1 ]] || ! ls "$dir"/state/envs/k1/ckpt/*/criu/pre >/dev/null 2>&1 ||
	fail "a pre-dump was made without soft-dirty tracking"
ctl env destroy k2 >/dev/null
ctl env destroy k1 >/dev/null

# [env] activity = no: the programs on every syscall are not loaded, nothing vouches for the
# processes, every checkpoint of an environment with processes dumps them.
supervisor_stop "$sv_pid" || fail "the supervisor did not stop when told"
sed -i 's/^trace_preload = yes$/trace_preload = yes\nactivity = no/' "$dir/conf.ini"
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv2.log"
grep -q "Environment tracing on" "$dir/sv2.log" || fail "tracer not loaded: $(cat "$dir/sv2.log")"
grep -q "process activity not counted" "$dir/sv2.log" || fail "activity = no is not in the log"
ctl env create k4 --root "$dir/base" --cmd 'exec sleep infinity' >/dev/null
for t in 1 2; do
	read -r id kind < <(ckpt k4 $t)
	expect "activity = no, turn $t (unchanged after the first)" "$kind" full
done
put k4 /work/f.txt one
read -r id kind < <(ckpt k4 3)
expect "activity = no, a turn that only wrote a file" "$kind" full
ctl env destroy k4 >/dev/null
echo "ok: full, skipped, fs-only (restored), --new, exec, restore, busy loop, activity = no"
