#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# CI smoke test of `belayer-bench policy --quick --json`: the three policies ran side by side
# and their figures are consistent (structure and sanity, not speed): the same tokens were
# streamed under every policy (same seeded draws), never took no checkpoint and every-turn
# did, the hidden fraction is a fraction, work lost is positive and every-turn's checkpoints
# reduce it on its own timeline, every real failure came back with the state of the turn it
# reported, and the PNG plot was written.
#
# Usage: test-policy-quick.sh BELAYER-BENCH
set -euo pipefail

BENCH=$1
DIR=$(mktemp -d "${TMPDIR:-/tmp}/belayer-bench-policy-ci.XXXXXX")
trap 'rm -rf "$DIR"' EXIT

if ((EUID != 0)); then
	echo "SKIP: needs root (environments, CRIU)"
	[[ ${BELAYER_TEST_NO_SKIP:-0} == 1 ]] && exit 1
	exit 77
fi
rc=0
"$BENCH" policy --quick --json --plot "$DIR/policy.png" >"$DIR/out.json" || rc=$?
if ((rc == 77)); then
	echo "SKIP: the bench skipped (CRIU >= 4.2 missing?)"
	[[ ${BELAYER_TEST_NO_SKIP:-0} == 1 ]] && exit 1
	exit 77
fi
((rc == 0)) || {
	echo "FAIL: belayer-bench policy exited $rc"
	cat "$DIR/out.json"
	exit 1
}

python3 - "$DIR/out.json" "$DIR/policy.png" <<'EOF'
import json, math, sys

out, png = sys.argv[1], sys.argv[2]
j = json.load(open(out))
errors = []


def check(cond, what):
    if not cond:
        errors.append(what)


for key in ("trajectories", "turns", "rounds", "median_tokens", "seed", "policies", "plot"):
    check(key in j, f"top-level key {key} missing")
pols = j.get("policies", {})
check(sorted(pols) == ["adaptive", "every-turn", "never"], f"policies: {sorted(pols)}")
fields = ("wall_s", "slowdown_pct", "tokens", "checkpoints_decided", "checkpoints_done",
          "checkpoints_aborted", "checkpoint_us", "held_us", "hidden_fraction",
          "work_lost_mean_s", "work_lost_p95_s", "real_failures", "step_end_reasons")
for name, p in pols.items():
    for f in fields:
        check(f in p, f"{name}: {f} missing")
    check(p.get("wall_s", 0) > 0, f"{name}: wall_s {p.get('wall_s')}")
    check(math.isfinite(p.get("slowdown_pct", math.nan)), f"{name}: slowdown not finite")
    check(p.get("work_lost_mean_s", 0) > 0, f"{name}: work lost {p.get('work_lost_mean_s')}")
    h = p.get("hidden_fraction")
    # 1 - held/ckus: below 0 when actions waited longer than the checkpoints ran (queued).
    check(h is None or h <= 1.0, f"{name}: hidden fraction {h}")
    check(p.get("checkpoints_done", 0) + p.get("checkpoints_aborted", 0)
          <= p.get("checkpoints_decided", 0), f"{name}: more checkpoints reported than decided")
    check(sum(p.get("step_end_reasons", {}).values())
          == j["trajectories"] * (j["turns"] + 1) * j["rounds"],
          f"{name}: step-end decisions {p.get('step_end_reasons')}")
    for f in p.get("real_failures", []):
        check(f["server_state_ok"], f"{name}: {f['trajectory']}: restored state wrong: {f}")
        check(f["real_lost_s"] >= 0 and f["computed_lost_s"] >= 0, f"{name}: lost < 0: {f}")
        check(not f["rebuilt"] or f["restored_turn"] == 0,
              f"{name}: rebuilt but turn {f['restored_turn']}")
    check(len(p.get("real_failures", [])) >= 1, f"{name}: no real failure injected")

never, every = pols.get("never", {}), pols.get("every-turn", {})
tokens = {p.get("tokens") for p in pols.values()}
check(len(tokens) == 1 and tokens.pop() > 0, f"tokens differ between policies: {tokens}")
check(never.get("checkpoints_done") == 0 and never.get("hidden_fraction") is None,
      "never took checkpoints")
check(all(f["rebuilt"] for f in never.get("real_failures", [])), "never restored something")
check(every.get("checkpoints_done", 0) > 0, "every-turn took no checkpoint")
# Work lost is compared on each policy's own timeline (its draws with nothing protected), not
# across rollouts: a loaded machine stretches one rollout more than another, which says nothing
# of what a checkpoint protects.
check(never.get("work_lost_mean_s") == never.get("work_lost_unprotected_mean_s"),
      "never protected some work")
check(every.get("work_lost_mean_s", 1e9) < every.get("work_lost_unprotected_mean_s", 0),
      "every-turn's checkpoints protect no work")
check(j.get("plot") == png, f"plot path {j.get('plot')}")
try:
    with open(png, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", "plot is not a PNG")
except OSError as e:
    errors.append(f"plot: {e}")
if errors:
    print("FAIL:\n  " + "\n  ".join(errors))
    print(json.dumps(j, indent=1))
    sys.exit(1)
print("OK")
EOF
