#!/bin/bash
# SPDX-License-Identifier: MIT
# env exec, env read, env write (issue 20 items 2, 3) against a real supervisor and real
# environments: output, status, signal and timeout (the process group killed), the command in
# every namespace, the cgroup, the capabilities and the seccomp filter of the environment, its
# limits, stdin, bounded output, 16 execs at once in 4 environments while the supervisor
# answers, a background server that outlives its exec and a checkpoint + restore, and file
# reads and writes that never leave the environment's root and open nothing but regular files
# (a FIFO's waiting writer stays waiting; device nodes refused unopened).
# Usage: test-envexec.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2
command -v jq >/dev/null || fail "jq is needed"

env_fixture envexec e1 e2 e3 e4 small
cat >"$dir/conf.ini" <<CONF
[supervisor]
socket = $dir/sv.sock
socket_mode = 0666
state_dir = $dir/state
[journal]
enabled = no
[health]
interval = 0
[env]
cgroup = $cg
trace = no
workers = 2
CONF
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
on_fail() { tail -20 "$dir/sv.log"; }
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }
jexec() { ctl --json env exec "$@"; }
# jfield JSON FILTER: one value of an exec's reply.
jfield() { jq -r "$2" <<<"$1"; }

for e in e1 e2 e3 e4; do ctl env create $e --root "$dir/base" >/dev/null; done
ctl env create small --root "$dir/base" --pids 16 >/dev/null

# --- output, status, signal ------------------------------------------------------------------
out=$(ctl env exec e1 -- sh -c 'echo out; echo err >&2; exit 3' 2>"$dir/err") && rc=0 || rc=$?
[[ $out == out && $(cat "$dir/err") == err && $rc == 3 ]] ||
	fail "exec: stdout '$out' stderr '$(cat "$dir/err")' status $rc"
r=$(jexec e1 -- sh -c 'kill -TERM $$')
[[ $(jfield "$r" .signal) == 15 && $(jfield "$r" .exit_code) == -1 ]] || fail "signal: $r"
r=$(jexec e1 -- /nonexistent/cmd)
[[ $(jfield "$r" .exit_code) == 127 && $(jfield "$r" .stderr) == *"No such file"* ]] ||
	fail "missing command: $r"

# --- timeout: the whole process group, a background child included ----------------------------
r=$(jexec e1 --timeout 1 -- sh -c 'sleep 1000 & echo $! >/tmp/bg; echo started; wait')
[[ $(jfield "$r" .timed_out) == true && $(jfield "$r" .signal) == 9 &&
	$(jfield "$r" .stdout) == started ]] || fail "timeout: $r"
wall=$(jfield "$r" .wall_us)
((wall >= 1000000 && wall < 3000000)) || fail "timeout after $wall us"
bg=$(ctl env exec e1 -- cat /tmp/bg)
# Killed (a zombie of the environment's init, which never reaps) or gone.
state=$(ctl env exec e1 -- sh -c "sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' /proc/$bg/status 2>/dev/null || true")
[[ -z $state || $state == Z ]] || fail "sleep $bg survived the timeout (state $state)"

# A background process that keeps the exec's stdout holds the reply until it closes it...
r=$(jexec e1 -- sh -c 'sleep 1 & echo parent done')
[[ $(jfield "$r" .stdout) == "parent done" && $(jfield "$r" .wall_us) -ge 900000 ]] ||
	fail "the reply did not wait for the pipe's holder: $r"
# ... and at the timeout, one outside the process group (setsid) only loses the pipes.
r=$(jexec e1 --timeout 1 -- sh -c 'setsid sleep 30 & echo $! >/tmp/outside; exit 0')
[[ $(jfield "$r" .timed_out) == true && $(jfield "$r" .exit_code) == 0 &&
	$(jfield "$r" .wall_us) -lt 3000000 ]] || fail "a holder outside the group: $r"

# --- the environment's isolation --------------------------------------------------------------
r=$(ctl env exec e2 -- sh -c 'for n in mnt pid uts ipc net cgroup time user pid_for_children time_for_children; do
	[ "$(readlink /proc/self/ns/$n)" = "$(readlink /proc/1/ns/$n)" ] || echo "differs: $n"; done
	[ "$(cat /proc/self/cgroup)" = "$(cat /proc/1/cgroup)" ] || echo "differs: cgroup membership"
	for f in CapEff CapBnd CapPrm NoNewPrivs Seccomp; do
		[ "$(grep "^$f:" /proc/self/status)" = "$(grep "^$f:" /proc/1/status)" ] || echo "differs: $f"
	done
	grep -q "^Seccomp:[[:space:]]*2" /proc/self/status || echo "no seccomp filter"
	fds=$(ls /proc/self/fd | tr "\n" " "); [ "$fds" = "0 1 2 3 " ] || echo "fds: $fds"
	hostname; mount -t tmpfs x /mnt 2>/dev/null && echo "mount worked"; true')
[[ $r == e2 ]] || fail "exec isolation: $r"
# Seen from the host: in the environment's cgroup, and not the supervisor's child's namespace.
r=$(jexec e2 -- sh -c 'cat /proc/self/stat >/dev/null; sleep 0.5 & echo $$')
ns_pid=$(jfield "$r" .stdout)
[[ $(jfield "$r" .pid) == "$ns_pid" ]] || fail "reply pid $(jfield "$r" .pid), inside $ns_pid"
# The pids limit applies to an exec's processes: a fork bomb stops at 16 tasks.
r=$(jexec small --timeout 5 -- sh -c 'i=0; while [ $i -lt 40 ]; do sleep 3 & i=$((i + 1)); done 2>&1; wait')
[[ $(jfield "$r" .stdout) == *"fork"* ]] || fail "no fork failure under pids 16: $r"

# --- stdin, bounded output ---------------------------------------------------------------------
head -c 300000 /dev/urandom >"$dir/in.bin"
[[ $(ctl env exec e1 --stdin "$dir/in.bin" -- md5sum) == "$(md5sum <"$dir/in.bin" | cut -d' ' -f1)  -" ]] ||
	fail "stdin not passed"
[[ $(echo piped | ctl env exec e1 --stdin - -- cat) == piped ]] || fail "stdin from a pipe"
[[ $(ctl env exec e1 -- cat) == "" ]] || fail "no stdin must read as empty"
r=$(jexec e1 --max-output 1000 -- sh -c 'head -c 3000000 /dev/zero; echo e >&2')
[[ $(jfield "$r" .stdout_truncated) == true && $(jfield "$r" '.stdout|length') == 1000 &&
	$(jfield "$r" .stdout_bytes) == 3000000 && $(jfield "$r" .stderr_truncated) == false ]] ||
	fail "truncation: $(jq -c '.stdout=(.stdout|length)' <<<"$r")"
big=$(ctl env exec e1 -- head -c 1048576 /dev/zero | wc -c)
[[ $big == 1048576 ]] || fail "1 MiB of output came back as $big bytes"
# Streaming: the first line arrives before the command ends (it waits for /tmp/stream-go,
# made once the line is seen: no timing window).
ctl env exec e1 --stream -- sh -c 'echo first; while [ ! -e /tmp/stream-go ]; do sleep 0.05; done; echo second' >"$dir/stream" &
spid=$!
for _ in $(seq 400); do [[ -s $dir/stream ]] && break; sleep 0.05; done
[[ $(cat "$dir/stream") == first ]] || fail "streaming: '$(cat "$dir/stream")' before the end"
ctl env exec e1 -- touch /tmp/stream-go || fail "streaming: cannot release the command"
wait $spid
[[ $(cat "$dir/stream") == $'first\nsecond' ]] || fail "streaming: $(cat "$dir/stream")"
# --user, --cwd, --env.
r=$(ctl env exec e1 --user nobody --cwd /tmp --env FOO=bar -- sh -c 'echo $(id -u):$(id -g) $PWD $FOO; grep CapEff /proc/self/status')
[[ $r == "65534:65534 /tmp bar"*"0000000000000000" ]] || fail "--user/--cwd/--env: $r"
[[ $(ctl env exec e1 --user 123:45 -- sh -c 'echo $(id -u):$(id -g)') == 123:45 ]] || fail "--user 123:45"

# What one exec costs the supervisor (spawn to reply), for the record.
for _ in $(seq 11); do jexec e2 -- true | jq .wall_us; done | sort -n >"$dir/walls"
echo "exec of true: median $(sed -n 6p "$dir/walls") us, max $(tail -1 "$dir/walls") us (11 runs)"

# --- 16 execs at once in 4 environments, the supervisor still answering -------------------------
t0=$(date +%s%N)
pids=()
for i in $(seq 16); do
	e=e$(((i - 1) % 4 + 1))
	ctl env exec $e -- sh -c "sleep 2; echo $i" >"$dir/par.$i" &
	pids+=($!)
done
sleep 0.5
s0=$(date +%s%N)
ctl status >/dev/null || fail "status during the execs"
s1=$(date +%s%N)
for p in "${pids[@]}"; do wait "$p" || fail "a concurrent exec failed"; done
t1=$(date +%s%N)
for i in $(seq 16); do [[ $(cat "$dir/par.$i") == "$i" ]] || fail "exec $i: $(cat "$dir/par.$i")"; done
echo "16 concurrent execs: $(((t1 - t0) / 1000000)) ms in all; status answered in $(((s1 - s0) / 1000000)) ms"
(((t1 - t0) / 1000000 < 8000)) || fail "the execs did not run at once"
(((s1 - s0) / 1000000 < 1000)) || fail "status waited for the execs"

# --- a background server outlives its exec, a checkpoint and a restore ---------------------------
cat >"$dir/base/work/server.py" <<'PY'
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7777)); s.listen(8)
n = 0
while True:
    c, _ = s.accept(); n += 1; c.sendall(b"pong %d\n" % n); c.close()
PY
# (the first ask may come before the server listens: refused connections are retried, 10 s)
ask='import socket, time
for i in range(200):
    try:
        c = socket.create_connection(("127.0.0.1", 7777)); break
    except ConnectionRefusedError:
        time.sleep(0.05)
print(c.recv(64).decode().strip())'
ctl env exec e3 -- sh -c 'python3 /work/server.py </dev/null >/dev/null 2>&1 &'
[[ $(ctl env exec e3 -- python3 -c "$ask") == "pong 1" ]] || fail "the background server does not answer"
# A checkpoint while an exec runs is refused, and says why (the exec runs until /tmp/go,
# made after the refusal; the checkpoint is asked once it runs: no timing window).
ctl env exec e3 -- sh -c 'touch /tmp/busy; while [ ! -e /tmp/go ]; do sleep 0.05; done' &
xp=$!
for _ in $(seq 200); do ctl env exec e3 -- test -e /tmp/busy && break; sleep 0.05; done
if ctl env checkpoint e3 --turn 1 2>"$dir/ck.err"; then fail "checkpoint during an exec"; fi
grep -q "exec" "$dir/ck.err" || fail "checkpoint refusal: $(cat "$dir/ck.err")"
ctl env exec e3 -- touch /tmp/go || fail "cannot end the running exec"
wait $xp
ctl env checkpoint e3 --turn 1 >/dev/null || fail "checkpoint after the execs"
[[ $(ctl env exec e3 -- python3 -c "$ask") == "pong 2" ]] || fail "server after the checkpoint"
ctl env restore e3 >/dev/null || fail "restore"
# The restored server is the checkpointed one (its counter at 1), in a new time namespace that
# a later exec must join too.
[[ $(ctl env exec e3 -- python3 -c "$ask") == "pong 2" ]] || fail "server after the restore"
r=$(ctl env exec e3 -- sh -c '[ "$(readlink /proc/self/ns/time)" = "$(readlink /proc/1/ns/time)" ] && echo same')
[[ $r == same ]] || fail "exec after restore: not in the time namespace ($r)"
ctl env checkpoint e3 --turn 2 >/dev/null || fail "checkpoint after an exec into the restored environment"

# --- files ------------------------------------------------------------------------------------
echo hello | ctl env write e1 /tmp/f --mode 640
r=$(ctl --json env read e1 /tmp/f)
[[ $(jfield "$r" .content) == hello && $(jfield "$r" .mode) == $((8#640)) ]] || fail "read: $r"
[[ $(ctl env exec e1 -- stat -c '%a %u %s' /tmp/f) == "640 0 6" ]] || fail "written file"
echo owned | ctl env write e1 /tmp/g --user nobody
[[ $(ctl env exec e1 -- stat -c '%U %a' /tmp/g) == "nobody 644" ]] || fail "write --user"
# e1 is in a user namespace ([env] userns, the default): exec joins it (root inside, host uid
# 100000 outside) and the files written by exec and by env write are owned through its uid_map
pid1=$(ctl --json env list | grep '"env":"e1"' | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
[[ $(xargs <"/proc/$pid1/uid_map") == "0 100000 65536" ]] ||
	fail "e1 is not in its user namespace: $(xargs <"/proc/$pid1/uid_map")"
r=$(ctl env exec e1 -- sh -c 'id -u; id -g; echo x >/tmp/by-exec; grep -E "^[UG]id:" /proc/self/status | cut -f2 | xargs; cat /proc/self/uid_map | xargs')
[[ $r == $'0\n0\n0 0\n0 100000 65536' ]] || fail "exec in the user namespace: $r"
upper=$dir/state/envs/e1/upper
[[ $(stat -c %u:%g "$upper/tmp/by-exec") == 100000:100000 &&
	$(stat -c %u:%g "$upper/tmp/f") == 100000:100000 &&
	$(stat -c %u:%g "$upper/tmp/g") == 165534:165534 ]] ||
	fail "host owners of exec's, write's, write --user nobody's files: $(stat -c '%n %u:%g' "$upper"/tmp/{by-exec,f,g})"
head -c 200000 /dev/urandom >"$dir/blob"
ctl env write e1 /work/blob <"$dir/blob"
ctl env read e1 /work/blob | cmp - "$dir/blob" || fail "round trip of 200 KB"
# Hostile links: they resolve inside the environment's root, never on the host.
echo "host only" >"$dir/host-secret"
ctl env exec e1 -- sh -c "ln -s $dir/host-secret /tmp/abs; ln -s ../../../../../../../..$dir/host-secret /tmp/rel;
	ln -s ../../.. /tmp/up; ln -s $dir /tmp/dirlink; ln -s /etc/shadow /tmp/shadow"
for p in /tmp/abs /tmp/rel /tmp/up$dir/host-secret /proc/1/root$dir/host-secret; do
	if ctl env read e1 "$p" >"$dir/leak" 2>/dev/null; then fail "read $p: $(cat "$dir/leak")"; fi
done
# The environment's own copy at the host's path is what the link names.
ctl env exec e1 -- sh -c "mkdir -p $dir && echo 'env copy' >$dir/host-secret"
[[ $(ctl env read e1 /tmp/abs) == "env copy" && $(ctl env read e1 /tmp/rel) == "env copy" ]] ||
	fail "links must resolve in the environment's root"
# /etc/shadow: the environment's view (its /etc), the same bytes its own root reads; with
# [env] userns (the default) its root is an unprivileged host uid that cannot read the host's
# /etc/shadow (0640, nobody's inside), and the link reads what the path itself does.
# (The host's /etc/shadow is masked anyway: /dev/null over it, README "The host's /etc".)
# The mask is a character device: env read refuses it (not a regular file); a read that
# succeeds must give what the environment's own root reads, never the host's bytes.
ctl env exec e1 -- cat /etc/shadow >"$dir/shadow-exec" 2>/dev/null || : >"$dir/shadow-exec"
if ctl env read e1 /tmp/shadow >"$dir/shadow-link" 2>"$dir/shadow-err"; then
	cmp -s "$dir/shadow-exec" "$dir/shadow-link" ||
		fail "a link to /etc/shadow read something else than the environment's"
else
	grep -q "not a regular file" "$dir/shadow-err" || fail "env read of the link: $(cat "$dir/shadow-err")"
fi
[[ ! -s /etc/shadow ]] || ! cmp -s /etc/shadow "$dir/shadow-link" || fail "the host's /etc/shadow leaked"
# Writes through links: the link is replaced, nothing is created outside.
echo pwned | ctl env write e1 /tmp/abs
[[ $(cat "$dir/host-secret") == "host only" ]] || fail "a write followed a link to the host"
[[ $(ctl env exec e1 -- sh -c '[ -L /tmp/abs ] && echo link || cat /tmp/abs') == pwned ]] ||
	fail "the link was not replaced"
if echo x | ctl env write e1 /tmp/dirlink/evil 2>/dev/null; then
	[[ ! -e $dir/evil ]] || fail "a write through a directory link reached the host"
fi
[[ ! -e $dir/evil ]] || fail "a write through a directory link reached the host"
# Bounds and kinds.
if ctl env read e1 /work/blob --max 1000 >/dev/null 2>&1; then fail "read over --max"; fi
head -c $((17 << 20)) /dev/zero >"$dir/huge"
if ctl env write e1 /tmp/huge <"$dir/huge" 2>/dev/null; then fail "write over 16 MiB"; fi
[[ $(ctl env exec e1 -- sh -c 'ls /tmp/huge /tmp/.belayer-write.* 2>/dev/null | wc -l') == 0 ]] ||
	fail "a refused write left a file"
for p in /dev/null /tmp /proc/self/status /proc/1/environ; do
	if ctl env read e1 "$p" >/dev/null 2>&1; then fail "read of $p"; fi
done
if echo x | ctl env write e1 /usr/evil 2>/dev/null; then fail "write into the read-only /usr"; fi
[[ ! -e /usr/evil ]] || fail "/usr/evil on the host"
# Nothing but a regular file is opened. A FIFO the agent made: a writer waits in its open;
# a read is refused promptly and leaves it waiting (an open for reading would have woken it).
w=$(ctl env exec e1 -- sh -c 'mkfifo /tmp/fifo; (exec 3>/tmp/fifo; echo opened >/tmp/fifo-opened) \
	</dev/null >/dev/null 2>&1 & echo $!')
waiting() { ctl env exec e1 -- sh -c "[ \"\$(cat /proc/$w/wchan)\" = wait_for_partner ] && echo waiting"; }
for _ in $(seq 100); do [[ $(waiting) == waiting ]] && break; done
[[ $(waiting) == waiting ]] || fail "the FIFO's writer is not waiting in its open"
if err=$(timeout 20 "$ctl_bin" -s "$dir/sv.sock" env read e1 tmp/fifo 2>&1); then
	fail "read of a FIFO"
fi
[[ $err == *"not a regular file but a FIFO"* ]] || fail "read of a FIFO: $err"
[[ $(waiting) == waiting ]] || fail "a read of a FIFO opened it (its writer went on)"
[[ $(ctl env read e1 /tmp/f) == hello ]] || fail "a read after the FIFO's"
ctl env exec e1 -- sh -c "kill $w; rm /tmp/fifo"
# Device nodes (made from the host in the upper layer): refused before any open, which is
# outside the environment's device allow-list (a tty's would fail with ENXIO, or make it our
# controlling terminal).
mknod "$dir/state/envs/e1/upper/work/nul" c 1 3
mknod "$dir/state/envs/e1/upper/work/tty" c 5 0
for p in work/nul /work/tty; do
	if err=$(timeout 20 "$ctl_bin" -s "$dir/sv.sock" env read e1 $p 2>&1); then fail "read of $p"; fi
	[[ $err == *"not a regular file but a character device"* ]] || fail "read of $p: $err"
done

# Only root (or the supervisor's user) may exec, read or write.
chmod 755 "$dir"
for args in "exec e1 -- true" "read e1 /tmp/f" "write e1 /tmp/f"; do
	# shellcheck disable=SC2086 # the words of args are the arguments
	if setpriv --reuid=65534 --regid=65534 --clear-groups "$ctl_bin" -s "$dir/sv.sock" env $args \
		</dev/null 2>"$dir/user.err"; then
		fail "env $args as nobody"
	fi
	grep -q "needs root" "$dir/user.err" || fail "env $args as nobody: $(cat "$dir/user.err")"
done

# Destroy waits for nothing: no exec runs now.
ctl env destroy e4 >/dev/null || fail "destroy"
echo "PASS"
