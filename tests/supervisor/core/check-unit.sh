#!/bin/sh
# SPDX-License-Identifier: MIT
# systemd-analyze verify accepts belayer-supervisor.service. verify also checks that ExecStart
# exists, so the unit is checked with ExecStart pointing at the binary just built.
# Usage: check-unit.sh UNIT SUPERVISOR
set -eu
unit=$1
supervisor=$2
if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "systemd-analyze not installed (package systemd)"
	exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|^ExecStart=.*|ExecStart=$supervisor|" "$unit" >"$tmp/belayer-supervisor.service"
grep -q '^Type=notify$' "$tmp/belayer-supervisor.service"
grep -q '^WatchdogSec=' "$tmp/belayer-supervisor.service"
out=$(systemd-analyze verify "$tmp/belayer-supervisor.service" 2>&1) || {
	echo "$out"
	exit 1
}
# verify exits 0 on some warnings; any line about our unit is a finding.
if echo "$out" | grep -q 'belayer-supervisor.service'; then
	echo "$out"
	exit 1
fi
