#!/bin/bash
# SPDX-License-Identifier: MIT
# A hostile agent inside an environment (issue 19): sandbox-probe runs as the environment's own
# command and tries, one probe each, every way out that got through before (privileges, host
# files, the host's /etc secrets, mounts, devices, /proc, the host's network and the
# supervisor, other environments, the kernel, a fork bomb and a memory hog against [env]
# pids_max and memory_max). Every probe
# must be contained: at creation and again after a checkpoint and a
# restore (the same processes, now CRIU's). A second environment is the victim.
# USERNS: [env] userns, yes (the default) or no.
# Usage: test-sandbox.sh SUPERVISOR BELAYERCTL PROBE [USERNS]
set -euo pipefail

supervisor=$1
ctl_bin=$2
probe_bin=$3
userns=${4:-yes}
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2
command -v python3 >/dev/null || fail "python3 is needed for the host services"

env_fixture sandbox e1 e2 e3
host_pids=()
# Host secrets of /etc beyond shadow and gshadow, made for the test (removed on any exit):
# a 0600 file, and a 0700 directory holding a world-readable file.
etc_file=/etc/belayer-test-secret-$$
etc_dir=/etc/belayer-test-secret-dir-$$
cleanup_all() {
	for p in "${host_pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$etc_file" "$etc_dir"
	env_fixture_cleanup
}
trap cleanup_all EXIT
trap 'exit 1' INT TERM HUP
(umask 077 && echo "etc secret $$" >"$etc_file")
mkdir -m 0700 "$etc_dir"
echo "dir secret $$" >"$etc_dir/key"
chmod 0644 "$etc_dir/key"
[[ -s /etc/shadow ]] || fail "the host has no /etc/shadow to hide"
cp "$probe_bin" "$dir/base/work/probe"
cp "$(dirname "${BASH_SOURCE[0]}")/env-workload.sh" "$dir/base/work/workload"
# Device nodes that got into the environment's file system (made here, on the host side, in
# its base): /dev/kmsg's and this machine's first block device's. The allow-list refuses both.
mknod "$dir/base/work/kmsg" c 1 11
blk=
for b in /sys/dev/block/*; do blk=${b##*/} && break; done
[[ $blk == *:* ]] || fail "no block device to make a node of"
mknod "$dir/base/work/blk" b "${blk%%:*}" "${blk##*:}"

# Host services a hostile agent would want: a TCP service and an abstract unix socket on
# loopback, each answering a secret; the supervisor's metrics. Their ports come back in a file.
python3 - "$dir/host-ports" <<'PY' &
import os, select, socket, sys
tcp = socket.socket(); tcp.bind(("127.0.0.1", 0)); tcp.listen(16)
ab = socket.socket(socket.AF_UNIX); name = "belayer-sandbox-%d" % os.getpid()
ab.bind("\0" + name); ab.listen(16)
metrics = socket.socket(); metrics.bind(("127.0.0.1", 0))
mport = metrics.getsockname()[1]; metrics.close()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("%d %s %d\n" % (tcp.getsockname()[1], name, mport))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    for s in select.select([tcp, ab], [], [])[0]:
        c, _ = s.accept(); c.sendall(b"host secret\n"); c.close()
PY
host_pids+=($!)
for _ in $(seq 100); do [[ -s $dir/host-ports ]] && break; sleep 0.05; done
read -r tcp_port abstract metrics_port <"$dir/host-ports" || fail "no host services"
echo "host only" >"$dir/host-secret"

cat >"$dir/conf.ini" <<CONF
[supervisor]
socket = $dir/sv.sock
state_dir = $dir/state
[journal]
enabled = no
[health]
interval = 0
[metrics]
http_port = $metrics_port
[env]
cgroup = $cg
pids_max = 200
memory_max = 128M
userns = $userns
CONF
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }

ctl env create e2 --root "$dir/base" --cmd 'echo mine >/work/victim; exec sleep infinity' >/dev/null
args="tcp=$tcp_port abstract=$abstract metrics=$metrics_port svsock=$dir/sv.sock"
args+=" svpid=$sv_pid hostfile=$dir/host-secret other=$dir/state/envs/e2/upper state=$dir/state"
args+=" devnodes=/work/kmsg,/work/blk"
args+=" etcfile=$etc_file etcdir=$etc_dir"
# The probes run at start, then again each time /work/go appears (after the restore): the same
# shell, checkpointed and restored by CRIU, starts them.
cat >"$dir/base/work/run-probes" <<SH
#!/bin/sh
cd /work
./probe $args >probes-1.txt 2>&1; ./workload /tmp >>probes-1.txt 2>&1; touch probes-1.done
n=2
while :; do
	if [ -e go ]; then
		rm go; ./probe $args >probes-\$n.txt 2>&1; ./workload /tmp >>probes-\$n.txt 2>&1
		touch probes-\$n.done; n=\$((n + 1))
	fi
	sleep 0.05
done
SH
chmod +x "$dir/base/work/run-probes"
ctl env create e1 --root "$dir/base" --cmd 'exec /work/run-probes' >/dev/null
root=$dir/state/envs/e1/root

# check_probes N WHEN: every probe of round N contained, and each probe present; the host's
# programs of the workload ran.
check_probes() {
	local out=$root/work/probes-$1.txt n
	for _ in $(seq 600); do [[ -e $root/work/probes-$1.done ]] && break; sleep 0.05; done
	[[ -e $root/work/probes-$1.done ]] || fail "the probes did not finish ($2): $(cat "$out")"
	echo "--- probes $2:"
	cat "$out"
	grep -q '^done 0 escaped$' "$out" || fail "probes got out $2: $(grep ESCAPED "$out")"
	# and what an agent runs still runs: bash, dash, python3, git, make, gcc, pytest
	grep -q '^workload 0 failed$' "$out" || fail "programs failed $2: $(grep FAILED "$out")"
	[[ $(grep -c ' ok$' "$out") -ge 5 ]] || fail "the workload did not run $2"
	n=$(grep -c ' contained ' "$out")
	[[ $n -ge 74 ]] || fail "only $n probes ran $2"
}

# check_etc_read WHEN: env read (the supervisor's openat2 in the environment's root) gives
# nothing of the host's secrets of /etc, and its public files as they are.
check_etc_read() {
	local f out
	for f in etc/shadow etc/gshadow "${etc_file#/}" "${etc_dir#/}/key"; do
		out=$(ctl env read e1 "$f" 2>/dev/null) || true
		[[ -z $out ]] || fail "env read $f gives the host's secret $1: $(head -c 64 <<<"$out")"
	done
	[[ $(ctl env read e1 etc/passwd) == "$(cat /etc/passwd)" ]] ||
		fail "env read etc/passwd is not the host's $1"
	out=$(ctl env exec e1 -- sh -c "cat /etc/shadow $etc_file; ls -A $etc_dir" 2>/dev/null) || true
	[[ -z $out ]] || fail "env exec reads the host's secrets $1: $(head -c 64 <<<"$out")"
}
check_etc_read "at creation"
check_probes 1 "at creation"
pid1=$(ctl --json env list | grep '"env":"e1"' | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
want_map="0 0 4294967295"
[[ $userns == yes ]] && want_map="0 100000 65536"
[[ $(xargs <"/proc/$pid1/uid_map") == "$want_map" ]] ||
	fail "e1's uid_map is $(xargs <"/proc/$pid1/uid_map"), not $want_map (userns = $userns)"

# check_devices WHEN: e1's device rules, v1 and v2 both (the kernel checks both here).
check_devices() {
	local pid1 devs
	pid1=$(ctl --json env list | grep '"env":"e1"' | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
	devs=$(cgroup_dir "$pid1" devices)
	if [[ -e $devs/devices.list ]]; then
		[[ "$(sort "$devs/devices.list" | tr '\n' ' ')" == "c 136:* rw c 1:3 rwm c 1:5 rwm c 1:7 rwm c 1:8 rwm c 1:9 rwm c 5:0 rwm c 5:2 rw " ]] ||
			fail "e1's v1 device rules $1: $(cat "$devs/devices.list")"
	fi
	if command -v bpftool >/dev/null; then
		[[ $(bpftool cgroup list "$cg/e1") == *cgroup_device* ]] ||
			fail "no device program on e1's cgroup $1: $(bpftool cgroup list "$cg/e1")"
	fi
}
check_devices "at creation"

# Checkpoint and restore keep all of it: the restored processes are probed again.
ctl env checkpoint e1 --turn 1 >/dev/null
ctl env restore e1 >/dev/null
touch "$root/work/go"
check_etc_read "after a restore"
check_probes 2 "after a restore"
check_devices "after a restore"
[[ $(cat "$dir/state/envs/e2/root/work/victim") == mine ]] || fail "the victim's file changed"

# A create's own limits, where the kernel enforces them (v1 here, v2 on a pure v2 host); bad
# ones refused.
ctl env create e3 --root "$dir/base" --pids 50 --memory 64M --cpus 0.5 >/dev/null
pid3=$(ctl --json env list | grep '"env":"e3"' | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
[[ -n $pid3 ]] || fail "no pid for e3"
[[ $(cat "$(cgroup_dir "$pid3" pids)/pids.max") == 50 ]] || fail "e3's pids.max is not 50"
mem=$(cgroup_dir "$pid3" memory)
if [[ -e $mem/memory.max ]]; then want_mem=$(cat "$mem/memory.max"); else
	want_mem=$(cat "$mem/memory.limit_in_bytes"); fi
[[ $want_mem == 67108864 ]] || fail "e3's memory limit is $want_mem, not 64M"
cpu=$(cgroup_dir "$pid3" cpu)
if [[ -e $cpu/cpu.max ]]; then q=$(cut -d' ' -f1 "$cpu/cpu.max"); else
	q=$(cat "$cpu/cpu.cfs_quota_us"); fi
[[ $q == 50000 ]] || fail "e3's CPU quota is $q, not 50000 (half of 100 ms)"
if ctl env create e4 --root "$dir/base" --cpus 2000 2>"$dir/e4.err"; then
	fail "2000 CPUs accepted"
fi
grep -q "cpu at most" "$dir/e4.err" || fail "the refusal does not say why: $(cat "$dir/e4.err")"
ctl env destroy e3 >/dev/null
echo "sandbox (userns = $userns): every probe contained, at creation and after a restore"
