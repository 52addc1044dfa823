#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every C file in the tree (the tracked ones, in a git checkout) must match .clang-format. Prints the files that do not, and the command
# that fixes them. Usage: format-check.sh [SOURCE_ROOT]
set -euo pipefail

cd "${1:-$(dirname "$0")/..}"
clang_format=${CLANG_FORMAT:-clang-format}

command -v "$clang_format" >/dev/null || {
	echo "format-check: $clang_format not found (tools/dev setup installs clang-format)" >&2
	exit 1
}

# The tracked files; outside a git checkout (a release tarball), every C file but the build
# directories. Generated files never enter the tree; the exclusions guard against one being
# committed.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	mapfile -t files < <(git ls-files -z -- '*.c' '*.h' ':!:*.skel.h' ':!:*vmlinux.h' |
		tr '\0' '\n')
else
	mapfile -t files < <(find . -mindepth 1 \( -name 'build*' -o -name '.*' \) -prune -o -type f \
		\( -name '*.c' -o -name '*.h' \) ! -name '*.skel.h' ! -name 'vmlinux.h' -print |
		sed 's|^\./||' | sort)
fi
present=()
for f in "${files[@]}"; do
	[[ -f $f ]] && present+=("$f") # else deleted in the working tree, not yet committed
done
# One clang-format per 50 files, as many at once as there are CPUs (one process per file took
# 28 s of a 30 s limit on a busy 2-core machine). Each unformatted place is one diagnostic
# "FILE:LINE:COL: error: code should be clang-formatted".
rc=0
out=$(printf '%s\0' "${present[@]}" |
	xargs -0 -n 50 -P "$(nproc)" "$clang_format" --dry-run -Werror 2>&1 >/dev/null) || rc=$?
mapfile -t bad < <(sed -n 's/^\(.*\):[0-9]*:[0-9]*: [a-z]*: code should be clang-formatted.*/\1/p' \
	<<<"$out" | sort -u)
if ((rc != 0 && ${#bad[@]} == 0)); then
	echo "format-check: $clang_format failed (status $rc): $out"
	exit 1
fi

if ((${#bad[@]} > 0)); then
	echo "format-check: ${#bad[@]} of ${#files[@]} files are not formatted per .clang-format:"
	printf '  %s\n' "${bad[@]}"
	echo "fix with: clang-format -i ${bad[*]}"
	exit 1
fi
echo "format-check: ${#files[@]} files formatted"
