#!/bin/sh
# SPDX-License-Identifier: MIT
# supervisor/belayer.conf.example documents every configuration key with its current default
# and meaning: it must be exactly what `belayer-supervisor --dump-config` prints, with each key
# commented out, after its header. Regenerate with: check-config-example.sh SUPERVISOR EXAMPLE --write
set -eu
supervisor=$1
example=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$supervisor" --config /dev/null --dump-config | sed 's/^\([a-z0-9_]* =\)/#\1/' >"$tmp/want"
if [ "${3:-}" = --write ]; then
	sed '/^\[/,$d' "$example" >"$tmp/header"
	cat "$tmp/header" "$tmp/want" >"$example"
	exit 0
fi
sed -n '/^\[/,$p' "$example" >"$tmp/have"
diff -u "$tmp/want" "$tmp/have"
