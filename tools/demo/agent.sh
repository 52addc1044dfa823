#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tools/demo/agent.sh: the agentic RL rollout demo (run it as `tools/dev demo agent`).
#
# A supervisor in the foreground with an [engine.agent] section (the engine stand-in as a TP=2
# primary under libbelayer.so on the emulated GPU, its parked shadow group, the gateway) and
# [policy] mode = adaptive; a busybox image; then examples/agent_rollout.py: N trajectories of
# a tool-using agent, generating through the gateway, in environments from the image, once
# failure-free and once with a rollout worker killed, an environment killed and a command
# crashed; it ends with a table per trajectory and exits non-zero unless every trajectory
# equals its failure-free run. Everything it starts goes on exit, ^C included.
#
#   tools/demo/agent.sh -B BUILD_DIR [-n N] [--turns T] [--ci]
#
# --ci: 2 trajectories of 4 turns, and the gateway must have resumed the killed stream.
set -euo pipefail

build=""
n=4
turns=6
ci=0
while (($# > 0)); do
	case $1 in
	-B)
		build=$2
		shift 2
		;;
	-n)
		n=$2
		shift 2
		;;
	--turns)
		turns=$2
		shift 2
		;;
	--ci)
		ci=1
		n=2
		turns=4
		shift
		;;
	-h | --help)
		sed -n '3,16p' "$0"
		exit 0
		;;
	*)
		echo "agent demo: unknown argument $1" >&2
		exit 2
		;;
	esac
done
[[ -n $build ]] || {
	echo "agent demo: -B BUILD_DIR is required (tools/dev demo agent passes it)" >&2
	exit 2
}
build=$(cd "$build" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
engine=$build/tests/engine/belayer-test-engine
gen=$build/tests/engine/gen-weights
sup=$build/supervisor/belayer-supervisor
shim=$build/shim/libbelayer.so
for f in "$engine" "$gen" "$sup" "$shim"; do
	[[ -e $f ]] || {
		echo "agent demo: $f is missing: build with tests enabled (tools/dev build)" >&2
		exit 2
	}
done
[[ $(id -u) == 0 ]] || {
	echo "agent demo: environments need root (namespaces, cgroups, CRIU)" >&2
	exit 2
}

say() { printf '%s\n' "$*"; }
step() { printf '==> %s\n' "$*"; }
die() {
	printf 'agent demo: %s\n' "$*" >&2
	exit 1
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/belayer-agent.XXXXXX")
cg=/sys/fs/cgroup/unified/belayer-agent-demo-$$
sup_pid=""
cleanup() {
	local rc=$? d pid cmd m
	trap - EXIT INT TERM
	# SIGTERM: the supervisor stops the engine groups it launched, then exits.
	if [[ -n $sup_pid ]] && kill "$sup_pid" 2>/dev/null; then
		for _ in $(seq 100); do kill -0 "$sup_pid" 2>/dev/null || break; sleep 0.05; done
		kill -KILL "$sup_pid" 2>/dev/null || true
		wait "$sup_pid" 2>/dev/null || true
	fi
	# Engines of ours left (their command lines name this directory), by pid.
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		[[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
		cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
		if [[ $cmd == *"$tmp/"* ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
	done
	# Environments left (^C mid-rollout): their tasks, root and disk mounts, cgroups (the v2
	# ones and their v1 mirrors), as tests/helpers/test-lib.sh's env_fixture_cleanup does.
	# (a task frozen by a checkpoint the supervisor left half-done dies only once thawed)
	find /sys/fs/cgroup -mindepth 2 -maxdepth 8 -type f -name freezer.state \
		-path "*/${cg##*/}/*" -exec sh -c 'echo THAWED >"$1"' sh {} \; 2>/dev/null || true
	for d in "$cg"/*/; do
		if [[ -d $d ]]; then echo 1 >"$d/cgroup.kill" 2>/dev/null || true; fi
	done
	for m in "$tmp"/state/envs/*/root "$tmp"/state/envs/*/disk; do
		if mountpoint -q "$m" 2>/dev/null; then umount -l "$m" 2>/dev/null || true; fi
	done
	for _ in $(seq 100); do
		for m in "$cg" $(find /sys/fs/cgroup -mindepth 2 -maxdepth 8 -type d -name "${cg##*/}" 2>/dev/null); do
			[[ -d $m ]] || continue
			find "$m" -mindepth 1 -maxdepth 1 -type d -exec rmdir {} + 2>/dev/null || true
			rmdir "$m" 2>/dev/null || true
		done
		[[ -e $cg || -n $(find /sys/fs/cgroup -mindepth 2 -maxdepth 8 -type d -name "${cg##*/}" 2>/dev/null) ]] || break
		sleep 0.1
	done
	if ((rc != 0 && rc != 130 && rc != 143)) && [[ -f $tmp/supervisor.log ]]; then
		say "agent demo: the supervisor's log (last 30 lines):" >&2
		tail -n 30 "$tmp/supervisor.log" >&2
	fi
	rm -rf --one-file-system "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# wait_for SECONDS CMD...: until CMD succeeds (polled every 50 ms).
wait_for() {
	local end=$((SECONDS + $1))
	shift
	until "$@"; do
		((SECONDS < end)) || return 1
		kill -0 "$sup_pid" 2>/dev/null || die "the supervisor exited"
		sleep 0.05
	done
}

# --- the image: a busybox root as an OCI layout --------------------------------------------

step "image: a busybox-static root with its applets and an empty /work"
root=$tmp/rootfs
mkdir -p "$root/bin" "$root/work" "$root/tmp" "$root/etc"
cp /bin/busybox "$root/bin/busybox" 2>/dev/null || die "no /bin/busybox (Debian's busybox-static)"
for a in $("$root/bin/busybox" --list); do
	[[ $a == busybox ]] || ln -sf busybox "$root/bin/$a"
done
tar -C "$root" -cf "$tmp/rootfs.tar" .
if command -v podman >/dev/null && podman import "$tmp/rootfs.tar" "belayer-agent-demo:$$" >/dev/null 2>&1; then
	# podman's own image, saved as an OCI layout (what `podman save` gives any image)
	podman save --format oci-dir -o "$tmp/oci" "belayer-agent-demo:$$" >/dev/null 2>&1 ||
		die "podman save failed"
	podman rmi "belayer-agent-demo:$$" >/dev/null 2>&1 || true
	say "    imported with podman, saved as an OCI layout ($tmp/oci)"
else
	# No podman: the same layer written as an OCI layout directly.
	python3 - "$tmp/rootfs.tar" "$tmp/oci" <<'EOF'
import hashlib, json, os, sys
tar, out = sys.argv[1], sys.argv[2]
os.makedirs(f"{out}/blobs/sha256")
def blob(data):
    d = hashlib.sha256(data).hexdigest()
    open(f"{out}/blobs/sha256/{d}", "wb").write(data)
    return {"digest": f"sha256:{d}", "size": len(data)}
layer = open(tar, "rb").read()
l = blob(layer)
cfg = blob(json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                       "rootfs": {"type": "layers", "diff_ids": [l["digest"]]}}).encode())
man = blob(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **l}]}).encode())
json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
    **man, "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}, open(f"{out}/index.json", "w"))
json.dump({"imageLayoutVersion": "1.0.0"}, open(f"{out}/oci-layout", "w"))
EOF
	say "    no podman: written directly as an OCI layout ($tmp/oci)"
fi

# --- the supervisor, the engine and its shadow, the gateway --------------------------------

step "weights: 64 MiB (seed 1); supervisor with [engine.agent] (TP=2 + shadow), gateway, [policy] adaptive"
"$gen" --out "$tmp/w1.safetensors" --size 64M --seed 1 --hidden 128 --heads 4 \
	--ffn 512 --layers 4 --vocab 4096 --max-pos 1024 >/dev/null
port=$(free_port)
shadow_port=$(free_port)
gw_port=$(free_port)
mkdir -p "$tmp/emu"
cat >"$tmp/belayer.conf" <<EOF
[supervisor]
socket = $tmp/sup.sock
state_dir = $tmp/state
[journal]
enabled = no
[health]
interval = 0
[env]
cgroup = $cg
trace = no
[policy]
# checkpoints inside the inference bubbles; at most 2 unprotected turns
mode = adaptive
max_turns = 2
[engine.agent]
primary = $engine --model $tmp/w1.safetensors --port {port} --tp 2 --kv-cache-bytes 128M
shadow = $engine --model $tmp/w1.safetensors --port {port} --tp 2 --kv-cache-bytes 128M --load-format dummy --seed 1
env = LD_PRELOAD=$shim
tp = 2
port = $port
shadow_port = $shadow_port
verify = sampled
probe_interval = 50ms
checksum_settle = 100ms
gateway_listen = 127.0.0.1:$gw_port
EOF
export LD_LIBRARY_PATH=$build/tests/emu
export BELAYER_EMU_KERNELS=$build/tests/engine/libengine-kernels-host.so
export BELAYER_EMU_DIR=$tmp/emu BELAYER_EMU_DEVICES=2 BELAYER_EMU_MEM=8G
export BELAYER_EMU_CTL=$build/tests/emu/emu-ctl
"$sup" -c "$tmp/belayer.conf" >"$tmp/supervisor.log" 2>&1 &
sup_pid=$!
wait_for 20 test -S "$tmp/sup.sock" || die "the supervisor did not listen"

# Serving and protected: both primary ranks ready, both shadow ranks parked.
ready() {
	/usr/bin/python3 - "$tmp/sup.sock" "$src/python" "$port" 2>/dev/null <<'EOF'
import sys, urllib.request
sys.path.insert(0, sys.argv[2])
import belayer
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[3]}/health", timeout=5)
w = [x for x in belayer.Client(sys.argv[1], timeout=5).workers()
     if x.engine == "agent" and x.state == "alive"]
ok = sum(x.role == "primary" for x in w) == 2 and \
     sum(x.role == "shadow" and x.parked for x in w) == 2
sys.exit(0 if ok else 1)
EOF
}
wait_for 180 ready || die "the engine group and its parked shadow did not come up"
say "    primary TP=2 on :$port, shadow parked on :$shadow_port, gateway on :$gw_port"

# --- the rollout -------------------------------------------------------------------------------

step "rollout: $n trajectories x $turns turns, failure-free, then with a worker, an environment and a command killed"
rc=0
/usr/bin/python3 -u "$src/examples/agent_rollout.py" --socket "$tmp/sup.sock" --image "oci:$tmp/oci" \
	--gateway "127.0.0.1:$gw_port" --engine agent -n "$n" --turns "$turns" 2>&1 |
	sed 's/^/    /' || rc=$?
resumed=$(grep -c "resuming after the engine's recovery" "$tmp/supervisor.log" || true)
say "    the gateway resumed $resumed in-flight request(s) on the promoted group"
((rc == 0)) || die "the rollout failed (exit $rc): a trajectory differs from its failure-free run, or a fault was not survived"
if ((ci)); then
	((resumed > 0)) || die "the killed worker's stream was not resumed by the gateway"
fi
step "done; cleaning up"
