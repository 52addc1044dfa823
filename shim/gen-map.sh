#!/bin/sh
# SPDX-License-Identifier: MIT
# Writes the version script of libbelayer.so from hooks-table.h: the hooked symbols plus the
# extra exports, and nothing else. Usage: gen-map.sh hooks-table.h > libbelayer.map
set -eu
table="$1"
# The extra exports may continue over several lines (a trailing backslash).
extra=$(awk '/BELAYER_EXTRA_EXPORTS\(X\)/ { on = 1; sub(/.*BELAYER_EXTRA_EXPORTS\(X\)/, "") }
	on { print; if ($0 !~ /\\$/) on = 0 }' "$table" | sed -e 's/\\$//')
syms=$( (sed -n -e 's/^[[:space:]]*X(\([A-Za-z0-9_]*\),.*/\1/p' "$table"; echo "$extra") |
	sed -e 's/X(\([A-Za-z0-9_]*\))/\1\n/g' | sed -e 's/[[:space:]]//g' -e '/^$/d' | sort -u)
printf '/* Generated from hooks-table.h by gen-map.sh: do not edit. */\n{\n\tglobal:\n'
for s in $syms; do
	printf '\t\t%s;\n' "$s"
done
printf '\tlocal:\n\t\t*;\n};\n'
