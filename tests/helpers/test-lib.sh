#!/bin/bash
# SPDX-License-Identifier: MIT
# Sourced by the test scripts that drive a real supervisor as root: skip (meson's 77; a
# failure under BELAYER_TEST_NO_SKIP=1, as CI runs), fail (calls the script's on_fail first,
# when it defines one, to show its logs), and the preconditions they share.

skip() {
	echo "SKIP: $*"
	[[ ${BELAYER_TEST_NO_SKIP:-0} == 1 ]] && exit 1
	exit 77
}

fail() {
	echo "FAIL: $*" >&2
	if [[ $(type -t on_fail) == function ]]; then
		on_fail >&2 || true
	fi
	exit 1
}

# Root, and the cgroup v2 hierarchy environments are made in (hybrid hosts: its unified
# mount).
need_root_cgroup_v2() {
	((EUID == 0)) || skip "needs root"
	[[ -d /sys/fs/cgroup/unified ]] || skip "no cgroup v2 at /sys/fs/cgroup/unified"
}

# env_fixture TAG ENV...: $dir (a temporary directory), $cg (a cgroup v2 parent for the
# supervisor's environments), an empty base root at $dir/base, and an EXIT trap that stops the
# supervisor ($sv_pid), kills and unmounts the named environments and removes $cg and $dir.
env_fixture() {
	local tag=$1
	shift
	dir=$(mktemp -d "/tmp/belayer-$tag.XXXXXX")
	cg=/sys/fs/cgroup/unified/belayer-$tag-$$
	sv_pid=
	fixture_envs=("$@")
	trap env_fixture_cleanup EXIT
	mkdir -p "$dir"/base/{usr,etc,dev,proc,tmp,work}
	for l in bin lib lib64 sbin; do ln -s "usr/$l" "$dir/base/$l"; done
}

# supervisor_stop PID: SIGTERM, then up to 30 s for it to exit and be reaped. A supervisor
# still there is killed (SIGKILL) and the function says so and returns 1: not stopping when
# told is a defect, and an unbounded wait would hang the test until meson's timeout.
supervisor_stop() {
	local end=$((SECONDS + 30))
	kill "$1" 2>/dev/null || true
	while kill -0 "$1" 2>/dev/null && ((SECONDS < end)); do sleep 0.05; done
	if kill -0 "$1" 2>/dev/null; then
		echo "the supervisor (pid $1) did not exit within 30 s of SIGTERM: killed" >&2
		kill -KILL "$1" 2>/dev/null || true
		wait "$1" 2>/dev/null || true
		return 1
	fi
	wait "$1" 2>/dev/null || true
}

env_fixture_cleanup() {
	local stopped=0
	[[ -n $sv_pid ]] && { supervisor_stop "$sv_pid" || stopped=1; }
	for e in "${fixture_envs[@]}"; do
		[[ -d $cg/$e ]] && { echo 1 >"$cg/$e/cgroup.kill" 2>/dev/null || true; }
		umount -l "$dir/state/envs/$e/root" 2>/dev/null || true
		umount -l "$dir/state/envs/$e/disk" 2>/dev/null || true
	done
	# The killed trees leave their cgroups once the kernel has reaped them, the v2 ones and
	# their v1 mirrors (limits, device rules: <mount><own cgroup>/<$cg's name>/ENV).
	local mirrors m
	for _ in $(seq 50); do
		rmdir "$cg"/* 2>/dev/null || true
		rmdir "$cg" 2>/dev/null || true
		mirrors=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 8 -type d -name "${cg##*/}" 2>/dev/null)
		for m in $mirrors; do rmdir "$m"/* "$m" 2>/dev/null || true; done
		[[ ! -e $cg && -z $mirrors ]] && break
		sleep 0.1
	done
	rm -rf "$dir"
	# (an exit in an EXIT trap sets the script's status: only for this failure)
	((stopped == 0)) || exit 1
}

# cgroup_mount CONTROLLERS: the mount point of the cgroup hierarchy a /proc/PID/cgroup line's
# controller list names ("" for v2, "cpu,cpuacct", "pids"...).
cgroup_mount() {
	awk -v c="${1%%,*}" '{
		split($0, half, " - "); split(half[2], f, " ")
		if (c == "" ? f[1] == "cgroup2" : f[1] == "cgroup" && ("," f[3] ",") ~ ("," c ",")) {
			print $5; exit
		}
	}' /proc/self/mountinfo
}

# cgroup_dir PID CONTROLLER: PID's cgroup directory in the hierarchy holding CONTROLLER (v2's
# when none of the v1 ones does).
cgroup_dir() {
	local ctls path v2=
	while IFS=: read -r _ ctls path; do
		[[ -z $ctls ]] && v2=$(cgroup_mount "")$path
		[[ ,$ctls, == *,$2,* ]] && { echo "$(cgroup_mount "$ctls")$path"; return; }
	done <"/proc/$1/cgroup"
	echo "$v2"
}

# env_join PID: a shell prefix that moves the shell into every cgroup PID is in ("echo $$
# >.../cgroup.procs && " for v2 and for the v1 cgroups of an environment's limits): nsenter -a
# enters the namespaces only, and a process outside the environment's cgroups cannot be
# checkpointed.
env_join() {
	local ctls path mnt
	while IFS=: read -r _ ctls path; do
		[[ $path == / ]] && continue
		mnt=$(cgroup_mount "$ctls")
		# shellcheck disable=SC2016 # $$ is the entering shell's, expanded there
		[[ -n $mnt ]] && printf 'echo $$ >%s%s/cgroup.procs && ' "$mnt" "$path"
	done <"/proc/$1/cgroup"
}

# env_conf: $dir/conf.ini for a supervisor of env_fixture's $dir and $cg, tracing off (the
# environment tests' common configuration).
env_conf() {
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
trace = no
CONF
}

# env_state_server BASE: BASE/work/srv.py, a server (python3 srv.py PORT) that keeps state in
# memory: "set X" keeps X, anything else answers "X N" (N: requests it served); it creates
# /work/ready once listening. It holds a shared anonymous mapping ("/dev/zero (deleted)" in its
# maps, as multiprocessing's shared memory), which is no file of the environment.
env_state_server() {
	cat >"$1/work/srv.py" <<'PY'
import mmap, socket, sys
shared = mmap.mmap(-1, 4096)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
state, n = "empty", 0
open("/work/ready", "w").close()
while True:
    c, _ = s.accept()
    req = c.recv(256).decode().strip(); n += 1
    if req.startswith("set "):
        state = req[4:]
    c.sendall(("%s %d\n" % (state, n)).encode()); c.close()
PY
}

# env_ask ENV PORT REQUEST: the answer of ENV's env_state_server, inside ENV's network namespace
# (its cgroup: $cg/ENV).
env_ask() {
	local pid
	pid=$(head -n1 "$cg/$1/cgroup.procs") || return 1
	nsenter -t "$pid" -n python3 -c '
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
c.sendall(sys.argv[2].encode()); print(c.recv(256).decode().strip())' "$2" "$3"
}

# supervisor_start SUPERVISOR CONF LOG: starts it in the background ($sv_pid), its socket at
# $dir/sv.sock; fails unless it listens within 10 s.
supervisor_start() {
	"$1" -c "$2" >"$3" 2>&1 &
	sv_pid=$!
	for _ in $(seq 200); do grep -q "Listening on" "$3" && break; sleep 0.05; done
	[[ -S $dir/sv.sock ]] || fail "supervisor did not start: $(cat "$3")"
}

# oci_layout OCI CONFIG TAR...: an OCI image layout at OCI of the uncompressed tar layers TAR,
# bottom first (each moved into it as a blob named by its sha256), with an index, a manifest
# and an image config whose "config" object is CONFIG (JSON), as the image tests write them
# by hand.
oci_layout() {
	local oci=$1 config=$2 layer d size layers_json='' diff_ids='' cfg man
	shift 2
	mkdir -p "$oci/blobs/sha256"
	oci_blob() { # FILE: moved into the layout; its sha256 hex in $d
		d=$(sha256sum "$1" | cut -d' ' -f1)
		mv "$1" "$oci/blobs/sha256/$d"
	}
	for layer in "$@"; do
		oci_blob "$layer"
		size=$(stat -c %s "$oci/blobs/sha256/$d")
		layers_json+="${layers_json:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$d\",\"size\":$size}"
		diff_ids+="${diff_ids:+,}\"sha256:$d\""
	done
	printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":[%s]}}' \
		"$config" "$diff_ids" >"$oci/config.json"
	oci_blob "$oci/config.json"
	cfg=$d
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
		"$cfg" "$(stat -c %s "$oci/blobs/sha256/$cfg")" "$layers_json" >"$oci/manifest.json"
	oci_blob "$oci/manifest.json"
	man=$d
	printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s}]}' \
		"$man" "$(stat -c %s "$oci/blobs/sha256/$man")" >"$oci/index.json"
	echo '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
}
