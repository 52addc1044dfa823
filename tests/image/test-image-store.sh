#!/bin/bash
# SPDX-License-Identifier: MIT
# The layer store (issue 20) on OCI layouts gen-image.py writes: a good two-layer image
# (whiteouts, an opaque directory, hard links and xattrs kept, modes kept), a 12-layer one,
# a second import that touches no layer, the hostile ones each refused with the layer and entry
# named and nothing left in the store, rm refused while an environment uses the image, gc.
# Usage: test-image-store.sh IMAGE_TOOL GEN_IMAGE
set -euo pipefail
# shellcheck source=SCRIPTDIR/../helpers/test-lib.sh
source "$(dirname "$0")/../helpers/test-lib.sh"

tool=$1
gen=$2
((EUID == 0)) || skip "needs root (trusted.overlay xattrs, whiteout devices, chown)"
[[ -x /bin/busybox ]] || skip "no /bin/busybox (apt-get install busybox-static)"
dir=$(mktemp -d /tmp/belayer-image.XXXXXX)
trap 'rm -rf "$dir"' EXIT
state=$dir/state
mkdir -p "$state"

xattr() { python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], sys.argv[2]).decode())' "$@" 2>/dev/null; }
img() { python3 "$gen" "$dir/$1" "$1" "${@:2}"; }
layers_in_store() { find "$state/images/layers" -mindepth 1 -maxdepth 1 | wc -l; }

img good
out=$("$tool" "$state" import "oci:$dir/good:test" good) || fail "good image refused"
echo "$out"
[[ $out == *"unpacked=2 cached=0"* ]] || fail "good: expected 2 layers unpacked: $out"
id=${out%% *}
mapfile -t L < <("$tool" "$state" layers good)
((${#L[@]} == 2)) || fail "good: ${#L[@]} layers"
bottom=${L[0]} top=${L[1]}
# a whiteout is a 0/0 character device, an opaque directory carries the overlay xattr
[[ -c $top/gone && $(stat -c %t:%T "$top/gone") == 0:0 ]] || fail "no whiteout for gone"
[[ $(xattr "$top/opq" trusted.overlay.opaque) == y ]] ||
	fail "opq not opaque"
[[ ! -e $top/.wh.gone && ! -e $top/opq/.wh..wh..opq ]] || fail "whiteout markers left as files"
# hard links within a layer are one inode; modes, set-id bits and xattrs kept
[[ $(stat -c %i "$top/link-a") == $(stat -c %i "$top/link-b") ]] || fail "hard link split"
[[ $(stat -c %i "$bottom/bin/sh") == $(stat -c %i "$bottom/bin/busybox") ]] ||
	fail "bin/sh not a hard link of busybox"
[[ $(readlink "$bottom/bin/sleep") == busybox ]] || fail "symlink lost"
[[ $(stat -c %a "$top/setuid") == 4755 && $(stat -c %a "$bottom/data") == 640 ]] ||
	fail "modes: $(stat -c %a "$top/setuid") $(stat -c %a "$bottom/data")"
[[ $(xattr "$top/link-a" user.belayer) == kept ]] ||
	fail "user xattr lost"
# the stack as overlay reads it: gone is gone, opq holds only new
mnt=$dir/mnt
mkdir -p "$mnt"
mount -t overlay overlay -o "lowerdir=$top:$bottom" "$mnt"
seen=$(ls "$mnt/opq"; [[ -e $mnt/gone ]] && echo gone-visible; cat "$mnt/data")
umount "$mnt"
[[ $seen == $'new\nshared bytes' ]] || fail "overlay view: $seen"
# the config as the store keeps it
cfg=$("$tool" "$state" config good)
[[ $cfg == *"workdir=/work"* && $cfg == *"env=GREETING=hello image"* &&
	$cfg == *"arg=exec sleep 1000"* ]] || fail "config: $cfg"

# a second import touches no layer
touch -d @1 "$top/opq/new"
out=$("$tool" "$state" import "oci:$dir/good" good) || fail "second import"
[[ $out == "$id unpacked=0 cached=2"* ]] || fail "second import unpacked: $out"
[[ $(stat -c %Y "$top/opq/new") == 1 ]] || fail "second import touched a layer"

# zstd-compressed layers (the bottom one is the good image's: not read again)
img zstd
out=$("$tool" "$state" import "oci:$dir/zstd" zstd) || fail "zstd image refused"
[[ $out == *"unpacked=1 cached=1"* ]] || fail "zstd: $out"
[[ $(cat "$("$tool" "$state" layers zstd | tail -1)/opq/new") == visible ]] || fail "zstd layer"
"$tool" "$state" rm zstd || fail "rm zstd"

# 12 layers, sharing the bottom one
img many 12
out=$("$tool" "$state" import "oci:$dir/many" many) || fail "12 layers refused"
[[ $out == *"unpacked=11 cached=1"* ]] || fail "many: $out"
(($(layers_in_store) == 13)) || fail "store holds $(layers_in_store) layers, not 13"

# hostile images: refused, the layer and entry named, nothing new in the store
before=$(layers_in_store)
check_refused() { # KIND WORDS-EXPECTED-IN-THE-ERROR...
	local kind=$1 err
	shift
	img "$kind"
	if err=$("$tool" "$state" import "oci:$dir/$kind" 2>&1); then
		fail "$kind: imported"
	fi
	echo "$kind: $err"
	for w in "$@"; do
		[[ $err == *"$w"* ]] || fail "$kind: \"$w\" not in: $err"
	done
	(($(layers_in_store) == before)) || fail "$kind: left $(layers_in_store) layers"
	[[ -z $(find "$state/images" -name '.tmp-*') ]] || fail "$kind: left a temporary dir"
	if "$tool" "$state" list | grep -q " $kind "; then fail "$kind: recorded"; fi
}
check_refused dotdot "layer 2 (sha256:" 'entry "../escape"'
check_refused absolute "layer 2 (sha256:" 'entry "/abs-escape"'
check_refused device "layer 2 (sha256:" 'entry "dev-null"' "device node"
check_refused symlink-write "layer 2 (sha256:" 'entry "evil/through-symlink"' symlink
[[ ! -e /tmp/through-symlink ]] || fail "wrote through the symlink"
rm -f /tmp/belayer-image-escape
check_refused symlink-deep "layer 2 (sha256:" 'entry "evil/tmp/belayer-image-escape"' symlink
[[ ! -e /tmp/belayer-image-escape ]] || fail "wrote through a symlink to /"
check_refused hardlink-across "layer 2 (sha256:" 'entry "steal"' "not a file of this layer"
check_refused hardlink-out "layer 2 (sha256:" 'entry "steal"'
check_refused overlay-xattr "layer 2 (sha256:" 'entry "redir"' "trusted.overlay"
check_refused digest "layer 2 (sha256:" "digest mismatch"
check_refused truncated "layer 2 (sha256:"
check_refused diffid "layer 2 (sha256:" "diff_id mismatch"

# a name is one line of a record: anything but the characters of a reference is refused
if err=$("$tool" "$state" import "oci:$dir/good" $'x\nlayer sha256:0' 2>&1); then
	fail "a name with a newline accepted"
fi
[[ $err == *"a name is at most"* ]] || fail "bad name: $err"

# rm: refused while an environment records the image; then its layers go, shared ones stay
mkdir -p "$state/envs/e1"
echo "$id" >"$state/envs/e1/image"
if err=$("$tool" "$state" rm good 2>&1); then fail "rm of an image in use"; fi
[[ $err == *"used by environment e1"* ]] || fail "rm in use: $err"
rm "$state/envs/e1/image"
"$tool" "$state" rm good || fail "rm good"
[[ ! -d $top && -d $bottom ]] || fail "rm good: top layer kept or shared bottom removed"
"$tool" "$state" rm many || fail "rm many"
(($(layers_in_store) == 0)) || fail "rm many left $(layers_in_store) layers"
# gc takes what an interrupted import left
mkdir -p "$state/images/layers/.tmp-interrupted/x"
[[ $("$tool" "$state" gc) == 0 && ! -e $state/images/layers/.tmp-interrupted ]] ||
	fail "gc left the interrupted import"
echo OK
