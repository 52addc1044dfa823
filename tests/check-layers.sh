#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The include rule (README, Development / Layout): every `#include "..."` of a C file in a
# folder below must name a header of its own folder, or of a folder its row says it may use:
# that folder's face (its one public header), or every header of it where the use ends in
# "+" (white-box tests and benches). Core is the bottom layer: its headers are its face, and
# it uses no subsystem. Prints each violation; fails when there is one, when a header name is
# ambiguous, when a listed folder or face is missing, or when the table has a cycle.
# Usage: check-layers.sh [SOURCE_ROOT]
set -euo pipefail

cd "${1:-$(dirname "$0")/..}"

# The one statement of the allowed edges. A file belongs to the longest folder listed that
# holds it; includes that resolve to no header of a listed folder (system, common/, generated
# skeletons) are not this check's business.
# name      folder                    face (*: all)  may use (name: its face; name+: all of it)
rules='
core        supervisor/core           *              -
policy      supervisor/policy         sv-policy.h    core
image       supervisor/image          sv-image.h     -
env         supervisor/env            sv-env.h       core policy image
recovery    supervisor/recovery       sv-recovery.h  core
gateway     supervisor/gateway        sv-gateway.h   core recovery policy
main        supervisor                -              core env recovery policy gateway image
t-sv        tests/supervisor          -              core
t-core      tests/supervisor/core     -              core
t-env       tests/supervisor/env      -              core env+
t-recovery  tests/supervisor/recovery -              core recovery+ t-sv+
t-gateway   tests/supervisor/gateway  -              core gateway+ t-sv+
t-policy    tests/supervisor/policy   -              core policy+ env+ t-sv+ t-env+
t-fuzz      tests/fuzz                -              core recovery+ policy+ env+ gateway+ image+
t-image     tests/image               -              image+
bench       tools/bench               -              env+ t-env+
shim        shim                      belayer.h      -
t-shim      tests/shim                -              shim+
t-gpu       tests/gpu                 -              shim+
'

# Inside a folder whose files are layered among themselves (issue 17: the shim, the bench):
# each file, by its path without .c/.h, and the headers of its own folder it may include
# besides its own. Every file of such a folder needs a row; the rows form no cycle (tsort).
# shim: the real driver/NCCL entry points at the bottom; the session (conn) above regions,
# NCCL, IPC and the shadow; the allocator above the session; the exported wrappers on top.
# bench: main, the subcommands, the helpers they share.
# file                              may include (same folder)
file_rules='
shim/belayer                        -
shim/hooks-table                    -
shim/shim-real                      hooks-table.h
shim/shim-config                    -
shim/shim-role                      shim-config.h
shim/shim-device                    shim-real.h
shim/shim-capture                   shim-real.h
shim/shim-classify                  belayer.h shim-config.h
shim/shim-conn-queue                shim-config.h
shim/shim-regions                   shim-conn-queue.h shim-device.h shim-real.h
shim/shim-meminfo                   shim-config.h shim-conn-queue.h shim-device.h shim-regions.h shim-role.h
shim/shim-shadow-scratch            shim-config.h shim-device.h shim-real.h shim-role.h
shim/shim-shadow                    shim-config.h shim-device.h shim-real.h shim-regions.h shim-role.h shim-shadow-scratch.h
shim/shim-share                     shim-device.h shim-real.h shim-regions.h shim-shadow-scratch.h
shim/shim-ipc                       shim-capture.h shim-device.h shim-real.h shim-regions.h shim-share.h
shim/shim-nccl                      shim-capture.h shim-conn-queue.h shim-device.h shim-real.h shim-regions.h
shim/shim-conn                      shim-capture.h shim-classify.h shim-config.h shim-conn-queue.h shim-device.h shim-ipc.h shim-meminfo.h shim-nccl.h shim-real.h shim-regions.h shim-role.h shim-shadow-scratch.h shim-shadow.h
shim/shim-alloc                     shim-classify.h shim-config.h shim-conn.h shim-device.h shim-meminfo.h shim-real.h shim-regions.h shim-shadow-scratch.h
shim/hooks                          shim-real.h
shim/hooks-cuda                     hooks.h shim-alloc.h shim-conn.h shim-ipc.h shim-real.h shim-share.h
shim/hooks-nccl                     hooks.h shim-alloc.h shim-conn.h shim-nccl.h shim-real.h
shim/hooks-dl                       hooks.h shim-classify.h shim-real.h
tools/bench/bench-measure           -
tools/bench/bench-path              -
tools/bench/test-bench-path         bench-path.h
tools/bench/bench                   -
tools/bench/bench-recovery-proc     bench-recovery.h bench.h
tools/bench/bench-recovery-shadow   bench-measure.h bench-recovery.h
tools/bench/bench-recovery          bench-measure.h bench.h
tools/bench/bench-hang              bench-measure.h bench-recovery.h bench.h
tools/bench/bench-resume            bench-measure.h bench-recovery.h bench.h
tools/bench/bench-gateway           bench-measure.h bench-recovery.h bench.h
tools/bench/bench-policy-traj       bench-measure.h bench-path.h bench-policy.h
tools/bench/bench-policy            bench-measure.h bench-recovery.h bench.h
tools/bench/bench-sandbox           bench-measure.h bench.h
tools/bench/bench-shim-overhead     bench-measure.h bench.h
tools/bench/bench-bpf-overhead      bench-measure.h bench.h
tools/bench/bench-env-recovery      bench-measure.h bench-path.h bench.h
tools/bench/bench-env-scaling       bench-env-kinds.h bench-env-mem.h bench-measure.h bench-path.h bench.h
tools/bench/bench-env-kinds         bench-measure.h
tools/bench/bench-env-mem           bench-env-kinds.h bench-measure.h
tools/bench/belayer-bench           bench.h
'

declare -A folder_of face_of uses_of unit_of_header path_of_header
names=()
while read -r name folder face uses; do
	[[ -n $name ]] || continue
	names+=("$name")
	folder_of[$name]=$folder
	face_of[$name]=$face
	uses_of[$name]=$uses
done <<<"$rules"

fail=0
complain() {
	echo "check-layers: $*" >&2
	fail=1
}

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	list_files() { git ls-files -- "$1/*.c" "$1/*.h"; }
else
	list_files() { find "$1" -type f \( -name '*.c' -o -name '*.h' \) | sed 's|^\./||'; }
fi

# The unit a path belongs to: the longest listed folder that holds it.
unit_of() {
	local best='' len=0 n
	for n in "${names[@]}"; do
		local f=${folder_of[$n]}
		if [[ $1 == "$f"/* && ${#f} -gt $len ]]; then
			best=$n
			len=${#f}
		fi
	done
	echo "$best"
}

declare -A unit_of_file
files=()
for n in "${names[@]}"; do
	[[ -d ${folder_of[$n]} ]] || complain "${folder_of[$n]} (row $n) does not exist"
	while read -r f; do
		[[ -n $f && -f $f ]] || continue
		[[ -n ${unit_of_file[$f]:-} ]] && continue
		u=$(unit_of "$f")
		unit_of_file[$f]=$u
		files+=("$f")
		if [[ $f == *.h ]]; then
			b=${f##*/}
			if [[ -n ${path_of_header[$b]:-} && ${path_of_header[$b]} != "$f" ]]; then
				complain "$b is ambiguous: ${path_of_header[$b]} and $f"
			fi
			path_of_header[$b]=$f
			unit_of_header[$b]=$u
		fi
	done < <(list_files "${folder_of[$n]}")
done
for n in "${names[@]}"; do
	face=${face_of[$n]}
	[[ $face == '*' || $face == - ]] && continue
	[[ -f ${folder_of[$n]}/$face ]] || complain "${folder_of[$n]}/$face (the face of $n) does not exist"
done

# The table itself points one way: no row reaches itself through what it may use.
declare -A state
visit() {
	local n=$1 use
	[[ ${state[$n]:-} == closed ]] && return 0
	if [[ ${state[$n]:-} == open ]]; then
		complain "the table has a cycle through $n"
		return 0
	fi
	state[$n]=open
	for use in ${uses_of[$n]}; do
		use=${use%+}
		[[ $use == - ]] && continue
		if [[ -z ${folder_of[$use]:-} ]]; then
			complain "row $n uses $use, which has no row"
			continue
		fi
		visit "$use"
	done
	state[$n]=closed
}
for n in "${names[@]}"; do
	visit "$n"
done

for f in "${files[@]}"; do
	u=${unit_of_file[$f]}
	while IFS= read -r hit; do
		line=${hit%%:*}
		[[ ${hit#*:} =~ \"([^\"]*)\" ]] || continue
		b=${BASH_REMATCH[1]##*/}
		hu=${unit_of_header[$b]:-}
		[[ -n $hu && $hu != "$u" ]] || continue
		allowed=0
		for use in ${uses_of[$u]}; do
			if [[ $use == "$hu+" ]]; then
				allowed=1
			elif [[ $use == "$hu" ]]; then
				face=${face_of[$hu]}
				if [[ $face == '*' || $face == "$b" ]]; then
					allowed=1
				else
					complain "$f:$line: $b is private to ${folder_of[$hu]} (its face: $face)"
					allowed=2
				fi
			fi
		done
		[[ $allowed == 0 ]] &&
			complain "$f:$line: $b is ${folder_of[$hu]}'s, which $u may not use (may use: ${uses_of[$u]})"
	done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
done

# The file table: every file of its folders has a row, includes only what its row lists of
# its own folder, and the rows point one way.
declare -A file_uses file_folders
edges=()
while read -r stem uses; do
	[[ -n $stem ]] || continue
	file_uses[$stem]=$uses
	file_folders[${stem%/*}]=1
	for use in $uses; do
		[[ $use == - ]] || edges+=("$stem ${stem%/*}/${use%.h}")
	done
done <<<"$file_rules"
for d in "${!file_folders[@]}"; do
	while read -r f; do
		[[ -n $f && -f $f && ${f%/*} == "$d" ]] || continue
		stem=${f%.*}
		if [[ -z ${file_uses[$stem]+x} ]]; then
			complain "$f has no row in the file table"
			continue
		fi
		while IFS= read -r hit; do
			line=${hit%%:*}
			[[ ${hit#*:} =~ \"([^\"/]*)\" ]] || continue
			b=${BASH_REMATCH[1]}
			[[ -f $d/$b && $b != "${stem##*/}.h" ]] || continue
			[[ " ${file_uses[$stem]} " == *" $b "* ]] ||
				complain "$f:$line: $b is not in its row of the file table (may include: ${file_uses[$stem]})"
		done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
	done < <(list_files "$d")
done
if ((${#edges[@]})) && ! printf '%s\n' "${edges[@]}" | tsort >/dev/null 2>&1; then
	complain "the file table has a cycle: $(printf '%s\n' "${edges[@]}" | tsort 2>&1 >/dev/null | head -n 3 | tr '\n' ' ')"
fi

if [[ $fail != 0 ]]; then
	echo "check-layers: the allowed edges are the table in tests/check-layers.sh (README: Layout)." >&2
	exit 1
fi
echo "check-layers: ${#files[@]} files, every include within the layers."
