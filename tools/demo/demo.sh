#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tools/demo/demo.sh: the shadow-worker recovery demo (run it as `tools/dev demo`).
#
# On the emulated GPU: a supervisor in the foreground with an [engine.demo] section, the
# engine stand-in as a TP=2 primary under libbelayer.so plus its parked shadow group, an RL
# weight update, a stream of requests, a SIGKILL of one rank, the recovery live, then the
# recovery's phases and a cold restart of the same engine for comparison. Everything it starts
# (processes, temporary files, emulated GPU state) goes on exit, ^C included.
#
#   tools/demo/demo.sh -B BUILD_DIR [--size 1G] [--ci] [--no-cold]
#
# --ci: small weights (64M), no live redraw, exits non-zero unless the group was promoted, the
# promoted answers equal the pre-failure ones and requests are served again.
set -euo pipefail

build=""
size=1G
ci=0
cold=1
while (($# > 0)); do
	case $1 in
	-B)
		build=$2
		shift 2
		;;
	--size)
		size=$2
		shift 2
		;;
	--ci)
		ci=1
		size=64M
		shift
		;;
	--no-cold)
		cold=0
		shift
		;;
	-h | --help)
		sed -n '3,16p' "$0"
		exit 0
		;;
	*)
		echo "demo: unknown argument $1" >&2
		exit 2
		;;
	esac
done
[[ -n $build ]] || {
	echo "demo: -B BUILD_DIR is required (tools/dev demo passes it)" >&2
	exit 2
}
build=$(cd "$build" && pwd)
engine=$build/tests/engine/belayer-test-engine
gen=$build/tests/engine/gen-weights
sup=$build/supervisor/belayer-supervisor
ctl=$build/tools/belayerctl/belayerctl
bench=$build/tools/bench/belayer-bench
shim=$build/shim/libbelayer.so
for f in "$engine" "$gen" "$sup" "$ctl" "$bench" "$shim"; do
	[[ -e $f ]] || {
		echo "demo: $f is missing: build with tests enabled (tools/dev build)" >&2
		exit 2
	}
done

tty=0
[[ -t 1 && $ci == 0 ]] && tty=1
if ((tty)); then
	B=$'\e[1m' G=$'\e[32m' R=$'\e[31m' Y=$'\e[33m' N=$'\e[0m'
else
	B="" G="" R="" Y="" N=""
fi
say() { printf '%s\n' "$*"; }
step() { printf '%s==>%s %s\n' "$B" "$N" "$*"; }
die() {
	printf '%sdemo: %s%s\n' "$R" "$*" "$N" >&2
	exit 1
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/belayer-demo.XXXXXX")
sup_pid=""
stream_pid=""
events_pid=""
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	((tty)) && printf '\e[?25h' # the cursor, hidden during the live view
	for p in "$stream_pid" "$events_pid"; do
		[[ -n $p ]] || continue
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	# SIGTERM: the supervisor stops the engine groups it launched, then exits.
	if [[ -n $sup_pid ]] && kill "$sup_pid" 2>/dev/null; then
		for _ in $(seq 100); do kill -0 "$sup_pid" 2>/dev/null || break; sleep 0.05; done
		kill -KILL "$sup_pid" 2>/dev/null || true
		wait "$sup_pid" 2>/dev/null || true
	fi
	# Anything of ours left (an engine of a group the supervisor could not stop).
	pkill_tree_of_tmp
	# A failure (not ^C or SIGTERM) shows what the supervisor and the requests saw.
	if ((rc != 0 && rc != 130 && rc != 143)) && [[ -f $tmp/supervisor.log ]]; then
		say "demo: the supervisor's log (last 30 lines):" >&2
		tail -n 30 "$tmp/supervisor.log" >&2
		if [[ -s $tmp/requests.log ]]; then
			say "demo: the last requests (ms, result, port, latency):" >&2
			tail -n 5 "$tmp/requests.log" >&2
		fi
	fi
	rm -rf "$tmp"
	exit "$rc"
}
# Kills processes whose command line names this demo's temporary directory (the engines all
# carry their weights file's path in it), by pid, one by one.
pkill_tree_of_tmp() {
	local d pid cmd
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		[[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
		cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
		if [[ $cmd == *"$tmp/"* ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
	done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- tiny HTTP client over bash's /dev/tcp (no curl needed) ---------------------------------

# http METHOD PORT PATH [BODY]: the body on stdout; status 0 for a 200.
http() {
	local method=$1 port=$2 path=$3 body=${4:-} fd resp
	# (the group's 2>/dev/null ends with it; on exec itself it would stay for the shell)
	{ exec {fd}<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || return 1
	{ printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
		"$method" "$path" "${#body}" "$body" >&"$fd"; } 2>/dev/null || {
		exec {fd}>&-
		return 1
	}
	resp=$(timeout 30 cat <&"$fd" 2>/dev/null) || true
	exec {fd}>&-
	[[ $resp == "HTTP/1.1 200"* ]] || return 1
	printf '%s' "${resp#*$'\r\n\r\n'}"
}

PROMPTS=("1,2,3,4,5" "17,300,42" "1000,7,7,7,9,2" "4000,1")
# answers PORT: the output ids of every prompt, one line each.
answers() {
	local p out
	for p in "${PROMPTS[@]}"; do
		out=$(http POST "$1" /generate "{\"input_ids\":[$p],\"sampling_params\":{\"max_new_tokens\":8,\"temperature\":0}}") || return 1
		sed -n 's/.*"output_ids":\[\([0-9,]*\)\].*/\1/p' <<<"$out"
	done
}

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

ctlj() { "$ctl" --socket "$tmp/sup.sock" --json "$@"; }

# --- the world --------------------------------------------------------------------------------

step "weights: $size (seed 1) and the RL update (seed 2), in $tmp"
for s in 1 2; do
	"$gen" --out "$tmp/w$s.safetensors" --size "$size" --seed "$s" --hidden 128 --heads 4 \
		--ffn 512 --layers 4 --vocab 4096 --max-pos 1024 >/dev/null
done

port=$(free_port)
shadow_port=$(free_port)
gw_port=$(free_port)
mkdir -p "$tmp/emu"
cat >"$tmp/belayer.conf" <<EOF
[supervisor]
socket = $tmp/sup.sock
state_dir = $tmp/state
[health]
interval = 0
[engine.demo]
primary = $engine --model $tmp/w1.safetensors --port {port} --tp 2 --kv-cache-bytes 128M
shadow = $engine --model $tmp/w1.safetensors --port {port} --tp 2 --kv-cache-bytes 128M --load-format dummy --seed 1
env = LD_PRELOAD=$shim
tp = 2
port = $port
shadow_port = $shadow_port
verify = sampled
probe_interval = 50ms
checksum_settle = 100ms
# the gateway: clients talk to it; it resumes their in-flight requests on the recovered group
gateway_listen = 127.0.0.1:$gw_port
EOF
export LD_LIBRARY_PATH=$build/tests/emu
export BELAYER_EMU_KERNELS=$build/tests/engine/libengine-kernels-host.so
export BELAYER_EMU_DIR=$tmp/emu BELAYER_EMU_DEVICES=2 BELAYER_EMU_MEM=8G
export BELAYER_EMU_CTL=$build/tests/emu/emu-ctl

step "supervisor (foreground, config $tmp/belayer.conf): primary TP=2 on :$port, shadow on :$shadow_port"
"$sup" -c "$tmp/belayer.conf" >"$tmp/supervisor.log" 2>&1 &
sup_pid=$!
wait_for 20 test -S "$tmp/sup.sock" || die "the supervisor did not listen"
wait_for 120 http GET "$port" /health >/dev/null || die "the primary did not become ready"

parked() {
	ctlj workers | python3 -c '
import json, sys
w = json.load(sys.stdin)
w = w["workers"] if isinstance(w, dict) else w
ok = lambda x: x.get("engine") == "demo" and x.get("state") == "alive"
sh = [x for x in w if ok(x) and x.get("role") == "shadow" and x.get("parked")]
pr = [x for x in w if ok(x) and x.get("role") == "primary"]
sys.exit(0 if len(sh) == 2 and len(pr) == 2 else 1)'
}
wait_for 60 parked || die "the shadow group did not park"
ctlj workers | python3 -c '
import json, sys
w = json.load(sys.stdin)
w = w["workers"] if isinstance(w, dict) else w
for x in sorted(w, key=lambda x: (x.get("role", ""), x.get("rank", 0))):
    if x.get("engine") != "demo" or x.get("state") != "alive":
        continue
    print("    %-8s rank %d  pid %-7d %8.1f MiB of GPU memory%s" % (x["role"], max(x.get("rank", 0), 0),
          x["pid"], x.get("bytes", 0) / 2**20, "  (parked)" if x.get("parked") else ""))'

step "RL weight update from the trainer's file (update_weights_from_disk)"
mapfile -t a0 < <(answers "$port")
http POST "$port" /update_weights_from_disk "{\"model_path\":\"$tmp/w2.safetensors\"}" >/dev/null ||
	die "the weight update failed"
mapfile -t a1 < <(answers "$port")
[[ "${a0[*]}" != "${a1[*]}" ]] || die "the update did not change the answers"
say "    answers before the update: ${a0[0]} ...; after: ${a1[0]} ... (weights version 1)"
rm -f "$tmp/w2.safetensors" # the latest weights now exist only in GPU memory

# --- the request stream and the event stream ------------------------------------------------

ctlj events >"$tmp/events.log" 2>/dev/null &
events_pid=$!
# One request at a time, through the supervisor's gateway: it follows the serving group (the
# ports swap at a promotion), holds requests that arrive during the recovery until the promoted
# group serves, and resumes those in flight. A parked shadow's port is never used: its weights
# are scratch.
want=$(IFS=,; echo "${a1[0]}")
stream() {
	local p t0 t1 body ids
	while :; do
		p=$gw_port
		t0=$(date +%s%3N)
		if body=$(http POST "$p" /generate '{"input_ids":[1,2,3,4,5],"sampling_params":{"max_new_tokens":8,"temperature":0}}'); then
			t1=$(date +%s%3N)
			ids=$(sed -n 's/.*"output_ids":\[\([0-9,]*\)\].*/\1/p' <<<"$body")
			# the answer of a failure-free engine at weights version 1, or "wrong"
			printf '%s %s %s %s\n' "$t1" "$([[ $ids == "$want" ]] && echo ok || echo wrong)" \
				"$p" "$((t1 - t0))"
		else
			printf '%s fail %s\n' "$(date +%s%3N)" "$p"
			sleep 0.005
		fi
	done >>"$tmp/requests.log"
}
stream &
stream_pid=$!

# --- the live view ----------------------------------------------------------------------------

# The recovery's summary event: "engine=demo seq=N outcome=... detect_us=... total_us=...".
recovery_summary() { grep '"kind":"recovery"' "$tmp/events.log" 2>/dev/null | grep -o 'engine=demo [^"]*outcome=[a-z_]*[^"]*' | tail -n 1; }
recovery_done() { recovery_summary | grep -qE 'outcome=(promoted|cold_restart|failed)'; }

# The recovery's progress: every "recovery" event so far (the steps, then the summary).
recovery_events() {
	grep '"kind":"recovery"' "$tmp/events.log" 2>/dev/null |
		sed -n 's/.*"ts_us":\([0-9]*\).*"message":"\(.*\)"}$/\1 \2/p' |
		awk -v k="${kill_us:-0}" '{ t = $1; $1 = ""; printf "  +%7.1f ms %s\n", (t - k) / 1000, $0 }' |
		sed 's/\\"/"/g; s/ engine "demo" recovery [0-9]*://' || true
}

view_lines=0
shown_events=0
view() { # the state: redrawn in place on a terminal; plain lines (what changed) otherwise
	local now ok fail last workers lines events n
	now=$(date +%s%3N)
	ok=$(awk -v t=$((now - 1000)) '$1 >= t && $2 == "ok"' "$tmp/requests.log" 2>/dev/null | wc -l)
	fail=$(awk -v t=$((now - 1000)) '$1 >= t && $2 != "ok"' "$tmp/requests.log" 2>/dev/null | wc -l)
	last=$(tail -n 1 "$tmp/requests.log" 2>/dev/null | awk '{ print $2 " on :" $3 }')
	workers=$(ctlj workers 2>/dev/null | python3 -c '
import json, sys
w = json.load(sys.stdin)
w = w["workers"] if isinstance(w, dict) else w
rank = lambda x: max(x.get("rank", 0), 0)
print("  ".join("%s/%d:%s%s" % (x["role"], rank(x), x["state"], " parked" if x.get("parked") else "")
      for x in sorted(w, key=lambda x: (x.get("role", ""), rank(x), x.get("pid", 0)))
      if x.get("engine") == "demo" and x.get("state") == "alive"))' 2>/dev/null) || workers="?"
	events=$(recovery_events)
	if ((tty)); then
		lines=$(printf '  requests/s: %s%3d ok%s %s%3d failed/wrong%s   last: %s\n  workers:    %s\n%s\n' \
			"$G" "$ok" "$N" "$R" "$fail" "$N" "${last:--}" "$workers" "$events")
		((view_lines > 0)) && printf '\e[%dA' "$view_lines"
		printf '%s\n' "$lines" | sed 's/$/\x1b[K/'
		view_lines=$(printf '%s\n' "$lines" | wc -l)
		return
	fi
	if [[ $workers != "${last_workers:-}" ]]; then
		printf '  workers:    %s\n' "$workers"
		last_workers=$workers
	fi
	n=$(printf '%s' "$events" | grep -c . || true)
	if ((n > shown_events)); then
		printf '%s\n' "$events" | tail -n $((n - shown_events))
		shown_events=$n
	fi
	if ((now - ${last_rate_ms:-0} >= 1000)); then
		printf '  %s  requests: %d ok, %d failed or wrong in the last second\n' "$(date -u +%T.%3N)" "$ok" "$fail"
		last_rate_ms=$now
	fi
}

((tty)) && printf '\e[?25l'
step "serving (a stream of requests); then SIGKILL of rank 1 of the primary"
for _ in $(seq 15); do view; sleep 0.1; done
victim=$(ctlj workers | python3 -c '
import json, sys
w = json.load(sys.stdin)
w = w["workers"] if isinstance(w, dict) else w
print([x["pid"] for x in w if x.get("engine") == "demo" and x.get("role") == "primary"
       and x.get("rank") == 1 and x.get("state") == "alive"][0])')
# Long streams in flight through the gateway when the rank dies (their failure-free output
# first, for the comparison).
LONG_BODY='{"input_ids":[1,2,3,4,5],"sampling_params":{"max_new_tokens":600,"temperature":0},"stream":true}'
stream_ids() { grep -o '"output_ids":\[[0-9,]*\]' | sed 's/.*\[//; s/\]//' | paste -sd, -; }
long_ref=$(http POST "$gw_port" /generate "$LONG_BODY" | stream_ids)
long_pids=()
for i in 1 2 3 4; do
	http POST "$gw_port" /generate "$LONG_BODY" >"$tmp/long$i.sse" &
	long_pids+=($!)
done
sleep 0.1
kill_ms=$(date +%s%3N)
kill_us=$((kill_ms * 1000))
"$ctl" --socket "$tmp/sup.sock" inject kill "$victim" >/dev/null
((tty)) || say "  $(date -u +%T.%3N): ${Y}SIGKILL rank 1 (pid $victim)${N}"
((tty)) && { printf '%s  SIGKILL rank 1 (pid %s)%s\n' "$Y" "$victim" "$N"; view_lines=0; }
end=$((SECONDS + 60))
until recovery_done; do
	((SECONDS < end)) || die "no end of the recovery in 60 s"
	view
	sleep 0.1
done
# Served again: a successful request after the kill.
until awk -v t="$kill_ms" '$1 - $4 > t && $2 == "ok" { f = 1 } END { exit !f }' "$tmp/requests.log"; do
	((SECONDS < end)) || die "no request served after the recovery"
	view
	sleep 0.05
done
for _ in $(seq 10); do view; sleep 0.1; done
((tty)) && printf '\e[?25h'
kill "$stream_pid" 2>/dev/null || true
wait "$stream_pid" 2>/dev/null || true
stream_pid=""

first_ok=$(awk -v t="$kill_ms" '$1 - $4 > t && $2 == "ok" { print $1; exit }' "$tmp/requests.log")
failed=$(awk -v t="$kill_ms" '$1 > t && $2 == "fail"' "$tmp/requests.log" | wc -l)
wrong=$(awk '$2 == "wrong"' "$tmp/requests.log" | wc -l)
summary=$(recovery_summary)
outcome=$(grep -o 'outcome=[a-z_]*' <<<"$summary" | cut -d= -f2)

# --- the results ------------------------------------------------------------------------------

step "recovery: $outcome (the supervisor's phases; belayerctl events shows them too)"
printf '    %-10s %10s\n' phase ms
for ph in detect owner health content layout remap canary ready total; do
	us=$(grep -o " ${ph}_us=[0-9]*" <<<"$summary" | cut -d= -f2)
	[[ -n $us ]] && printf '    %-10s %10.2f\n' "$ph" "$(awk -v u="$us" 'BEGIN { print u / 1000 }')"
done
say "    client view: first right answer to a request sent after the SIGKILL at +$((first_ok - kill_ms)) ms; $failed request(s) refused meanwhile, $wrong wrong answer(s) in the whole run"

long_ok=0
for i in "${!long_pids[@]}"; do
	wait "${long_pids[$i]}" 2>/dev/null || true
	f=$tmp/long$((i + 1)).sse
	if grep -q 'data: \[DONE\]' "$f" && ! grep -q '"error"' "$f" &&
		[[ $(stream_ids <"$f") == "$long_ref" ]]; then
		long_ok=$((long_ok + 1))
	fi
done
resumed=$(grep -c "resuming after the engine's recovery" "$tmp/supervisor.log" || true)
say "    in-flight streams (600 tokens each, through the gateway): $long_ok/4 complete with no error and equal to the failure-free output; $resumed request(s) resumed mid-stream on the promoted group"

serving=$shadow_port
[[ $outcome == promoted ]] || serving=$port
mapfile -t a2 < <(answers "$serving")
if [[ "${a2[*]}" == "${a1[*]}" ]]; then
	say "    ${G}answers after the recovery = pre-failure answers (weights version 1, the RL update)${N}"
	same=1
else
	say "    ${R}answers after the recovery differ from the pre-failure answers${N}"
	same=0
fi

if ((cold)); then
	step "for comparison: a cold restart of the same engine (belayer-bench recovery --paths cold)"
	"$bench" recovery --sizes "$size" --tp 2 --paths cold --build-dir "$build" \
		--plot "$tmp/cold.png" 2>/dev/null | awk '/^weights|cold restart/ { print "    " $0 }' ||
		say "    (the cold-restart measurement failed)"
	say "    (a cold restart from the file also loses the RL update: it answers as version 0)"
fi

if ((ci)); then
	[[ $outcome == promoted ]] || die "not promoted: $summary"
	((same)) || die "promoted answers differ from the pre-failure answers"
	((wrong == 0)) || die "$wrong wrong answer(s) served"
	((long_ok == 4)) || die "$((4 - long_ok)) in-flight stream(s) through the gateway did not continue exactly"
fi
step "done; cleaning up"
