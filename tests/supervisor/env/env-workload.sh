#!/bin/sh
# SPDX-License-Identifier: MIT
# What an agent runs in an environment must still run under its sandbox (issue 19: the seccomp
# allow-list): the host's own programs (the environment sees the host's /usr and /etc), one line
# each, "NAME ok" or "NAME FAILED", then "workload N failed". Usage: env-workload.sh DIR
cd "$1" || exit 1
rm -rf wl && mkdir wl && cd wl || exit 1
failed=0
check() {
	name=$1
	shift
	if "$@" >"$name.out" 2>&1; then
		echo "$name ok"
	else
		echo "$name FAILED: $(tail -3 "$name.out" | tr '\n' ' ')"
		failed=$((failed + 1))
	fi
}
check bash bash -c 'x=$(echo sub | tr a-z A-Z); [ "$x" = SUB ] && (exit 0) & wait $!'
check dash dash -c 'echo a | while read -r l; do [ "$l" = a ]; done'
check python3 python3 -c '
import asyncio, multiprocessing, socket, subprocess, threading
assert subprocess.run(["echo", "x"], capture_output=True).stdout == b"x\n"
out = []
ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
assert sorted(out) == list(range(8))
async def main():
    p = await asyncio.create_subprocess_exec("true")
    assert await p.wait() == 0
    srv = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    _, w = await asyncio.open_connection("127.0.0.1", port); w.close(); srv.close()
asyncio.run(main())
with multiprocessing.Pool(2) as pool:
    assert pool.map(abs, [-1, -2]) == [1, 2]
socket.socket(socket.AF_INET6).close()
'
check git sh -c 'git init -q r && cd r && echo a >a && git add a &&
	git -c user.name=n -c user.email=n@e commit -qm m && git log --oneline | grep -q m'
printf 'all: t\n\t./t\nt: t.c\n\tcc -o t t.c\n' >Makefile
printf 'int main(void) { return 0; }\n' >t.c
if command -v cc >/dev/null; then check make_gcc make; else check make make -v; fi
printf 'import subprocess\ndef test_sub():\n    assert subprocess.call(["true"]) == 0\n' >test_wl.py
if python3 -c 'import pytest' 2>/dev/null; then check pytest python3 -m pytest -q -p no:cacheprovider test_wl.py; fi
echo "workload $failed failed"
