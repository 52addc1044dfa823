#!/bin/bash
# SPDX-License-Identifier: MIT
# Files held open whose path no longer leads to them checkpoint and restore: (a) a base-layer
# file held open and replaced by a rename from inside (sed -i, mv new old, an editor's save);
# (b) a base-layer file held open and deleted; (c) a file the environment created (upper layer)
# held open and deleted; (d) a base-layer file mapped MAP_PRIVATE and replaced; (f) a shared
# library of the base loaded and replaced (pip upgrading a module in use); (e) a base-layer file
# held open and replaced through belayerctl env write; (g) an upper file held open, its name
# deleted, another hard link to it kept (refused, naming it); (h) a replaced base file over
# [env] ghost_limit (refused, naming it). After a restore the process holds (fd and
# mapping, read through /proc/PID) what it held at the checkpoint, the paths show what they showed,
# and a second checkpoint of the restored environment restores too.
# Usage: test-env-remap.sh SUPERVISOR BELAYERCTL
set -euo pipefail

supervisor=$1
ctl_bin=$2
# shellcheck source=SCRIPTDIR/../../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/test-lib.sh"
need_root_cgroup_v2
command -v python3 >/dev/null || fail "python3 is needed for the holder"

cases=(a b c d e f)
env_fixture envremap "${cases[@]}" g h i
on_fail() { tail -n 30 "$dir/sv.log"; }
env_conf
echo "ghost_limit = 1M" >>"$dir/conf.ini"
sed -i 's/^trace = no$/trace_preload = yes/' "$dir/conf.ini"
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }

# The holder: opens /work/CASE.txt as fd 10 (f: loads /work/libz.so.1), maps it (d), then
# replaces or deletes it itself (a-d, f), and says so with /work/ready-CASE.
cat >"$dir/base/work/holder.py" <<'PY'
import ctypes, mmap, os, sys, time
case = sys.argv[1]
p = "/work/libz.so.1" if case == "f" else "/work/%s.txt" % case
if case in ("c", "g"):
    with open(p, "w") as f:
        f.write("made inside %d\n" % os.getpid() * 100)
fd = os.open(p, os.O_RDONLY)
os.dup2(fd, 10)
os.close(fd)
if case == "d":
    m = mmap.mmap(10, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
if case == "f":
    lib = ctypes.CDLL(p)
if case in ("a", "d", "f", "h"):
    with open(p + ".new", "w") as f:
        f.write("the new %s\n" % case)
    os.rename(p + ".new", p)
elif case in ("b", "c"):
    os.unlink(p)
elif case == "g":
    os.link(p, "/work/g-link.txt")
    os.unlink(p)
open("/work/ready-" + case, "w").close()
while True:
    time.sleep(3600)
PY
mkdir -p "$dir/orig"
for c in a b d e i; do
	seq -f "base line %g of $c" 5000 >"$dir/base/work/$c.txt"
	cp "$dir/base/work/$c.txt" "$dir/orig/$c.txt"
done
zlib=$(python3 -c 'import ctypes.util, sys; print(ctypes.util.find_library("z") or "")')
zpath=$(ldconfig -p | awk -v l="$zlib" '$1 == l && /x86-64/ {print $NF; exit}')
[[ -n $zpath ]] || fail "no libz to load"
cp "$zpath" "$dir/base/work/libz.so.1"
cp "$zpath" "$dir/orig/f.txt"
head -c 2097152 /dev/urandom >"$dir/base/work/h.txt"

supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
for c in "${cases[@]}" g h i; do
	ctl env create "$c" --root "$dir/base" --cmd "exec python3 /work/holder.py $c" >/dev/null
done
for c in "${cases[@]}" g h i; do
	for _ in $(seq 200); do [[ -e $dir/state/envs/$c/root/work/ready-$c ]] && break; sleep 0.05; done
	[[ -e $dir/state/envs/$c/root/work/ready-$c ]] || fail "holder $c did not start"
done
# c's content, as the process wrote it (its pid in the environment is in it).
holder() { # ENV: the host pid of its holder
	local p
	for p in $(cat "$cg/$1/cgroup.procs"); do
		[[ $(cat "/proc/$p/comm" 2>/dev/null) == python3 ]] && { echo "$p"; return; }
	done
	fail "no holder in $1"
}
cp "/proc/$(holder c)/fd/10" "$dir/orig/c.txt"
cp "/proc/$(holder g)/fd/10" "$dir/orig/g.txt"
printf 'written from outside\n' >"$dir/in"
ctl env write e /work/e.txt <"$dir/in" >/dev/null

# check ENV WHEN: the holder's fd 10 (and its mapping of the file, d and f) hold the original.
check() {
	local pid
	pid=$(holder "$1")
	cmp -s "/proc/$pid/fd/10" "$dir/orig/$1.txt" || fail "$1 $2: fd 10 holds another content: $(ls -l "/proc/$pid/fd/10"; head -c 200 "/proc/$pid/fd/10")"
	if [[ $1 == d || $1 == f ]]; then
		python3 - "$pid" "$dir/orig/$1.txt" "$1 $2" <<'PY' || fail "$1 $2: the mapping differs"
import sys
pid, orig, what = sys.argv[1], open(sys.argv[2], "rb").read(), sys.argv[3]
name = "libz.so.1" if what[0] == "f" else "d.txt"
for line in open("/proc/%s/maps" % pid):
    f = line.split()
    if len(f) >= 6 and f[5].startswith("/work/" + name) and int(f[2], 16) == 0:
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        with open("/proc/%s/mem" % pid, "rb") as mem:
            mem.seek(lo)
            got = mem.read(min(hi - lo, len(orig)))
        sys.exit(0 if got == orig[:len(got)] and got else 1)
sys.exit("%s: no mapping of %s at offset 0" % (what, name))
PY
	fi
}
for c in "${cases[@]}"; do check "$c" "before"; done

failed=()
for c in "${cases[@]}"; do
	if ! ctl env checkpoint "$c" --turn 1 >"$dir/ck-$c.txt" 2>&1; then
		failed+=("$c: $(cat "$dir/ck-$c.txt")")
		continue
	fi
	ctl env restore "$c" >"$dir/rs-$c.txt" 2>&1 || { failed+=("$c restore: $(cat "$dir/rs-$c.txt")"); continue; }
	check "$c" "after a restore"
	ls -A "$dir/state/envs/$c/root/work" >"$dir/ls-$c.txt"
	grep -v -e '^holder.py$' -e '^ready-' -e '^[a-ei].txt$' -e '^h.txt$' -e '^g-link.txt$' -e '^libz.so.1$' "$dir/ls-$c.txt" &&
		fail "$c: the restored environment shows files of CRIU's: $(cat "$dir/ls-$c.txt")"
	ctl env checkpoint "$c" --turn 2 >"$dir/ck2-$c.txt" 2>&1 || { failed+=("$c after a restore: $(cat "$dir/ck2-$c.txt")"); continue; }
	ctl env restore "$c" >"$dir/rs2-$c.txt" 2>&1 || { failed+=("$c second restore: $(cat "$dir/rs2-$c.txt")"); continue; }
	check "$c" "after a second restore"
done
((${#failed[@]} == 0)) || fail "$(printf '%s\n' "${failed[@]}")"

# (g) a file the environment made, held open, its name deleted while another hard link to it
# remains: CRIU saves it as a link in the file system ("link_remap.N" beside it) made and removed
# within the dump, which no checkpoint's files hold. Refused, naming the file and the process; the
# environment's files are as they were, and it checkpoints once the other link is gone too.
if ctl env checkpoint g --turn 1 >"$dir/ck-g.txt" 2>&1; then
	fail "g: a checkpoint that cannot restore was taken: $(cat "$dir/ck-g.txt")"
fi
grep -qF "pid $(holder g) (python3) fd 10: /work/g.txt" "$dir/ck-g.txt" || fail "g: the refusal does not name the file: $(cat "$dir/ck-g.txt")"
grep -qF "/work/g.txt" "$dir/sv.log" || fail "g: the supervisor's log does not name the file"
ctl events --replay 64 --no-follow | grep -F "/work/g.txt" | grep -q env || fail "g: no env event names the file"
[[ ! -e $dir/state/envs/g/head ]] || fail "g: the refused checkpoint moved the head"
ls -A "$dir/state/envs/g/root/work" >"$dir/ls-g.txt"
grep -qx g-link.txt "$dir/ls-g.txt" && ! grep -q link_remap "$dir/ls-g.txt" ||
	fail "g: the files changed: $(cat "$dir/ls-g.txt")"
rm "$dir/state/envs/g/root/work/g-link.txt"
ctl env checkpoint g --turn 1 >"$dir/ck-g.txt" 2>&1 || fail "g without the other link: $(cat "$dir/ck-g.txt")"
ctl env restore g >"$dir/rs-g.txt" 2>&1 || fail "g restore: $(cat "$dir/rs-g.txt")"
check g "after a restore"

# (h) a base file held open and replaced, larger than [env] ghost_limit (1M here): refused,
# naming the limit, the file and the process.
if ctl env checkpoint h --turn 1 >"$dir/ck-h.txt" 2>&1; then
	fail "h: a 2 MiB ghost over a 1 MiB limit was dumped"
fi
for want in "Can't dump ghost file /work/h.txt of 2097152 size" "ghost_limit is 1048576 bytes" \
	"pid $(holder h) (python3) fd 10: /work/h.txt"; do
	grep -qF "$want" "$dir/ck-h.txt" || fail "h: the refusal lacks '$want': $(cat "$dir/ck-h.txt")"
done

# (i) a base file held open, checkpointed while its name still led to it, then replaced through
# env write while no process ran: the next checkpoint must not reuse images that open the file
# by its name.
ctl env checkpoint i --turn 1 >"$dir/ck-i.txt" 2>&1 || fail "i: $(cat "$dir/ck-i.txt")"
ctl env write i /work/i.txt <"$dir/in" >/dev/null
ctl --json env checkpoint i --turn 2 >"$dir/ck-i.txt" 2>&1 || fail "i turn 2: $(cat "$dir/ck-i.txt")"
ctl env restore i >"$dir/rs-i.txt" 2>&1 || fail "i restore: $(cat "$dir/rs-i.txt")"
check i "after a restore"
[[ $(ctl env read i /work/i.txt) == "written from outside" ]] || fail "i: /work/i.txt is not what env write wrote"

# The checkpoints hold the replaced and deleted files as CRIU's ghost files, in their images.
for c in a b c d e f; do
	compgen -G "$dir/state/envs/$c/ckpt/*/criu/ghost-file-*.img" >/dev/null || fail "$c: no ghost file in the images"
done

# What the paths show: a, d and f the new file, e what env write wrote, b and c nothing.
for c in a d; do [[ $(ctl env read "$c" "/work/$c.txt") == "the new $c" ]] || fail "$c: /work/$c.txt is not the new file"; done
[[ $(ctl env read f /work/libz.so.1) == "the new f" ]] || fail "f: /work/libz.so.1 is not the new file"
[[ $(ctl env read e /work/e.txt) == "written from outside" ]] || fail "e: /work/e.txt is not what env write wrote"
for c in b c; do [[ ! -e $dir/state/envs/$c/root/work/$c.txt ]] || fail "$c: /work/$c.txt came back"; done
echo "ok: ${cases[*]} checkpoint and restore holding what they held"
