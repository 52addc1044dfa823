#!/bin/bash
# SPDX-License-Identifier: MIT
# The disk limit on an environment's writable layer (issue 19; [env] disk_max, env create
# --disk): an environment created with --disk 8M that writes 20 MB gets ENOSPC, while another
# environment writes 20 MB and the supervisor answers; checkpoint and restore of the limited
# environment work (the layer is rolled back on its tmpfs, the limit still holds after); a
# restarted supervisor takes it back with its layer; a rebuild keeps the limit; destroy unmounts
# the tmpfs. And what a restart does for the device allow-list: a cgroup that lost its device
# program gets it back.
# Usage: test-env-disk.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2

env_fixture envdisk d1 d2 d3 df
env_conf
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }

# The agent: runs /work/cmd when it appears (from inside: its writes are the environment's),
# leaves its exit status and stderr in its /dev/shm (not on the layer, which may be full).
cat >"$dir/base/work/agent" <<'SH'
#!/bin/sh
while :; do
	if [ -e /work/cmd ]; then
		sh /work/cmd 2>/dev/shm/err; echo $? >/dev/shm/rc.tmp; rm /work/cmd
		mv /dev/shm/rc.tmp /dev/shm/rc
	fi
	sleep 0.05
done
SH
chmod +x "$dir/base/work/agent"

# shm ENV: the environment's /dev/shm, through its init.
shm() {
	local pid
	pid=$(ctl --json env list | grep "\"env\":\"$1\"" | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
	echo "/proc/$pid/root/dev/shm"
}
# agent ENV COMMAND: runs COMMAND inside ENV; prints its exit status (its stderr: $(shm ENV)/err).
agent() {
	local w=$dir/state/envs/$1/root/work s
	s=$(shm "$1")
	rm -f "$s/rc"
	echo "$2" >"$w/cmd.tmp" && mv "$w/cmd.tmp" "$w/cmd"
	for _ in $(seq 400); do [[ -e $s/rc ]] && break; sleep 0.05; done
	[[ -e $s/rc ]] || fail "$1 did not run: $2"
	cat "$s/rc"
}
fill='dd if=/dev/zero of=/work/big bs=1M count=20'

ctl env create d1 --root "$dir/base" --cmd 'exec /work/agent' --disk 8M >/dev/null
ctl env create d2 --root "$dir/base" --cmd 'exec /work/agent' >/dev/null
disk=$dir/state/envs/d1/disk
grep -q " $disk .* - tmpfs .*size=8192k" /proc/self/mountinfo ||
	fail "no 8M tmpfs at $disk: $(grep "$dir" /proc/self/mountinfo)"
[[ ! -e $dir/state/envs/d2/disk ]] || fail "d2 (no limit) has a disk tmpfs"

# 20 MB into 8M: ENOSPC inside; the other environment writes its 20 MB; the supervisor answers.
rc=$(agent d1 "$fill")
[[ $rc != 0 ]] || fail "d1 wrote 20 MB under --disk 8M"
grep -q "No space left on device" "$(shm d1)/err" ||
	fail "d1's write failed otherwise: $(cat "$(shm d1)/err")"
size=$(stat -c %s "$dir/state/envs/d1/root/work/big")
((size <= 8 << 20)) || fail "d1 holds $size bytes"
[[ $(agent d2 "$fill") == 0 ]] || fail "d2 (no limit) could not write 20 MB"
# (no "| grep -q": with pipefail, belayerctl killed by SIGPIPE would fail it)
[[ $(ctl env list) == *d2* ]] || fail "the supervisor does not answer"

# The tmpfs's pages are the environment's memory: 20 MB written show in its memory cgroup.
ctl env create d3 --root "$dir/base" --cmd 'exec /work/agent' --disk 64M >/dev/null
[[ $(agent d3 "$fill") == 0 ]] || fail "d3 could not write 20 MB under --disk 64M"
pid3=$(ctl --json env list | grep '"env":"d3"' | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
mem=$(cgroup_dir "$pid3" memory)
if [[ -e $mem/memory.current ]]; then used=$(cat "$mem/memory.current"); else
	used=$(cat "$mem/memory.usage_in_bytes"); fi
((used >= 20 << 20)) || fail "d3's memory cgroup holds $used bytes after 20 MB written"
devs3=$(cgroup_dir "$pid3" devices)
ctl env destroy d3 >/dev/null
[[ ! -e $devs3 ]] || fail "destroy left d3's v1 cgroup $devs3"

# Checkpoint and restore of the limited environment: the layer rolls back on its tmpfs.
[[ $(agent d1 'rm /work/big && echo kept >/work/kept') == 0 ]] || fail "d1 cannot free its disk"
ctl env checkpoint d1 --turn 1 >/dev/null
[[ $(agent d1 "echo lost >/work/lost; $fill") != 0 ]] || fail "d1 wrote 20 MB after a checkpoint"
ctl env restore d1 >/dev/null
w=$dir/state/envs/d1/root/work
[[ $(cat "$w/kept") == kept && ! -e $w/lost && ! -e $w/big ]] ||
	fail "d1 after the restore: $(ls "$w")"
[[ $(agent d1 'dd if=/dev/zero of=/work/small bs=1M count=4') == 0 ]] ||
	fail "the restored d1 cannot write 4 MB: $(cat "$(shm d1)/err")"
[[ $(agent d1 "$fill") != 0 ]] || fail "the restored d1 wrote 20 MB under --disk 8M"
[[ $(grep -c " $disk " /proc/self/mountinfo) == 1 ]] || fail "the tmpfs is mounted more than once"

# A fork of d1 has d1's limit on a tmpfs of its own, its layer the checkpoint's, and the
# device allow-list.
ctl env fork d1 --as df >/dev/null
grep -q " $dir/state/envs/df/disk .* - tmpfs .*size=8192k" /proc/self/mountinfo ||
	fail "the fork has no 8M tmpfs of its own"
[[ $(cat "$dir/state/envs/df/root/work/kept") == kept ]] || fail "the fork lacks d1's file"
[[ $(agent df "$fill") != 0 ]] || fail "the fork wrote 20 MB under d1's --disk 8M"
[[ $(bpftool cgroup list "$cg/df") == *cgroup_device* ]] || fail "the fork has no device program"
ctl env destroy df >/dev/null

# A restarted supervisor takes d1 back with its layer (its limit from the limits file), and
# attaches the device program again to a cgroup that lost it meanwhile.
supervisor_stop "$sv_pid" || fail "the supervisor did not stop when told"
prog=$(bpftool cgroup list "$cg/d1" | awk '$2 == "cgroup_device" { print $1 }')
[[ -n $prog ]] || fail "no device program on d1's cgroup"
bpftool cgroup detach "$cg/d1" cgroup_device id "$prog"
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv2.log"
[[ $(bpftool cgroup list "$cg/d1") == *cgroup_device* ]] ||
	fail "the restart left d1 without a device program"
[[ $(agent d1 'cat /work/kept && rm /work/big') == 0 ]] || fail "d1 after a supervisor restart"
[[ $(grep -c " $disk " /proc/self/mountinfo) == 1 ]] || fail "the restart mounted another tmpfs"
ctl env checkpoint d1 --turn 2 >/dev/null
ctl env restore d1 >/dev/null
[[ $(cat "$w/kept") == kept && -e $w/small ]] || fail "d1 restored after the restart: $(ls "$w")"

# A supervisor that does not see the tmpfs (a reboot, or systemd's private mount namespace)
# cannot reach the running layer: it stops the environment, which a restore brings back from
# its head.
supervisor_stop "$sv_pid" || fail "the supervisor did not stop when told"
echo unsaved >"$w/unsaved"
umount -l "$disk"
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv3.log"
grep -q "d1's writable layer .* is not mounted here" "$dir/sv3.log" || fail "no word of it: $(cat "$dir/sv3.log")"
ctl env restore d1 >/dev/null
[[ $(cat "$w/kept") == kept && -e $w/small && ! -e $w/unsaved ]] ||
	fail "d1 restored from its head onto a new tmpfs: $(ls "$w")"
[[ $(agent d1 "$fill") != 0 ]] || fail "d1 on its new tmpfs wrote 20 MB"

# A rebuild (the replay baseline) empties the layer on the same tmpfs; the limit holds.
ctl env rebuild d1 >/dev/null
[[ ! -e $w/kept ]] || fail "the rebuilt d1 kept its layer"
[[ $(agent d1 "$fill") != 0 ]] || fail "the rebuilt d1 wrote 20 MB under --disk 8M"

ctl env destroy d1 >/dev/null
! grep -q " $disk " /proc/self/mountinfo || fail "destroy left the tmpfs mounted"
[[ ! -e $disk ]] || fail "destroy left $disk"
echo "env-disk: ENOSPC at 8M inside, others unaffected, checkpoint/restore and restart keep the layer"
