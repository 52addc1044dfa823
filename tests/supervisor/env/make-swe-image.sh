#!/bin/bash
# SPDX-License-Identifier: MIT
# Writes an OCI image layout of what test-env-swe.sh's trajectory needs, taken from this host
# without a registry or a container tool (issue 20 item 7): the files of the Debian packages
# that hold dash, coreutils, findutils, tar, sed, grep, make, git, gcc (driver, cc1, binutils,
# crt files, libc headers and libraries) and python3 with pytest and its dependencies, less
# docs, man pages, locales and git's network helpers (curl's closure), plus every shared
# library their ELF files need (ldd, followed to its closure). Layer 1 is those files as one
# uncompressed GNU tar read straight from / (hard links kept, owners 0); layer 2 a minimal
# /etc (passwd, group: nothing secret), the merged-/usr symlinks and the empty directories
# an environment needs. The config sets PATH and HOME and keeps the init up with sleep.
# Prints the layout's size and the time it took.
# Usage: make-swe-image.sh OCI_DIR WORK_DIR
set -euo pipefail
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"

oci=$1
work=$2
t0=$(date +%s%N)
pkgs=(dash coreutils findutils tar sed grep make git gcc gcc-12 cpp-12 binutils
	binutils-x86-64-linux-gnu libgcc-12-dev libgcc-s1 libc6-dev linux-libc-dev python3 python3-minimal
	python3.11 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3-pytest
	python3-pluggy python3-iniconfig python3-packaging python3-py python3-attr
	python3-more-itertools python3-pkg-resources)
for p in "${pkgs[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || { echo "package $p is not installed (tools/dev setup)" >&2; exit 1; }
done
mkdir -p "$work"

# canon: host paths (one a line) as paths under / in merged-/usr form, without the leading /
canon() { sed -e 's#^/\(bin\|sbin\|lib\|lib64\)/#/usr/\1/#' -e 's#^/##'; }
# The packages' files, less what the trajectory never reads: no LTO, gold, profilers,
# sanitizers or static libraries but those a dynamic link takes, no test modules.
dpkg -L "${pkgs[@]}" | grep '^/' | grep -v -E \
	-e '^/\.?$' -e '^/etc(/|$)' -e '^/usr/share/(doc|man|info|locale|lintian|bug|bash-completion)(/|$)' \
	-e '/git-core/git-(remote-(http|ftp)|http-|imap-send)' -e '/__pycache__(/|$)' \
	-e '[/-](lto1|lto-dump-12|ld\.gold|dwp|gprofng?|gp-[a-z-]+|libgprofng\.so.*)$' -e '/12/plugin(/|$)' \
	-e '/lib-dynload/(_test|xxlimited|_xxtest|_ctypes_test)' -e '^/usr/lib/python3\.11/(test|idlelib|tkinter|turtledemo)(/|$)' |
	awk '!/\.a$/ || /\/(libgcc|libgcc_eh|lib[a-z]*_nonshared)\.a$/' |
	canon | sort -u >"$work/files"
# The shared libraries of every ELF file among them, to their closure (ldd resolves the
# whole tree at once), each with what its symlink points to.
(cd / && xargs -a "$work/files" -d '\n' file -N --no-pad -F '|' 2>/dev/null) |
	awk -F'|' '$2 ~ /ELF .*(executable|shared object)/ {print "/" $1}' >"$work/elves"
xargs -a "$work/elves" -d '\n' ldd 2>/dev/null |
	awk '$2 == "=>" && $3 ~ /^\// {print $3} NF == 2 && $1 ~ /^\// {print $1}' | sort -u >"$work/libs"
while read -r l; do
	echo "$l"
	readlink -f "$l"
done <"$work/libs" | canon >>"$work/files"
# Every file's parent directories, so that the tar holds each directory before its files.
awk '{print; p = $0; while (sub(/\/[^\/]*$/, "", p)) print p}' "$work/files" | sort -u >"$work/list"

tar --owner=0 --group=0 --numeric-owner --no-recursion -C / -T "$work/list" -cf "$work/layer1.tar"
rm -rf "$work/root2"
mkdir -p "$work/root2"/{etc,dev,proc,sys,tmp,work,root,run,var/tmp}
chmod 1777 "$work/root2/tmp" "$work/root2/var/tmp"
chmod 700 "$work/root2/root"
for l in bin lib lib64 sbin; do ln -s "usr/$l" "$work/root2/$l"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' \
	>"$work/root2/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$work/root2/etc/group"
echo swe >"$work/root2/etc/hostname"
tar --owner=0 --group=0 --numeric-owner -C "$work/root2" -cf "$work/layer2.tar" .
oci_layout "$oci" '{"Env":["PATH=/usr/local/bin:/usr/bin:/bin","HOME=/root","LANG=C.UTF-8"],"WorkingDir":"/work","Cmd":["/bin/sh","-c","exec sleep infinity"]}' \
	"$work/layer1.tar" "$work/layer2.tar"
echo "image: $(wc -l <"$work/list") entries, $(du -sm "$oci" | cut -f1) MiB, written in $((($(date +%s%N) - t0) / 1000000)) ms"
