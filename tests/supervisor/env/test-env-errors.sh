#!/bin/bash
# SPDX-License-Identifier: MIT
# A failed checkpoint says why (issue 16 items 5 and 6): CRIU's own error line reaches the
# belayerctl reply, the event stream and the supervisor's log, never just "Invalid exchange";
# a deleted-but-open file over [env] ghost_limit names the limit. One under it checkpoints.
# Usage: test-env-errors.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2

env_fixture enverr big small
env_conf
echo "ghost_limit = 1M" >>"$dir/conf.ini"
# A limit CRIU cannot take (its option is 32-bit) stops the start, naming the key.
if "$supervisor" -c "$dir/conf.ini" -o env.ghost_limit=4G --dump-config >"$dir/bad.txt" 2>&1; then
	fail "ghost_limit = 4G accepted"
fi
grep -q ghost_limit "$dir/bad.txt" || fail "the refusal does not name the key: $(cat "$dir/bad.txt")"

supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }

# pytest's output capture: a file deleted while open. 2 MiB is over the 1 MiB limit, 512 KiB is not.
ghost() {
	echo "exec 3<>/tmp/capture; head -c $1 /dev/urandom >&3; rm /tmp/capture; touch /work/ready
		exec sleep infinity"
}
ctl env create big --root "$dir/base" --cmd "$(ghost 2097152)" >/dev/null
ctl env create small --root "$dir/base" --cmd "$(ghost 524288)" >/dev/null
for e in big small; do
	for _ in $(seq 200); do
		[[ -e $dir/state/envs/$e/root/work/ready ]] && break
		sleep 0.05
	done
done

if ctl env checkpoint big --turn 1 >"$dir/big.txt" 2>&1; then
	fail "a 2 MiB ghost file over a 1 MiB limit was dumped: $(ls -l "$dir/state/envs/big/root/work"; cat "$dir/sv.log")"
fi
want="Can't dump ghost file /tmp/capture of 2097152 size, increase limit"
grep -qF "$want" "$dir/big.txt" || fail "the reply lacks CRIU's line: $(cat "$dir/big.txt")"
grep -qF "ghost_limit is 1048576 bytes" "$dir/big.txt" || fail "the reply does not name the limit: $(cat "$dir/big.txt")"
grep -qF "$want" "$dir/state/envs/big/dump-failed.log" || fail "CRIU's log says otherwise"
grep -qF "$want" "$dir/sv.log" || fail "the supervisor's log lacks CRIU's line: $(cat "$dir/sv.log")"
ctl events --replay 16 --no-follow >"$dir/events.txt"
grep -F "$want" "$dir/events.txt" | grep -q env || fail "no env event with CRIU's line: $(cat "$dir/events.txt")"
[[ ! -e $dir/state/envs/big/head ]] || fail "a failed checkpoint moved the head"

ctl env checkpoint small --turn 1 >"$dir/small.txt" 2>&1 || fail "under the limit: $(cat "$dir/small.txt")"
ctl env restore small >"$dir/small-rs.txt" 2>&1 || fail "restore: $(cat "$dir/small-rs.txt")"
echo "ok: $(head -n 1 "$dir/big.txt")"
