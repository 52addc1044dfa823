#!/bin/bash
# SPDX-License-Identifier: MIT
# A several-GiB image (issue 20 item 1: "images of 10+ layers and of several GiB must work"):
# an OCI layout of a busybox layer and four layers of 512 MiB of random data each (2 GiB,
# uncompressed tar layers as the spec allows), written here with GNU tar. Through the
# supervisor: imported with bounded memory (the supervisor's peak RSS stays far below a
# layer), an environment made of it sees every byte (sha256 inside = outside), a second
# environment of the cached image starts without reading a layer, and it checkpoints and
# restores. Prints the times.
# Usage: test-image-large.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../helpers/test-lib.sh"
need_root_cgroup_v2
[[ -x /bin/busybox ]] || fail "no /bin/busybox (tools/dev setup installs busybox-static)"

env_fixture image-large big1 big2
on_fail() { tail -20 "$dir/sv.log"; }
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
layers=4
mib=512
avail=$(df --output=avail -k "$dir" | tail -n1)
((avail > 3 * layers * mib * 1024)) || fail "needs $((3 * layers * mib)) MiB free in $dir (layout, store, a copy)"

# The layout: blobs named by their sha256, an index, a manifest, a config.
oci=$dir/oci
mkdir -p "$dir/l0/bin"
cp /bin/busybox "$dir/l0/bin/"
for a in sh sleep sha256sum cat; do ln -s busybox "$dir/l0/bin/$a"; done
tar --owner=0 --group=0 -C "$dir/l0" -cf "$dir/layer0.tar" .
tars=("$dir/layer0.tar")
t=$(date +%s%N)
for i in $(seq 1 $layers); do
	mkdir -p "$dir/l$i/data"
	head -c $((mib << 20)) /dev/urandom >"$dir/l$i/data/part$i"
	sha256sum "$dir/l$i/data/part$i" | cut -d' ' -f1 >"$dir/want$i"
	tar --owner=0 --group=0 -C "$dir/l$i" -cf "$dir/layer$i.tar" .
	rm -rf "$dir/l$i"
	tars+=("$dir/layer$i.tar")
done
oci_layout "$oci" '{"Cmd":["/bin/sh","-c","exec sleep infinity"]}' "${tars[@]}"
echo "layout of $((layers * mib)) MiB written in $(ms "$t") ms"

env_conf
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }

t=$(date +%s%N)
ctl image import "oci:$oci" --name big >/dev/null || fail "the import failed"
echo "import of $((layers * mib)) MiB in $(ms "$t") ms"
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$sv_pid/status")
echo "supervisor's peak RSS after the import: $((hwm / 1024)) MiB"
((hwm < 256 * 1024)) || fail "the import held $((hwm / 1024)) MiB: not bounded"
rm -rf "$oci" # the store has it now

t=$(date +%s%N)
ctl env create big1 --image big >/dev/null || fail "create failed"
echo "environment of the cached image in $(ms "$t") ms"
for i in $(seq 1 $layers); do
	got=$(ctl env exec big1 --timeout 120 -- sha256sum "/data/part$i" | cut -d' ' -f1)
	[[ $got == "$(cat "$dir/want$i")" ]] || fail "layer $i's data differs inside"
done
t=$(date +%s%N)
ctl env create big2 --image big >/dev/null || fail "a second environment failed"
echo "second environment in $(ms "$t") ms"
ctl env exec big1 -- sh -c 'echo turn-1 >/state' >/dev/null
t=$(date +%s%N)
ctl env checkpoint big1 --turn 1 >/dev/null || fail "checkpoint failed"
echo "checkpoint in $(ms "$t") ms"
ctl env exec big1 -- sh -c 'echo turn-2 >/state' >/dev/null
t=$(date +%s%N)
ctl env restore big1 >/dev/null || fail "restore failed"
echo "restore in $(ms "$t") ms"
[[ $(ctl env exec big1 -- cat /state) == turn-1 ]] || fail "the restore lost the turn"
ctl env destroy big1 >/dev/null
ctl env destroy big2 >/dev/null
ctl image rm big >/dev/null || fail "image rm failed"
echo PASS
