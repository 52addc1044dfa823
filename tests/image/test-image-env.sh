#!/bin/bash
# SPDX-License-Identifier: MIT
# Environments from real container images (issue 20 item 1), through the supervisor: podman
# builds an image here without a registry (podman import of a busybox-static root, then a
# Containerfile FROM it with COPY, ENV, WORKDIR, CMD) and saves it in both formats;
# belayerctl env create --image runs it with the image's config and no host /usr or /etc, and
# env exec in it gets that config too (Env, WorkingDir, User and groups, as docker exec); a
# second environment of the same image (the other format) unpacks nothing; checkpoint and
# restore bring back the same process and files; the image cannot be removed while used.
# Usage: test-image-env.sh SUPERVISOR BELAYERCTL GEN_IMAGE
set -euo pipefail

supervisor=$1
ctl_bin=$2
gen=$3
# shellcheck source=SCRIPTDIR/../helpers/test-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../helpers/test-lib.sh"
need_root_cgroup_v2
command -v podman >/dev/null || skip "no podman (tools/dev setup installs it)"
[[ -x /bin/busybox ]] || skip "no /bin/busybox (apt-get install busybox-static)"

env_fixture image e1 e2 e3 e4 e5 e1f
# podman's own store, private to the test
export CONTAINERS_STORAGE_CONF=$dir/storage.conf
printf '[storage]\ndriver = "overlay"\nrunroot = "%s"\ngraphroot = "%s"\n' \
	"$dir/podman-run" "$dir/podman-graph" >"$CONTAINERS_STORAGE_CONF"
pm() { podman --runtime runc "$@"; }
mkdir -p "$dir/rootfs/bin" "$dir/rootfs/tmp" "$dir/ctx/app"
cp /bin/busybox "$dir/rootfs/bin/"
for l in sh sleep cat ls id env pwd; do ln -s busybox "$dir/rootfs/bin/$l"; done
tar -C "$dir/rootfs" -cf "$dir/rootfs.tar" .
pm import -q "$dir/rootfs.tar" localhost/bb-root:1 >/dev/null
echo 'from the image' >"$dir/ctx/app/hello"
cat >"$dir/ctx/Containerfile" <<'CF'
FROM localhost/bb-root:1
COPY app /app
ENV GREETING="hello image" PATH=/bin
WORKDIR /app
CMD ["/bin/sh", "-c", "sleep 1000001 & echo $! >/tmp/bgpid; echo started >/tmp/started; exec sleep 1000000"]
CF
pm build -q -t localhost/bb-app:1 "$dir/ctx" >/dev/null
pm save -q --format docker-archive -o "$dir/app.tar" localhost/bb-app:1
pm save -q --format oci-dir -o "$dir/app-oci" localhost/bb-app:1

cat >"$dir/conf.ini" <<CONF
[supervisor]
socket = $dir/sv.sock
state_dir = $dir/state
[journal]
enabled = no
[health]
interval = 0
[env]
cgroup = $cg
workers = 2
CONF
BELAYER_LOG_LEVEL=${BELAYER_LOG_LEVEL:-info} supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv.log"
ctl() { "$ctl_bin" -s "$dir/sv.sock" "$@"; }
on_fail() { tail -20 "$dir/sv.log"; }
env_pid() { ctl --json env list | grep "\"env\":\"$1\"" | sed -n 's/.*"pid":\([0-9]*\).*/\1/p'; }
in_env() { # PID COMMAND
	sh -c "$(env_join "$1")exec nsenter -t $1 -a -r -w sh -c '$2'"
}

ctl env create e1 --image "docker-archive:$dir/app.tar" >/dev/null || fail "env create e1"
pid=$(env_pid e1)
[[ -n $pid ]] || fail "no pid for e1"
layers=$(find "$dir/state/images/layers" -mindepth 1 -maxdepth 1 | wc -l)
((layers == 2)) || fail "the store holds $layers layers, not 2"
# the image's config: Cmd ran, Env, WorkingDir; the image's files, no host /usr or /etc
for _ in $(seq 100); do [[ -e $dir/state/envs/e1/root/tmp/started ]] && break; sleep 0.05; done
[[ -e $dir/state/envs/e1/root/tmp/started ]] || fail "the image's Cmd did not run"
sleeper=$(pgrep -P "$pid" sleep || echo "$pid")
tr '\0' '\n' <"/proc/$sleeper/environ" | grep -qx 'GREETING=hello image' ||
	fail "Env not honoured: $(tr '\0' ' ' <"/proc/$sleeper/environ")"
[[ $(readlink "/proc/$sleeper/cwd") == */app || $(in_env "$pid" 'cat /proc/1/cwd/hello') == 'from the image' ]] ||
	fail "WorkingDir not honoured"
[[ $(in_env "$pid" 'cat /app/hello') == 'from the image' ]] || fail "image file missing"
in_env "$pid" 'test ! -e /usr/bin && test ! -e /etc/debian_version' ||
	fail "host /usr or /etc visible in an image environment"

# env exec, as docker exec: the image's Env (--env over it) and WorkingDir (--cwd over it)
# shellcheck disable=SC2016 # the environment's shell expands it
[[ $(ctl env exec e1 -- sh -c 'echo "$GREETING in $PATH"') == "hello image in /bin" ]] ||
	fail "exec without the image's Env: $(ctl env exec e1 -- env)"
# shellcheck disable=SC2016 # the environment's shell expands it
[[ $(ctl env exec e1 --env GREETING=over -- sh -c 'echo "$GREETING"') == over ]] ||
	fail "exec --env over the image's Env"
[[ $(ctl env exec e1 -- pwd) == /app ]] || fail "exec not in the WorkingDir: $(ctl env exec e1 -- pwd)"
[[ $(ctl env exec e1 --cwd /tmp -- pwd) == /tmp ]] || fail "exec --cwd over the WorkingDir"

# the same image from its OCI layout: nothing unpacked again
touch -d @1 "$dir/state/images/layers"/*
ctl env create e2 --image "oci:$dir/app-oci" >/dev/null || fail "env create e2"
[[ -n $(env_pid e2) ]] || fail "no pid for e2"
[[ $(find "$dir/state/images/layers" -mindepth 1 -maxdepth 1 | wc -l) == 2 ]] ||
	fail "the second environment added layers"
[[ -z $(find "$dir/state/images/layers" -mindepth 1 -maxdepth 1 -newermt @2) ]] ||
	fail "the second environment touched a layer"

# checkpoint, change, restore: the same processes (the Cmd's background one by its pid in the
# environment) and files
in_env "$pid" 'echo before >/app/state'
bg=$(cat "$dir/state/envs/e1/root/tmp/bgpid") # its pid in the environment
ctl env checkpoint e1 --turn 1 >/dev/null
in_env "$pid" 'rm /app/state; echo after >/app/new'
ctl env restore e1 >/dev/null
pid=$(env_pid e1)
[[ $(cat "$dir/state/envs/e1/root/app/state") == before ]] || fail "file not restored"
[[ ! -e $dir/state/envs/e1/root/app/new ]] || fail "a file from after the checkpoint survived"
in_env "$pid" "grep -q 1000001 /proc/$bg/cmdline" || fail "process $bg not restored"

# a fork of an image environment is one of the image too (its layers, its record)
ctl env fork e1 --as e1f >/dev/null || fail "fork of an image environment"
fpid=$(env_pid e1f)
[[ $(in_env "$fpid" 'cat /app/state /app/hello') == $'before\nfrom the image' ]] ||
	fail "the fork's files"
[[ $(cat "$dir/state/envs/e1f/image") == "$(cat "$dir/state/envs/e1/image")" ]] ||
	fail "the fork does not record the image"

# a restarted supervisor takes the image's environment back (its layers found from envs/e1/image)
kill -KILL "$sv_pid"
wait "$sv_pid" 2>/dev/null || true
umount "$dir/state/envs/e1/root" # as after a reboot: the overlay must come back from the store
supervisor_start "$supervisor" "$dir/conf.ini" "$dir/sv2.log"
ctl env restore e1 >/dev/null || fail "restore after a supervisor restart"
pid=$(env_pid e1)
[[ $(in_env "$pid" 'cat /app/state /app/hello') == $'before\nfrom the image' ]] ||
	fail "the image environment after a restart"

# belayerctl image: listed; in use, not removable; destroyed, it is, its layers too
ctl image list | grep -q 'localhost/bb-app:1 .* 2 layers' || fail "image list: $(ctl image list)"
if err=$(ctl image rm localhost/bb-app:1 2>&1); then fail "rm of an image in use"; fi
[[ $err == *"used by environment"* ]] || fail "rm in use: $err"
ctl env destroy e1 >/dev/null
ctl env destroy e2 >/dev/null
if ctl image rm localhost/bb-app:1 2>/dev/null; then fail "rm of an image a fork uses"; fi
ctl env destroy e1f >/dev/null
ctl image rm localhost/bb-app:1 || fail "rm after destroy"
[[ -z $(find "$dir/state/images/layers" -mindepth 1 -maxdepth 1) ]] || fail "layers left after rm"

# 12 layers, imported first, then an environment by the image's name
python3 "$gen" "$dir/many" many 12
out=$(ctl image import "oci:$dir/many" --name many) || fail "import of 12 layers"
[[ $out == *"12 layers: 12 unpacked"* ]] || fail "import reply: $out"
ctl env create e4 --image many >/dev/null || fail "env create e4"
pid=$(env_pid e4)
[[ $(in_env "$pid" 'cat /layer01 /layer11; cat /data') == $'1\n11\nshared bytes' ]] ||
	fail "the 12 layers are not stacked"
ctl env destroy e4 >/dev/null
ctl image rm many >/dev/null
mkdir "$dir/state/images/layers/.tmp-left"
[[ $(ctl image gc) == "0 layers removed" && ! -e $dir/state/images/layers/.tmp-left ]] ||
	fail "gc"

# User: a name looked up in the image's /etc/passwd
python3 "$gen" "$dir/user" user
ctl env create e3 --image "oci:$dir/user" >/dev/null || fail "env create e3"
pid=$(env_pid e3)
[[ $(awk '/^Uid:/ {print $2}' "/proc/$pid/status") == 1234 ]] ||
	fail "User agent not honoured: $(grep -E '^(Uid|Gid)' "/proc/$pid/status")"
[[ $(awk '/^Gid:/ {print $2}' "/proc/$pid/status") == 1234 &&
	$(awk '/^Groups:/ {$1 = ""; print}' "/proc/$pid/status") == " 1234 2000" ]] ||
	fail "the user's groups: $(grep -E '^(Gid|Groups)' "/proc/$pid/status")"
# env exec runs as the image's User too, with its groups; --user over it
[[ $(ctl env exec e3 -- busybox id -u) == 1234 && $(ctl env exec e3 -- busybox id -G) == "1234 2000" ]] ||
	fail "exec not as the image's User: $(ctl env exec e3 -- busybox id)"
# shellcheck disable=SC2016 # the environment's shell expands it
[[ $(ctl env exec e3 -- sh -c 'echo $HOME') == $(awk -F: '$1 == "agent" {print $6}' \
	"$dir/state/envs/e3/root/etc/passwd") ]] || fail "exec: not the User's HOME"
[[ $(ctl env exec e3 --user 0 -- busybox id -u) == 0 ]] || fail "exec --user 0 in an image environment"
if err=$(ctl env exec e3 --user nosuch -- true 2>&1); then fail "exec as a user the image lacks"; fi
[[ $err == *"no such user or group"* ]] || fail "exec --user nosuch: $err"
# an image with neither a shell nor a command: refused, saying so
python3 "$gen" "$dir/noshell" noshell
if err=$(ctl env create e5 --image "oci:$dir/noshell" 2>&1); then fail "an image without a command ran"; fi
[[ $err == *"the image has no /bin/sh"* ]] || fail "no shell: $err"

# a rebuild (the replay baseline) starts it again from the image alone
in_env "$pid" 'echo scratch >/work/scratch'
[[ -e $dir/state/envs/e3/root/work/scratch ]] || fail "no scratch file"
ctl env rebuild e3 >/dev/null || fail "rebuild of an image environment"
pid=$(env_pid e3)
[[ $(awk '/^Uid:/ {print $2}' "/proc/$pid/status") == 1234 ]] || fail "rebuild: not the image's user"
[[ ! -e $dir/state/envs/e3/root/work/scratch ]] || fail "rebuild kept the upper layer"
ctl env destroy e3 >/dev/null
echo OK
