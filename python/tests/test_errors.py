# SPDX-License-Identifier: MIT
"""Error paths: the supervisor gone mid-call, malformed replies from a fake supervisor,
timeouts (the async ones without blocking the loop), and no fd leaked by any of them."""

from __future__ import annotations

import array
import asyncio
import errno
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import msgpack
import pytest

import belayer
from conftest import UNIFIED, Supervisor


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class FakeSupervisor:
    """A SOCK_SEQPACKET server answering each connection's first request with the packets
    (and fds) of reply(request); None: never answer (hold the connection)."""

    def __init__(self, reply: Callable[[dict], Optional[List[Tuple[bytes, List[int]]]]]) -> None:
        self.dir = tempfile.mkdtemp(prefix="belayer-fake.")
        self.path = os.path.join(self.dir, "sv.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.srv.bind(self.path)
        self.srv.listen(8)
        self.reply = reply
        self.held: List[socket.socket] = []
        self.requests: List[dict] = []
        # Connections accepted and not yet closed: the fds the tests count are the whole
        # process's, the server's included.
        self.busy = 0
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            with self.cond:
                self.busy += 1
            data, anc, _, _ = c.recvmsg(70000, socket.CMSG_SPACE(16))
            for _, _, cdata in anc:
                for fd in array.array("i", cdata):
                    os.close(fd)
            req = msgpack.unpackb(data)
            self.requests.append(req)
            packets = self.reply(req)
            if packets is None:
                self.held.append(c)
                continue
            for p, fds in packets:
                anc_out = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
                c.sendmsg([p], anc_out)
            c.close()
            with self.cond:
                self.busy -= 1
                self.cond.notify_all()

    def idle(self) -> None:
        """Every answered connection closed (held ones aside)."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.busy == len(self.held), 10)

    def close(self) -> None:
        self.srv.close()
        for c in self.held:
            c.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


def pk(t: int, **f) -> bytes:
    return msgpack.packb({"v": 1, "t": t, **f}, use_bin_type=True)


END_OK = {"re": 7, "n": 0}
INFO = dict(env="e", ckpt="", par="", traj="", turn=0, plen=0, phash=0, pid=1, nproc=1, fsb=0,
            fsn=0, criub=0, frz=0, dump=0, fs=0, tot=0, root="/r", cg="/c", full=0)

MALFORMED = {
    "not msgpack": b"\xc1\xc1\xc1",
    "truncated msgpack": pk(14, **END_OK)[:-2],
    "not a map": msgpack.packb([1, 2, 3]),
    "no version": msgpack.packb({"t": 14, **END_OK}),
    "wrong version": pk(14, **END_OK).replace(b"\xa1v\x01", b"\xa1v\x02"),
    "unknown type": pk(99, **END_OK),
    "string where int": pk(14, re="7", n=0),
    "out of range": pk(14, re=7, n=1 << 40),
    "negative": pk(14, re=-1, n=0),
    "missing field": pk(14, re=7),
    "bool for int": pk(14, re=True, n=0),
    "trailing bytes": pk(14, **END_OK) + b"\x00",
    "duplicate key": b"\x85\xa1v\x01\xa1t\x0e\xa2re\x07\xa2re\x07\xa1n\x00",
    "oversize string": pk(8, name="x" * 300, lbl="", kind=0, val=0, help=""),
    "oversize packet": pk(8, name="x", lbl="", kind=0, val=0, help="", pad=b"\0" * 70000),
    "huge array header": b"\x83\xa1v\x01\xa1t\x0e\xa2re\xdd\xff\xff\xff\xff",
    "too many keys": msgpack.packb({"v": 1, "t": 14, "re": 7, "n": 0,
                                    **{f"k{i}": 0 for i in range(40)}}),
    "bad enum": pk(8, name="x", lbl="", kind=9, val=0, help=""),
    "info str type": pk(31, **{**INFO, "env": 5}),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_reply_raises_protocol_error(name: str) -> None:
    fake = FakeSupervisor(lambda req: [(MALFORMED[name], [])])
    try:
        before = open_fds()
        with pytest.raises(belayer.ProtocolError):
            belayer.Client(fake.path, timeout=5).status()

        async def a() -> None:
            with pytest.raises(belayer.ProtocolError):
                await belayer.AsyncClient(fake.path, timeout=5).status()

        asyncio.run(a())
        fake.idle()
        assert open_fds() == before
    finally:
        fake.close()


def test_unexpected_fds_are_closed() -> None:
    r, w = os.pipe()
    os.close(w)
    # An END carrying an fd it should not, and a FILE_DATA without its fd.
    replies = iter([[(pk(14, **END_OK), [r])],
                    [(pk(38, env="e", path="/p", mode=0o644, size=0, uid=0, gid=0), [])]])
    fake = FakeSupervisor(lambda req: next(replies))
    try:
        before = open_fds()
        c = belayer.Client(fake.path, timeout=5)
        with pytest.raises(belayer.ProtocolError, match="fds"):
            c.status()
        with pytest.raises(belayer.ProtocolError, match="fds"):
            c.read("e", "/p")
        fake.idle()
        assert open_fds() == before
    finally:
        os.close(r)
        fake.close()


def test_requests_are_what_belayerctl_sends() -> None:
    fake = FakeSupervisor(lambda req: [(pk(4, code=1, re=req["t"], msg="no"), [])])
    try:
        c = belayer.Client(fake.path, timeout=5)
        with pytest.raises(belayer.SupervisorError) as e:
            c.checkpoint("e1", 3, 40, 1 << 63, trajectory="t")
        assert e.value.errno == 1 and e.value.supervisor_message == "no"
        assert e.value.in_reply_to == 30
        with pytest.raises(belayer.SupervisorError):
            c.fork("e1", "f", count=3)
        with pytest.raises(belayer.SupervisorError):
            c.promote("eng0")
        with pytest.raises(belayer.SupervisorError):
            c.import_image("oci:rel/dir:tag", "n")
        with pytest.raises(belayer.SupervisorError):
            c.create("e2", image="docker-archive:a.tar", limits=belayer.Limits(disk=1 << 20))
        q = fake.requests
        assert q[3] == {"v": 1, "t": 40, "op": 1, "ref": "oci:" + os.path.abspath("rel/dir:tag"),
                        "name": "n"}
        assert q[4]["img"] == "docker-archive:" + os.path.abspath("a.tar") and "root" not in q[4]
        assert q[4]["disk"] == 1 << 20
        assert q[0] == {"v": 1, "t": 30, "op": 2, "env": "e1", "turn": 3, "plen": 40,
                        "phash": 1 << 63, "traj": "t"}
        assert q[1] == {"v": 1, "t": 30, "op": 10, "env": "e1", "dst": "f", "n": 3, "ckpt": ""}
        assert q[2] == {"v": 1, "t": 7, "cmd": 7, "pid": 0, "act": 0, "dev": -1, "arg": 0,
                        "eng": "eng0"}
    finally:
        fake.close()


def test_file_data_fd_is_read_and_closed() -> None:
    content = b"hello\x00world"
    fd = os.memfd_create("t")
    os.write(fd, content)
    fake = FakeSupervisor(lambda req: [(pk(38, env="e", path="/p", mode=0o640, size=len(content),
                                           uid=1, gid=2), [fd])])
    try:
        before = open_fds()
        f = belayer.Client(fake.path, timeout=5).read_file("e", "/p")
        assert (f.data, f.mode, f.uid, f.gid) == (content, 0o640, 1, 2)
        fake.idle()
        assert open_fds() == before
    finally:
        os.close(fd)
        fake.close()


def test_timeouts_sync_and_async_without_blocking_the_loop() -> None:
    fake = FakeSupervisor(lambda req: None)  # never answers
    try:
        t0 = time.monotonic()
        with pytest.raises(belayer.Timeout):
            belayer.Client(fake.path, timeout=30).status(timeout=0.3)
        assert 0.25 < time.monotonic() - t0 < 3

        async def a() -> None:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            t = asyncio.create_task(ticker())
            t0 = time.monotonic()
            with pytest.raises(belayer.Timeout):
                await belayer.AsyncClient(fake.path).status(timeout=0.5)
            assert 0.45 < time.monotonic() - t0 < 3
            t.cancel()
            assert ticks >= 20, f"event loop blocked: {ticks} ticks"

        asyncio.run(a())
    finally:
        fake.close()


def test_no_supervisor() -> None:
    with pytest.raises(belayer.ConnectionLost):
        belayer.Client("/nonexistent/sv.sock", timeout=1).status()

    async def a() -> None:
        with pytest.raises(belayer.ConnectionLost):
            await belayer.AsyncClient("/nonexistent/sv.sock", timeout=1).status()

    asyncio.run(a())


@pytest.fixture
def own_supervisor() -> Iterator[Supervisor]:
    binary = os.environ["BELAYER_SUPERVISOR"]
    tmp = Path(tempfile.mkdtemp(prefix="belayer-pytest-kill."))
    sv = Supervisor(binary, tmp, UNIFIED / f"belayer-pytest-kill-{os.getpid()}")
    try:
        sv.start()
        yield sv
    finally:
        sv.cleanup()


def test_supervisor_gone_mid_exec(own_supervisor: Supervisor) -> None:
    sv = own_supervisor
    c = belayer.Client(sv.sock, timeout=30)
    c.create("py-gone", root=str(sv.base))
    threading.Timer(0.5, sv.kill).start()
    t0 = time.monotonic()
    with pytest.raises(belayer.ConnectionLost):
        c.exec("py-gone", "sleep 20", timeout=30)
    assert time.monotonic() - t0 < 10

    sv.start()
    ac = belayer.AsyncClient(sv.sock, timeout=30)

    async def a() -> None:
        await ac.create("py-gone-a", root=str(sv.base))
        asyncio.get_running_loop().call_later(0.5, sv.kill)
        with pytest.raises(belayer.ConnectionLost):
            await ac.exec("py-gone", "sleep 20", timeout=30)

    asyncio.run(a())


def test_event_stream_live_events_without_idle_timeout() -> None:
    ev = dict(ts=5, id=1, pid=2, msg="m")
    fake = FakeSupervisor(lambda req: [(pk(12, kind=16, **ev), []), (pk(14, re=7, n=1), []),
                                       (pk(12, kind=99, **ev), [])])
    try:
        it = belayer.Client(fake.path, timeout=5).events(replay=1)
        try:
            assert next(it).kind == "env"  # replayed
            live = next(it)  # after END: no deadline
            assert (live.kind, live.ts_us, live.message) == ("kind-99", 5, "m")
            with pytest.raises(belayer.ConnectionLost):
                next(it)  # the fake closed the stream
        finally:
            it.close()
        assert fake.requests[0]["cmd"] == 4 and fake.requests[0]["arg"] == 1

        async def a() -> None:
            it = belayer.AsyncClient(fake.path, timeout=5).events(replay=1)
            try:
                assert (await it.__anext__()).kind == "env"
                assert (await it.__anext__()).kind == "kind-99"
                with pytest.raises(belayer.ConnectionLost):
                    await it.__anext__()
            finally:
                await it.aclose()

        asyncio.run(a())
    finally:
        fake.close()


def test_busy_environment_is_waited_for() -> None:
    """EBUSY (the environment runs another job: a checkpoint committing after the thaw) is
    retried until the call's timeout, sync and async; other errors and busy_wait=False are
    raised at once; a refusal that outlasts the timeout is raised as the EBUSY it is."""
    refusals = {"n": 3}

    def reply(req: dict) -> Optional[List[Tuple[bytes, List[int]]]]:
        if req["env"] == "always" or refusals["n"] > 0:
            refusals["n"] -= 1
            return [(pk(4, code=errno.EBUSY, re=req["t"], msg=f"{req['env']} is busy"), [])]
        return [(pk(14, re=req["t"], n=0), [])]

    fake = FakeSupervisor(reply)
    try:
        c = belayer.Client(fake.path, timeout=5)
        c.destroy("e1")
        assert len(fake.requests) == 4 and refusals["n"] == 0

        refusals["n"] = 1
        with pytest.raises(belayer.SupervisorError) as e:
            belayer.Client(fake.path, timeout=5, busy_wait=False).destroy("e1")
        assert e.value.errno == errno.EBUSY and len(fake.requests) == 5

        t0 = time.monotonic()
        with pytest.raises(belayer.SupervisorError) as e:
            c.destroy("always", timeout=0.5)
        assert e.value.errno == errno.EBUSY and 0.2 < time.monotonic() - t0 < 3

        async def a() -> None:
            refusals["n"] = 2
            n0 = len(fake.requests)
            await belayer.AsyncClient(fake.path, timeout=5).destroy("e2")
            assert len(fake.requests) == n0 + 3

        asyncio.run(a())
        fake.idle()
    finally:
        fake.close()
