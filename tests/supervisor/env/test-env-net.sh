#!/bin/bash
# SPDX-License-Identifier: MIT
# Per-environment networks (issue 19): none (loopback only), slirp (egress through a real
# slirp4netns, the host's loopback services out of reach) and host (only where
# [env] allow_host_net says so). Probes run inside each environment as its own command (host
# python3: /usr is the host's) against two host listeners: one on the host's non-loopback
# IPv4 address, one on 127.0.0.1. The same holds after a checkpoint and a restore (a fresh
# network namespace, a new slirp4netns) and after a supervisor restart (env_reopen starts
# another slirp4netns); two environments listen on the same port; a connection open across a
# checkpoint fails it with a clear error; slirp4netns killed is reaped and logged, and a
# restore brings the egress back.
# Usage: test-env-net.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2
command -v python3 >/dev/null || fail "python3 is needed for the probes"
command -v slirp4netns >/dev/null || fail "slirp4netns is needed (tools/dev setup)"

env_fixture envnet nnone nslirp nhost nrefused
host_pids=()
cleanup_all() {
	for p in "${host_pids[@]}"; do kill "$p" 2>/dev/null || true; done
	env_fixture_cleanup
}
trap cleanup_all EXIT
on_fail() { tail -n 30 "$dir/sv.log"; }

# The host's non-loopback IPv4 address (the internet is not needed: only the route's source).
host_ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
[[ -n $host_ip ]] || host_ip=$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -n1)
[[ -n $host_ip ]] || fail "no global IPv4 address on this host"

# Host services: "public" on host_ip, "loopback" on 127.0.0.1 (what the engines, the gateway and
# the metrics are). Each answers its name and keeps the connection until the peer closes it.
python3 - "$host_ip" "$dir/host-ports" <<'PY' &
import socket, sys, threading, os
def serve(s, word):
    while True:
        c, _ = s.accept()
        def one(c=c):
            c.sendall(word + b"\n")
            while c.recv(64):
                pass
            c.close()
        threading.Thread(target=one, daemon=True).start()
ports = []
for addr, word in ((sys.argv[1], b"public"), ("127.0.0.1", b"loopback")):
    s = socket.socket(); s.bind((addr, 0)); s.listen(16)
    ports.append(s.getsockname()[1])
    threading.Thread(target=serve, args=(s, word), daemon=True).start()
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d %d\n" % tuple(ports))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
threading.Event().wait()
PY
host_pids+=($!)
for _ in $(seq 100); do [[ -s $dir/host-ports ]] && break; sleep 0.05; done
read -r pub_port lo_port <"$dir/host-ports" || fail "no host services"
# A port the environments listen on, each in its own namespace.
same_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# The environment's side: probe.py connects and prints one line per target ("NAME ok WORD" or
# "NAME fail ERROR"); hold connects to the public service and keeps the connection open until
# /work/release appears.
cat >"$dir/base/work/probe.py" <<'PY'
import os, socket, sys, time
host, pub, lo, same = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def probe(name, addr, port):
    try:
        s = socket.create_connection((addr, port), timeout=5)
        word = s.recv(64).decode().strip()
        s.close()
        print(name, "ok", word)
    except OSError as e:
        print(name, "fail", type(e).__name__)
if len(sys.argv) > 5 and sys.argv[5] == "hold":
    s = socket.create_connection((host, pub), timeout=5)
    s.recv(64)
    open("/work/held", "w").close()
    while not os.path.exists("/work/release"):
        time.sleep(0.05)
    s.close()
    os.unlink("/work/held")
    sys.exit(0)
probe("public", host, pub)
probe("loopback", "127.0.0.1", lo)
probe("gateway", "10.0.2.2", lo)
if same:
    probe("self", "127.0.0.1", same)
PY
cat >"$dir/base/work/listen.py" <<'PY'
import socket, sys
s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"self\n"); c.close()
PY
# run SAME: a listener on SAME (0: none), probes at start and each time /work/go appears, a
# held connection each time /work/hold appears (the same shell, restored by CRIU, runs them).
cat >"$dir/base/work/run" <<SH
#!/bin/sh
cd /work
same=\$1
if [ "\$same" != 0 ]; then python3 listen.py \$same >listen.txt 2>&1 & fi
while [ "\$same" != 0 ] && ! grep -q listening listen.txt 2>/dev/null; do sleep 0.05; done
python3 probe.py $host_ip $pub_port $lo_port \$same >net-1.txt 2>&1; touch net-1.done
n=2
while :; do
	if [ -e go ]; then
		rm go; python3 probe.py $host_ip $pub_port $lo_port \$same >net-\$n.txt 2>&1
		touch net-\$n.done; n=\$((n + 1))
	fi
	if [ -e hold ]; then rm hold; python3 probe.py $host_ip $pub_port $lo_port 0 hold; fi
	sleep 0.05
done
SH
chmod +x "$dir/base/work/run"

write_conf() {
	env_conf
	printf 'allow_host_net = %s\nslirp4netns = %s\n' "$1" "${2:-slirp4netns}" >>"$dir/conf.ini"
}
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }

# probes ENV ROUND WHEN EXPECT...: the environment's probe lines of round ROUND, each EXPECT
# ("public ok public", "gateway fail", ...) a prefix of one of them.
probes() {
	local env=$1 round=$2 when=$3 out
	shift 3
	out=$dir/state/envs/$env/root/work/net-$round.txt
	for _ in $(seq 600); do [[ -e ${out%.txt}.done ]] && break; sleep 0.05; done
	[[ -e ${out%.txt}.done ]] || fail "$env's probes did not finish ($when): $(cat "$out" 2>&1)"
	echo "--- $env $when:"
	cat "$out"
	for want in "$@"; do
		grep -q "^$want" "$out" || fail "$env ($when): no \"$want\" in: $(tr '\n' ';' <"$out")"
	done
}
go() { touch "$dir/state/envs/$1/root/work/go"; }
netns_of() { readlink "/proc/$1/ns/net"; }
pid_of() { ctl --json env list | sed -n "/\"env\":\"$1\"/s/.*\"pid\":\([0-9]*\).*/\1/p"; }

write_conf no
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"

# The host's network is refused unless the operator allows it.
if ctl env create nrefused --root "$dir/base" --net host 2>"$dir/refused.err"; then
	fail "--net host accepted with allow_host_net = no"
fi
grep -q "allow_host_net" "$dir/refused.err" || fail "the refusal does not say why: $(cat "$dir/refused.err")"

ctl env create nnone --root "$dir/base" --cmd "exec /work/run $same_port" >/dev/null
ctl env create nslirp --root "$dir/base" --net slirp --cmd "exec /work/run $same_port" >/dev/null
ctl env list >"$dir/list.txt"
grep -q '^nslirp .* net slirp ' "$dir/list.txt" || fail "env list does not show slirp: $(cat "$dir/list.txt")"
grep -q '^nnone .* net none ' "$dir/list.txt" || fail "env list does not show none: $(cat "$dir/list.txt")"

# none: nothing outside its loopback; slirp: the host's public address, never its loopback.
# Both listen on the same port, each in its own namespace.
none_fail=("public fail" "loopback fail" "gateway fail" "self ok self")
slirp_ok=("public ok public" "loopback fail" "gateway fail" "self ok self")
probes nnone 1 "at creation" "${none_fail[@]}"
probes nslirp 1 "at creation" "${slirp_ok[@]}"
# slirp4netns: the supervisor's child, in the host's namespace, outside the environments' cgroups.
slirp_pid=$(pgrep -P "$sv_pid" -x slirp4netns || true)
[[ -n $slirp_pid && $slirp_pid != *$'\n'* ]] || fail "not one slirp4netns child: $slirp_pid"
[[ $(netns_of "$slirp_pid") == "$(netns_of $$)" ]] || fail "slirp4netns is not in the host's namespace"
grep -q "$cg" /proc/"$slirp_pid"/cgroup && fail "slirp4netns is in an environment's cgroup"
# ... and confined: a mount namespace of its own (--enable-sandbox), a seccomp filter.
[[ $(readlink /proc/"$slirp_pid"/ns/mnt) != "$(readlink /proc/$$/ns/mnt)" ]] ||
	fail "slirp4netns runs without its sandbox"
grep -q '^Seccomp:[[:space:]]*2' /proc/"$slirp_pid"/status || fail "slirp4netns has no seccomp filter"

# A connection open across a checkpoint fails it, and says so.
touch "$dir/state/envs/nslirp/root/work/hold"
for _ in $(seq 200); do [[ -e $dir/state/envs/nslirp/root/work/held ]] && break; sleep 0.05; done
[[ -e $dir/state/envs/nslirp/root/work/held ]] || fail "the held connection did not open"
if ctl env checkpoint nslirp --turn 1 2>"$dir/held.err" >/dev/null; then
	fail "a checkpoint with an established connection succeeded"
fi
cat "$dir/held.err"
grep -q "established TCP connection" "$dir/held.err" ||
	fail "the failed checkpoint does not say why: $(cat "$dir/held.err")"
touch "$dir/state/envs/nslirp/root/work/release"
for _ in $(seq 200); do [[ -e $dir/state/envs/nslirp/root/work/held ]] || break; sleep 0.05; done
[[ -e $dir/state/envs/nslirp/root/work/held ]] && fail "the held connection did not close"

# Checkpoint and restore keep the network: a fresh namespace, a new slirp4netns for slirp.
for e in nnone nslirp; do
	ctl env checkpoint $e --turn 1 >/dev/null
	ctl env restore $e >/dev/null
	go $e
done
probes nnone 2 "after a restore" "${none_fail[@]}"
probes nslirp 2 "after a restore" "${slirp_ok[@]}"
new_slirp=$(pgrep -P "$sv_pid" -x slirp4netns || true)
[[ -n $new_slirp && $new_slirp != *$'\n'* && $new_slirp != "$slirp_pid" ]] ||
	fail "not one new slirp4netns after the restore: $new_slirp"
kill -0 "$slirp_pid" 2>/dev/null && fail "the old slirp4netns still runs"

# A supervisor restart (allowing the host's network now): slirp4netns exits with the old one and
# the new one starts another for the running environment.
supervisor_stop "$sv_pid" || fail "the supervisor did not stop when told"
for _ in $(seq 100); do kill -0 "$new_slirp" 2>/dev/null || break; sleep 0.05; done
kill -0 "$new_slirp" 2>/dev/null && fail "slirp4netns outlived the supervisor"
write_conf yes
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv2.log"
go nslirp
probes nslirp 3 "after a supervisor restart" "${slirp_ok[@]}"

# slirp4netns dying is reaped and logged once; the supervisor runs on, and a restore brings the
# egress back.
slirp_pid=$(pgrep -P "$sv_pid" -x slirp4netns || true)
[[ -n $slirp_pid ]] || fail "no slirp4netns after the restart"
kill -9 "$slirp_pid"
for _ in $(seq 200); do grep -q "slirp4netns (pid $slirp_pid) of environment nslirp" "$dir/sv2.log" && break; sleep 0.05; done
grep -q "slirp4netns (pid $slirp_pid) of environment nslirp was killed by signal 9" "$dir/sv2.log" ||
	fail "the helper's death was not logged"
[[ $(grep -c "slirp4netns (pid $slirp_pid)" "$dir/sv2.log") == 1 ]] || fail "logged more than once"
[[ $(ps -o stat= -p "$slirp_pid" 2>/dev/null) != Z* ]] || fail "the dead helper was not reaped"
go nslirp
probes nslirp 4 "without its slirp4netns" "public fail" "self ok self"
ctl env checkpoint nslirp --turn 2 >/dev/null
ctl env restore nslirp >/dev/null
go nslirp
probes nslirp 5 "restored after its slirp4netns died" "${slirp_ok[@]}"

# host, allowed: the host's namespace, its loopback services in reach; across a restore too.
ctl env create nhost --root "$dir/base" --net host --cmd "exec /work/run 0" >/dev/null
probes nhost 1 "at creation" "public ok public" "loopback ok loopback"
[[ $(netns_of "$(pid_of nhost)") == "$(netns_of $$)" ]] || fail "nhost is not in the host's namespace"
[[ $(netns_of "$(pid_of nnone)") != "$(netns_of $$)" ]] || fail "nnone is in the host's namespace"
ctl env checkpoint nhost --turn 1 >/dev/null
ctl env restore nhost >/dev/null
go nhost
probes nhost 2 "after a restore" "public ok public" "loopback ok loopback"
[[ $(netns_of "$(pid_of nhost)") == "$(netns_of $$)" ]] || fail "restored nhost left the host's namespace"

slirp_pid=$(pgrep -P "$sv_pid" -x slirp4netns || true)
[[ -n $slirp_pid ]] || fail "no slirp4netns before the destroy"
ctl env destroy nslirp >/dev/null
kill -0 "$slirp_pid" 2>/dev/null && fail "slirp4netns outlived its environment"

# No slirp4netns: a create asking for it is refused at once, and says why.
supervisor_stop "$sv_pid" || fail "the supervisor did not stop when told"
write_conf no /nonexistent/slirp4netns
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv3.log"
if ctl env create nrefused --root "$dir/base" --net slirp 2>"$dir/noslirp.err"; then
	fail "--net slirp accepted without a slirp4netns"
fi
grep -q "no slirp4netns" "$dir/noslirp.err" || fail "the refusal does not say why: $(cat "$dir/noslirp.err")"
echo "envnet: none, slirp and host hold at creation, after a restore and a restart"
