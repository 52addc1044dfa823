# SPDX-License-Identifier: MIT
"""Every request as an I/O-free conversation, shared by the sync and asyncio clients.

An operation is a generator: it yields Send(packet, fds) to have a packet sent and RECV to
have the next reply decoded and sent back into it, and returns the call's result. The sync
client drives it with blocking calls under a deadline, the async one with the event loop.
A PROTO_ERROR reply raises SupervisorError wherever it comes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Dict, Generator, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

from . import _proto as P
from .errors import ProtocolError
from .types import (Decision, Event, ExecResult, FileData, Image, Limits, Manifest, Metric,
                    Worker)


@dataclass
class Send:
    data: bytes
    fds: Sequence[int] = ()


RECV = object()
T = TypeVar("T")
# yields Send or RECV, is sent None or the decoded reply, returns the call's result
Op = Generator[Any, Any, T]

# An exec's reply comes after the command: the call waits this much longer than its timeout.
EXEC_MARGIN_S = 10.0
# The supervisor's own default exec timeout (tmo 0), for the call's deadline.
EXEC_DEFAULT_S = 60.0
# No list reply is longer (environments, checkpoints, metrics, images...).
ITEMS_MAX = 1 << 20
# No stream of an exec reply is longer than this (the supervisor's own "max" is far lower).
EXEC_OUTPUT_BOUND = 256 << 20


def _reply(expect: Sequence[int]) -> Op[P.Message]:
    m: P.Message = yield RECV
    err = P.error_for(m)
    if err is not None:
        raise err
    if m.type not in expect:
        m.close()
        raise ProtocolError(f"reply type {m.type} where {list(expect)} was expected")
    return m


def _items(request: bytes, item: int, reply_to: int) -> Op[List[Dict[str, Any]]]:
    """Send request, collect item messages until PROTO_END."""
    yield Send(request)
    out: List[Dict[str, Any]] = []
    while True:
        m = yield from _reply((item, P.END))
        if len(out) >= ITEMS_MAX:
            raise ProtocolError(f"more than {ITEMS_MAX} items in one reply")
        if m.type == P.END:
            if m.fields["re"] != reply_to:
                raise ProtocolError(f"END answers type {m.fields['re']}, not {reply_to}")
            return out
        out.append(m.fields)


def check_env_id(env: str) -> str:
    P.check_str("environment id", env, 63)
    if not env or env.startswith(".") or any(
            not (c.isascii() and (c.isalnum() or c in "_.-")) for c in env):
        raise ValueError(f"bad environment id {env!r}: [A-Za-z0-9_.-], 1..63, not starting with '.'")
    return env


def _env_request(op: int, env: str, **kw: Any) -> bytes:
    f: Dict[str, Any] = {"op": op, "env": env}
    f.update({k: v for k, v in kw.items() if v is not None})
    for k in ("root", "cmd", "cg", "ckpt", "traj", "dst", "img"):
        if k in f:
            P.check_str(k, f[k])
    return P.encode(P.ENV_REQUEST, f)


def _limit(v: Optional[int]) -> int:
    if v is None:
        return 0
    if not 0 < v <= P.U64:
        raise ValueError(f"limit {v} out of range (None: the default, Limits.NO_LIMIT: none)")
    return v


def image_ref(ref: str) -> str:
    """oci:DIR and docker-archive:FILE made absolute (the supervisor resolves nothing against
    the client's directory), as belayerctl does; a stored image's name or id as it is."""
    for t in ("oci:", "docker-archive:"):
        if ref.startswith(t) and len(ref) > len(t) and ref[len(t)] != "/":
            return t + os.path.abspath(ref[len(t):])
    return ref


def create(env: str, root: Optional[str], image: Optional[str], cmd: str,
           limits: Optional[Limits], net: Optional[str]) -> Op[Manifest]:
    check_env_id(env)
    if (root is None) == (image is None):
        raise ValueError("create needs root= (a base directory) or image= (a container image)")
    lim = limits or Limits()
    if net is not None and net not in P.NET_NAMES:
        raise ValueError(f"net must be one of {sorted(P.NET_NAMES)}")
    req = _env_request(P.OP_CREATE, env, root=root, img=image_ref(image) if image else None,
                       cmd=cmd, pids=_limit(lim.pids), mem=_limit(lim.memory),
                       cpu=_limit(lim.cpu_millis), net=P.NET_NAMES[net] if net else 0,
                       disk=_limit(lim.disk))
    infos = yield from _items(req, P.ENV_INFO, P.ENV_REQUEST)
    if len(infos) != 1:
        raise ProtocolError(f"create answered {len(infos)} environments")
    return Manifest._from(infos[0])


def image_request(op: int, ref: str = "", name: str = "") -> Op[List[Image]]:
    f: Dict[str, Any] = {"op": op}
    if ref:
        f["ref"] = P.check_str("image", image_ref(ref))
    if name:
        f["name"] = P.check_str("name", name)
    infos = yield from _items(P.encode(P.IMAGE_REQUEST, f), P.IMAGE_INFO, P.IMAGE_REQUEST)
    return [Image._from(i) for i in infos]


def image_gc() -> Op[int]:
    yield Send(P.encode(P.IMAGE_REQUEST, {"op": P.IMAGE_GC}))
    m = yield from _reply((P.END,))
    n: int = m.fields["n"]
    return n


def manifests(op: int, env: str, **kw: Any) -> Op[List[Manifest]]:
    if env:
        check_env_id(env)
    infos = yield from _items(_env_request(op, env, **kw), P.ENV_INFO, P.ENV_REQUEST)
    return [Manifest._from(f) for f in infos]


def one_manifest(op: int, env: str, **kw: Any) -> Op[Manifest]:
    ms = yield from manifests(op, env, **kw)
    if len(ms) != 1:
        raise ProtocolError(f"expected one manifest, got {len(ms)}")
    return ms[0]


def checkpoint(env: str, turn: int, prefix_tokens: int, prefix_hash: int, trajectory: str,
               new: bool = False) -> Op[Manifest]:
    for name, v in (("turn", turn), ("prefix_tokens", prefix_tokens), ("prefix_hash", prefix_hash)):
        if type(v) is not int or not 0 <= v <= P.U64:
            raise ValueError(f"{name} must be an int in 0..2^64-1")
    return (yield from one_manifest(P.OP_CHECKPOINT, env, turn=turn, plen=prefix_tokens,
                                    phash=prefix_hash, traj=trajectory,
                                    fl=P.ENV_FLAG_NEW_CKPT if new else None))


def restore(env: str, ckpt: Optional[str]) -> Op[Manifest]:
    return (yield from one_manifest(P.OP_RESTORE, env, ckpt=ckpt or ""))


def fork(env: str, dst: str, count: int, ckpt: Optional[str]) -> Op[List[Manifest]]:
    check_env_id(dst)
    if not 1 <= count <= P.ENV_FORK_MAX:
        raise ValueError(f"count must be 1..{P.ENV_FORK_MAX}")
    ms = yield from manifests(P.OP_FORK, env, dst=dst, n=count, ckpt=ckpt or "")
    if len(ms) != count:
        raise ProtocolError(f"fork of {count} answered {len(ms)} environments")
    return ms


def destroy(env: str) -> Op[None]:
    yield from manifests(P.OP_DESTROY, env)


def _argv(cmd: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("cmd must be a shell string or a non-empty list of str")
    return argv


def _strv(name: str, v: List[str], cap: int) -> List[str]:
    if len(v) > 256 or sum(len(s.encode()) + 1 for s in v) > cap or any("\0" in s for s in v):
        raise ValueError(f"{name}: at most 256 strings, {cap} bytes with a NUL each, no NUL inside")
    return v


# An environment runs one job at a time (a checkpoint the policy took in an inference bubble
# goes on committing after the thaw): meanwhile its operations are refused with EBUSY, before
# anything was done. The clients retry those (busy_wait, the default) until the call's timeout,
# pausing BUSY_PAUSE_S, doubled up to BUSY_PAUSE_MAX_S.
BUSY_PAUSE_S = 0.01
BUSY_PAUSE_MAX_S = 0.2


def busy_pauses(deadline: float) -> Iterator[float]:
    """The pauses before each retry of a refused (EBUSY) operation, while deadline (a
    time.monotonic() value) leaves room for one."""
    pause = BUSY_PAUSE_S
    while time.monotonic() + pause < deadline:
        yield pause
        pause = min(pause * 2, BUSY_PAUSE_MAX_S)


def exec_timeout_s(timeout: Optional[float]) -> float:
    return (timeout if timeout else EXEC_DEFAULT_S) + EXEC_MARGIN_S


def exec_(env: str, cmd: Union[str, Sequence[str]], timeout: Optional[float],
          cwd: str, envv: Optional[Mapping[str, str]], user: str,
          stdin: Union[bytes, str, None], max_output: int) -> Op[ExecResult]:
    check_env_id(env)
    argv = _strv("argv", _argv(cmd), P.PROTO_EXEC_ARGV_MAX)
    ev = _strv("env", [f"{k}={v}" for k, v in (envv or {}).items()], P.PROTO_EXEC_ENVV_MAX)
    P.check_str("cwd", cwd, P.PROTO_PATH_MAX - 1)
    P.check_str("user", user, 63)
    tmo = int(round(timeout * 1000)) if timeout else 0
    if not 0 <= tmo <= P.U32 or not 0 <= max_output <= P.U32:
        raise ValueError("timeout or max_output out of range")
    req = P.encode(P.ENV_EXEC, {"env": env, "argv": argv, "envv": ev, "cwd": cwd, "user": user,
                                "tmo": tmo, "max": max_output, "fl": 0})
    data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
    fd = P.memfd_with(data, "belayer-stdin")
    try:
        yield Send(req, (fd,))
    finally:
        os.close(fd)
    out = [bytearray(), bytearray()]
    while True:
        m = yield from _reply((P.ENV_EXEC_OUT, P.ENV_EXEC_DONE))
        f = m.fields
        if m.type == P.ENV_EXEC_OUT:
            buf = out[f["fd"] - 1]
            # The supervisor keeps at most "max" bytes per stream; far more is a broken peer.
            if len(buf) + len(f["data"]) > EXEC_OUTPUT_BOUND:
                raise ProtocolError("exec output beyond any bound")
            buf += f["data"]
            continue
        return ExecResult(bytes(out[0]), bytes(out[1]), f["code"], f["sig"], bool(f["tmo"]),
                          bool(f["trunc"] & 1), bool(f["trunc"] & 2), f["nout"], f["nerr"],
                          f["us"], f["pid"])


def file_read(env: str, path: str, max_bytes: int) -> Op[FileData]:
    check_env_id(env)
    P.check_str("path", path, P.PROTO_PATH_MAX - 1)
    if not 0 <= max_bytes <= P.U64:
        raise ValueError("max out of range")
    yield Send(P.encode(P.ENV_FILE_READ, {"env": env, "path": path, "max": max_bytes}))
    m = yield from _reply((P.ENV_FILE_DATA,))
    try:
        f = m.fields
        # The supervisor refuses more than 256 MiB; its default bound applies when max is 0.
        data = P.read_fd(m.fd, f["size"], max_bytes if max_bytes else (256 << 20))
        return FileData(data, f["mode"], f["uid"], f["gid"])
    finally:
        m.close()


def file_write(env: str, path: str, data: Union[bytes, str], mode: int, user: str) -> Op[int]:
    check_env_id(env)
    P.check_str("path", path, P.PROTO_PATH_MAX - 1)
    P.check_str("user", user, 63)
    if not 0 <= mode <= 0o7777:
        raise ValueError("mode must be 0..0o7777")
    req = P.encode(P.ENV_FILE_WRITE, {"env": env, "path": path, "mode": mode, "user": user})
    fd = P.memfd_with(data.encode() if isinstance(data, str) else bytes(data), "belayer-write")
    try:
        yield Send(req, (fd,))
    finally:
        os.close(fd)
    m = yield from _reply((P.END,))
    n: int = m.fields["n"]
    return n


def step(ev: int, trajectory: str, env: str, turn: int, prompt_tokens: int,
         generated_tokens: int, decode_mtps: int, output_tokens: int,
         prefix_tokens: int = 0, prefix_hash: int = 0) -> Op[Decision]:
    P.check_str("trajectory", trajectory)
    if not trajectory:
        raise ValueError("trajectory must not be empty")
    check_env_id(env)
    f = {"ev": ev, "traj": trajectory, "env": env, "turn": turn, "plen": prompt_tokens,
         "gen": generated_tokens, "mtps": decode_mtps, "out": output_tokens,
         "pfx": prefix_tokens, "phash": prefix_hash}
    for k in ("turn", "plen", "gen", "mtps", "out", "pfx", "phash"):
        v = f[k]
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= P.U64:
            raise ValueError(f"{k} must be an int in 0..2^64-1")
    yield Send(P.encode(P.TRAJ_STEP, f))
    m = yield from _reply((P.TRAJ_DECISION,))
    return Decision._from(m.fields)


def ctl_request(cmd: int, arg: int = 0, engine: str = "") -> bytes:
    return P.encode(P.CTL, {"cmd": cmd, "pid": 0, "act": 0, "dev": -1, "arg": arg,
                            "eng": P.check_str("engine", engine)})


def status() -> Op[List[Metric]]:
    items = yield from _items(ctl_request(P.CTL_STATUS), P.METRIC, P.CTL)
    return [Metric._from(f) for f in items]


def workers() -> Op[List[Worker]]:
    items = yield from _items(ctl_request(P.CTL_WORKERS), P.WORKER_INFO, P.CTL)
    return [Worker._from(f) for f in items]


def promote(engine: str) -> Op[None]:
    if not engine:
        raise ValueError("promote needs an engine id")
    yield Send(ctl_request(P.CTL_PROMOTE, engine=engine))
    yield from _reply((P.END,))


def subscribe(replay: int) -> Op[List[Event]]:
    """Subscribe to events; returns the replayed ones (live ones follow, read by the caller
    with event_of)."""
    items = yield from _items(ctl_request(P.CTL_EVENTS, arg=replay), P.EVENT, P.CTL)
    return [Event._from(f) for f in items]


def event_of(m: P.Message) -> Event:
    err = P.error_for(m)
    if err is not None:
        raise err
    if m.type != P.EVENT:
        m.close()
        raise ProtocolError(f"reply type {m.type} in the event stream")
    return Event._from(m.fields)
