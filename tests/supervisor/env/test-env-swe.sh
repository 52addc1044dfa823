#!/bin/bash
# SPDX-License-Identifier: MIT
# A SWE-style agent trajectory through `belayerctl env exec` and `env write` only (issue 20
# item 7): each turn is a tool call an agent makes (git edits and commits, a build with make,
# a background server, a 2,000-file dependency install, pytest) and is followed by a
# checkpoint, with what the agent could observe recorded: git's HEAD and status, a hash of the
# build tree, the server's answer, the process list. At a random turn the environment is
# killed mid-turn (half a turn done, then cgroup.kill) and restored: every observation equals
# the last checkpoint's, and the trajectory goes on to the end from there.
# KIND: base (the default: a base directory, the host's /usr and /etc bound in) or image (an
# OCI image of the closure of the host's tools the trajectory uses, written by
# make-swe-image.sh without a registry: env create --image, the image's PATH, its files its
# user namespace's root's).
# Usage: test-env-swe.sh SUPERVISOR BELAYERCTL [SEED] [KIND]
set -euo pipefail

supervisor=$1
ctl_bin=$2
seed=${3:-$RANDOM}
kind=${4:-base}
[[ $kind == base || $kind == image ]] || { echo "KIND is base or image, not $kind" >&2; exit 2; }
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2
for t in git make gcc tar python3; do command -v $t >/dev/null || fail "$t is needed"; done
/usr/bin/python3 -c 'import pytest' 2>/dev/null || fail "Debian's python3-pytest is needed (tools/dev setup)"

env_fixture envswe swe
on_fail() { tail -n 30 "$dir/sv.log"; }
env_conf
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }
# x CMD...: an agent's tool call, a shell command in the environment (stdout back; it must
# succeed).
x() { ctl env exec swe --cwd /work --timeout 120 -- /bin/sh -c "$*"; }

# What the agent can observe, as one text: git's HEAD and status, the build tree, the
# server's answer (its state is in memory), the processes (pid, parent, command; the probe
# itself left out).
observe() {
	x 'cd /work/proj 2>/dev/null && { git rev-parse HEAD 2>/dev/null; git status --porcelain; \
		find build -type f 2>/dev/null | sort | xargs -r md5sum; \
		ls /work/site 2>/dev/null | wc -l; } ; \
		[ -e /work/port ] && python3 /work/ask.py get; \
		python3 -c "
import os
me = os.getpid()
for p in sorted(int(d) for d in os.listdir(\"/proc\") if d.isdigit()):
    if p == me or p == os.getppid():
        continue
    try:
        st = open(\"/proc/%d/stat\" % p).read()
    except OSError:
        continue
    comm = st[st.index(\"(\") + 1:st.rindex(\")\")]
    ppid = st[st.rindex(\")\") + 2:].split()[1]
    print(p, ppid, comm)
"'
}

t0=$(date +%s%N)
if [[ $kind == image ]]; then
	"$(dirname "${BASH_SOURCE[0]}")/make-swe-image.sh" "$dir/oci" "$dir/image-work" ||
		fail "writing the image failed"
	rm -rf "$dir/image-work"
fi
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
if [[ $kind == image ]]; then
	t=$(date +%s%N)
	ctl env create swe --image "oci:$dir/oci" >/dev/null || fail "env create --image failed"
	echo "environment of the image (import and start) in $((($(date +%s%N) - t) / 1000000)) ms"
	# the image's own files, not the host's (whose /etc has a debian_version)
	# shellcheck disable=SC2016 # the environment's shell expands it
	x 'test ! -e /etc/debian_version && test "$PATH" = /usr/local/bin:/usr/bin:/bin' ||
		fail "not the image's root or config"
else
	ctl env create swe --root "$dir/base" >/dev/null
fi

# Files the agent writes through env write: the server, its client, a 2,000-file dependency.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ctl env write swe work/port <<<"$port"
ctl env write swe work/server.py <<'PY'
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(open("/work/port").read()))); s.listen(16)
notes, n = [], 0
while True:
    c, _ = s.accept(); req = c.recv(256).decode().strip(); n += 1
    if req.startswith("note "):
        notes.append(req[5:])
    c.sendall(("%d %s\n" % (n, ",".join(notes))).encode()); c.close()
PY
ctl env write swe work/ask.py <<'PY'
import socket, sys
c = socket.create_connection(("127.0.0.1", int(open("/work/port").read())), timeout=5)
c.sendall(" ".join(sys.argv[1:]).encode()); print(c.recv(4096).decode().strip())
PY
mkdir -p "$dir/dep/site"
python3 - "$dir/dep/site" <<'PY'
import os, sys
for i in range(2000):
    d = os.path.join(sys.argv[1], "pkg%02d" % (i % 40))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "mod%04d.py" % i), "w") as f:
        f.write("VALUE = %d\n" % i)
PY
tar -C "$dir/dep" -cf "$dir/dep.tar" site
ctl env write swe work/dep.tar <"$dir/dep.tar"

# The turns: each a tool call (or two) of a SWE agent.
turn() {
	case $1 in
	1) x 'mkdir -p /work/proj/src /work/proj/tests && cd /work/proj && git init -q -b main . && \
		git config user.email a@b && git config user.name agent && \
		printf "int add(int a, int b) { return a - b; }\n" >src/add.c && \
		printf "int add(int, int);\nint main(void) { return add(2, 2) != 4; }\n" >src/main.c && \
		git add -A && git commit -qm init' ;;
	2) x 'cd /work/proj && printf "build/prog: src/add.c src/main.c\n\tmkdir -p build && gcc -O1 -o build/prog src/add.c src/main.c\ntest: build/prog\n\t./build/prog\n" >Makefile && \
		git add Makefile && git commit -qm make && make -s build/prog' ;;
	3) x 'cd /work && (python3 server.py >server.log 2>&1 </dev/null &) && \
		for i in $(seq 100); do python3 ask.py get >/dev/null 2>&1 && break; sleep 0.05; done && \
		python3 ask.py note started' ;;
	4) x 'mkdir -p /work/site && tar -C /work -xf /work/dep.tar && ls /work/site/*/ | grep -c mod' ;;
	5) x 'cd /work/proj && printf "import sys\nsys.path.insert(0, \"/work/site/pkg07\")\nimport mod0007\ndef test_dep():\n    assert mod0007.VALUE == 7\n" >tests/test_dep.py && \
		python3 -m pytest -q tests >/work/pytest.log 2>&1; echo pytest=$?; git add -A; git commit -qm tests' ;;
	6) x 'cd /work/proj && (make -s test; echo before-fix=$?) && sed -i "s/a - b/a + b/" src/add.c && \
		make -s test && git commit -qam "fix add" && python3 /work/ask.py note fixed' ;;
	7) x 'cd /work/proj && git checkout -qb feature && echo "// doc" >>src/main.c && make -s build/prog && \
		git commit -qam doc && python3 /work/ask.py note feature' ;;
	8) x 'cd /work/proj && git checkout -q main && git merge -q feature && rm -rf build && make -s test && \
		python3 /work/ask.py note merged' ;;
	esac
}
# half_turn N: what turn N does first, before the kill (state the checkpoint must not have).
half_turn() {
	x "cd /work/proj 2>/dev/null || cd /work; echo half-$1 >>half-done.txt; git add -A 2>/dev/null; \
		rm -rf build/prog; [ -e /work/port ] && python3 /work/ask.py note half-$1; true" >/dev/null
}

turns=8
kill_at=$((seed % (turns - 2) + 3)) # after turn 3 at least: the server runs
echo "seed $seed: killed during turn $kill_at"
for t in $(seq 1 $turns); do
	if ((t == kill_at)); then
		half_turn "$t"
		echo 1 >"$cg/swe/cgroup.kill"
		ctl env restore swe >/dev/null || fail "restore after the kill in turn $t failed"
		after=$(observe)
		[[ $after == "$(cat "$dir/obs-$((t - 1))")" ]] ||
			fail "after the restore the environment differs from checkpoint $((t - 1)):
$(diff <(cat "$dir/obs-$((t - 1))") <(echo "$after") || true)"
		echo "turn $t: killed half-way, restored to turn $((t - 1)): git, build tree, server and processes identical"
	fi
	out=$(turn "$t") || fail "turn $t failed: $out"
	((t != 5)) || grep -q "pytest=0" <<<"$out" || fail "pytest failed: $(x 'cat /work/pytest.log')"
	ctl env checkpoint swe --turn "$t" >/dev/null || fail "checkpoint after turn $t failed"
	observe >"$dir/obs-$t"
done
# The trajectory ended where a failure-free one would: fixed, merged, tested, served.
x 'cd /work/proj && make -s test && git log --oneline | wc -l' | grep -qx 5 || fail "the history is not the trajectory's"
x 'python3 /work/ask.py get' | grep -q "started,fixed,feature,merged$" || fail "the server's notes: $(x 'python3 /work/ask.py get')"
x 'ls /work/site/*/ | grep -c mod' | grep -qx 2000 || fail "the dependency"
echo "$kind environment: image (if any), environment and trajectory in $((($(date +%s%N) - t0) / 1000000)) ms"
echo PASS
