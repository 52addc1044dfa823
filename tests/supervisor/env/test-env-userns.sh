#!/bin/bash
# SPDX-License-Identifier: MIT
# [env] userns (issue 19): an environment's root is an unprivileged host uid (userns_base),
# sees the base image's files as its own (an idmapped lower layer) and the host's /usr as
# nobody's; the sandbox's probes are all contained in it; CRIU checkpoints and restores it,
# the restored processes in the same map.
# Usage: test-env-userns.sh SUPERVISOR BELAYERCTL PROBE
set -euo pipefail

supervisor=$1
ctl_bin=$2
probe_bin=$3
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2

env_fixture userns u1 u2 u1f
cp "$probe_bin" "$dir/base/work/probe"
echo "from the image" >"$dir/base/work/image-file"
# device nodes in its file system, made on the host side: the device allow-list refuses them
# inside the user namespace too (its /dev nodes are the host's, bind-mounted)
mknod "$dir/base/work/kmsg" c 1 11
blk=
for b in /sys/dev/block/*; do blk=${b##*/} && break; done
[[ $blk == *:* ]] || fail "no block device to make a node of"
mknod "$dir/base/work/blk" b "${blk%%:*}" "${blk##*:}"
base=200000

cat >"$dir/conf.ini" <<CONF
[supervisor]
socket = $dir/sv.sock
state_dir = $dir/state
[journal]
enabled = no
[health]
interval = 0
[env]
cgroup = $cg
pids_max = 200
memory_max = 128M
userns = yes
userns_base = $base
CONF
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }

# Inside: who it is, whose the image's and the host's files are, a file of its own in an
# image directory; then the probes; then, each time /tmp/go appears, the same again.
cat >"$dir/base/work/run" <<'SH'
#!/bin/sh
report() {
	{ id -u; id -g; stat -c %u /work/probe; stat -c %u /usr/bin/env; } >/tmp/id-$1.txt
	echo "$1" >>/work/image-file && echo written >/work/new-$1
	./probe devnodes=/work/kmsg,/work/blk >/tmp/probes-$1.txt 2>&1
	touch /tmp/done-$1
}
cd /work
report 1
n=2
while :; do
	if [ -e /tmp/go ]; then rm /tmp/go; report $n; n=$((n + 1)); fi
	sleep 0.05
done
SH
chmod +x "$dir/base/work/run"
ctl env create u1 --root "$dir/base" --cmd 'exec /work/run' >/dev/null
root=$dir/state/envs/u1/root
upper=$dir/state/envs/u1/upper

# check N WHEN: the environment's view and the host's of round N
check() {
	local pid
	for _ in $(seq 600); do [[ -e $root/tmp/done-$1 ]] && break; sleep 0.05; done
	[[ -e $root/tmp/done-$1 ]] || fail "round $1 did not finish ($2)"
	pid=$(ctl --json env list | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
	[[ -n $pid ]] || fail "no pid ($2)"
	read -r inside outside count <"/proc/$pid/uid_map"
	[[ "$inside $outside $count" == "0 $base 65536" ]] ||
		fail "uid_map is '$inside $outside $count' ($2)"
	[[ $(awk '/^Uid:/ {print $2}' "/proc/$pid/status") == "$base" ]] ||
		fail "the init is not host uid $base ($2)"
	# root, group root, an image file it never wrote root's, the host's /usr nobody's
	[[ $(tr '\n' ' ' <"$root/tmp/id-$1.txt") == "0 0 0 65534 " ]] ||
		fail "inside it sees $(tr '\n' ' ' <"$root/tmp/id-$1.txt") ($2)"
	# what it wrote is the unprivileged uid's on the host, in the upper layer
	[[ $(stat -c %u "$upper/work/new-$1") == "$base" ]] ||
		fail "its file is uid $(stat -c %u "$upper/work/new-$1") on the host ($2)"
	grep -q "^$1\$" "$upper/work/image-file" || fail "it could not write the image's file ($2)"
	grep -q '^done 0 escaped$' "$root/tmp/probes-$1.txt" ||
		fail "probes got out ($2): $(grep ESCAPED "$root/tmp/probes-$1.txt")"
	echo "userns round $1 ($2): pid $pid, uid_map 0 $base 65536, $(grep -c ' contained ' \
		"$root/tmp/probes-$1.txt") probes contained"
}
check 1 "at creation"

# With a disk limit the upper layer is on a tmpfs of its own: what the environment writes there
# is the unprivileged uid's too, its root directory its root's.
ctl env create u2 --root "$dir/base" --disk 16M --cmd 'echo x >/work/on-disk; exec sleep infinity' >/dev/null
for _ in $(seq 100); do [[ -e $dir/state/envs/u2/disk/upper/work/on-disk ]] && break; sleep 0.05; done
[[ $(stat -c %u "$dir/state/envs/u2/disk/upper/work/on-disk") == "$base" ]] ||
	fail "u2's file on its disk tmpfs: $(stat -c %u "$dir/state/envs/u2/disk/upper/work/on-disk" 2>&1)"
[[ $(stat -c %u:%g "$dir/state/envs/u2/disk/upper") == "$base:$base" ]] ||
	fail "u2's upper root is $(stat -c %u:%g "$dir/state/envs/u2/disk/upper")"
ctl env destroy u2 >/dev/null

ctl env checkpoint u1 --turn 1
ctl env restore u1
touch "$root/tmp/go"
check 2 "after a restore"

# An environment keeps the choice it was created with: a supervisor restarted with userns = no
# takes it back and restores it in its own map (the checkpoint's: round 2 again, its files
# rolled back).
kill -KILL "$sv_pid"
wait "$sv_pid" 2>/dev/null || true
sed -i 's/^userns = yes$/userns = no/' "$dir/conf.ini"
rm -f "$dir/sv.sock"
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv2.log"
ctl env restore u1 >/dev/null
touch "$root/tmp/go"
check 2 "restored by a supervisor restarted with userns = no"
# and a fork of it has its map too (its checkpoint and layers were made for it), not the
# configuration's; it is the checkpoint's tree, at round 2 again
ctl env fork u1 --as u1f >/dev/null || fail "fork under userns = no"
fpid=$(ctl --json env list | grep '"env":"u1f"' | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
[[ $(xargs <"/proc/$fpid/uid_map") == "0 $base 65536" ]] ||
	fail "the fork's uid_map: $(xargs <"/proc/$fpid/uid_map")"
frun=$dir/state/envs/u1f/root
touch "$frun/tmp/go"
for _ in $(seq 600); do [[ -e $frun/tmp/done-2 ]] && break; sleep 0.05; done
[[ $(tr '\n' ' ' <"$frun/tmp/id-2.txt") == "0 0 0 65534 " ]] ||
	fail "inside the fork: $(tr '\n' ' ' <"$frun/tmp/id-2.txt" 2>&1)"
ctl env destroy u1f >/dev/null
echo "userns: root is host uid $base, checkpointed and restored by CRIU"
