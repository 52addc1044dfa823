# SPDX-License-Identifier: MIT
"""The supervisor's wire protocol (the comment at the top of common/proto.h), bounded.

Every message is one SOCK_SEQPACKET packet holding one msgpack map: "v" (the protocol
version), "t" (the type), then the type's fields; fds travel beside it with SCM_RIGHTS.
Replies are decoded as strictly as the C decoder does: at most PROTO_MAX_MSG bytes, at most
PROTO_MAX_KEYS keys, no key twice, nothing after the map, every field of the expected type
and range, every required field present, the fd count exact. Anything else is a
ProtocolError; nothing here blocks, allocates without bound, or leaks an fd.
"""

from __future__ import annotations

import array
import errno
import os
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import msgpack  # type: ignore[import]  # Debian's python3-msgpack has no stubs

from .errors import ProtocolError

PROTO_VERSION = 1
PROTO_MAX_MSG = 65536
PROTO_MAX_STR = 255
PROTO_MAX_DEVICES = 16
PROTO_MAX_KEYS = 32
PROTO_UUID_LEN = 16
PROTO_EXEC_ARGV_MAX = 8192
PROTO_EXEC_ENVV_MAX = 8192
PROTO_EXEC_CHUNK_MAX = 16384
PROTO_PATH_MAX = 1024
ENV_FORK_MAX = 64
ENV_LIMIT_NONE = (1 << 64) - 1
ENV_FLAG_NEW_CKPT = 2  # a checkpoint even when nothing changed (common/proto.h)
EXEC_FLAG_STREAM = 1
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
I32 = (1 << 31) - 1

# Message types (enum proto_type).
ERROR = 4
CTL = 7
METRIC = 8
WORKER_INFO = 9
REGION_INFO = 10
CONFIG_ENTRY = 11
EVENT = 12
HEALTH_INFO = 13
END = 14
ENV_REQUEST = 30
ENV_INFO = 31
ENV_ITEM = 32
ENV_EXEC = 33
ENV_EXEC_OUT = 34
ENV_EXEC_DONE = 35
ENV_FILE_READ = 36
ENV_FILE_WRITE = 37
ENV_FILE_DATA = 38
IMAGE_REQUEST = 40
IMAGE_INFO = 41
TRAJ_STEP = 60
TRAJ_DECISION = 61
TRAJ_LIST = 62
TRAJ_INFO = 63

# enum ctl_cmd
CTL_STATUS, CTL_WORKERS, CTL_REGIONS, CTL_CONFIG, CTL_EVENTS, CTL_INJECT, CTL_HEALTH, CTL_PROMOTE = range(8)
# enum env_op
(OP_CREATE, OP_ADOPT, OP_CHECKPOINT, OP_RESTORE, OP_LIST, OP_DESTROY, OP_WATCH, OP_DIRTY, OP_LOG,
 OP_REBUILD, OP_FORK) = range(11)
# enum env_net
NET_NAMES = {"default": 0, "none": 1, "slirp": 2, "host": 3}
# enum image_op
IMAGE_LIST, IMAGE_IMPORT, IMAGE_RM, IMAGE_GC = range(4)
# enum traj_event, traj_action
STEP_BEGIN, STEP_END = 0, 1
ACTION_NAMES = ("none", "checkpoint", "checkpoint-sync")
EVENT_KIND_NAMES = (
    "worker-hello", "worker-exit", "region-announce", "region-release", "region-retained",
    "region-expired", "region-fetch", "refused", "health", "inject", "restored", "region-lost",
    "shadow-parked", "recovery", "engine", "nccl", "env",
)

# Field kinds of a reply's schema: (kind, lo, hi, optional).
#   "u": int lo..hi   "s": str of at most PROTO_MAX_STR bytes   "b": bin of lo..hi bytes
#   "uuids": array (<= PROTO_MAX_DEVICES) of bin[16]
_Spec = Tuple[str, int, int, bool]


def _u(hi: int = U64, lo: int = 0, opt: bool = False) -> _Spec:
    return ("u", lo, hi, opt)


_S: _Spec = ("s", 0, 0, False)
_OPT_S: _Spec = ("s", 0, 0, True)

# The replies a client reads, with the fields the C decoder requires (common/proto.c).
SCHEMAS: Dict[int, Dict[str, _Spec]] = {
    ERROR: {"code": _u(I32, 1), "re": _u(U32), "msg": _S},
    METRIC: {"name": _S, "lbl": _S, "kind": _u(2), "val": _u(), "help": _S,
             "scale": _u(U32, opt=True)},
    WORKER_INFO: {"pid": _u(U32), "uid": _u(U32), "eng": _S, "role": _u(1),
                  "rank": _u(I32, -1), "devs": ("uuids", 0, 0, False), "state": _u(2),
                  "nreg": _u(U32), "bytes": _u(), "ms": _u(), "lay": _u(opt=True),
                  "nlay": _u(U32, opt=True), "park": _u(1, opt=True),
                  "port": _u(65535, opt=True), "rdy": _u(1, opt=True)},
    EVENT: {"ts": _u(), "kind": _u(U32), "pid": _u(U32), "id": _u(),
            "msg": _S},
    END: {"re": _u(U32), "n": _u(U32)},
    ENV_INFO: {"env": _S, "ckpt": _S, "par": _S, "traj": _S, "turn": _u(), "plen": _u(),
               "phash": _u(), "pid": _u(U32), "nproc": _u(U32), "fsb": _u(), "fsn": _u(),
               "criub": _u(), "frz": _u(), "dump": _u(), "fs": _u(), "tot": _u(),
               "root": _S, "cg": _S, "full": _u(1), "net": _u(3, opt=True),
               "commit": _u(opt=True), "path": _OPT_S, "kind": _OPT_S, "mem": _OPT_S,
               "sdirty": _u(1, opt=True), "pcr": _u(opt=True), "pcb": _u(opt=True),
               "pcfb": _u(opt=True)},
    ENV_ITEM: {"kind": _S, "pid": _u(U32), "ts": _u(), "path": _S, "p2": _S, "txt": _S},
    ENV_EXEC_OUT: {"fd": _u(2, 1), "data": ("b", 1, PROTO_EXEC_CHUNK_MAX, False)},
    ENV_EXEC_DONE: {"code": _u(255, -1), "sig": _u(64), "tmo": _u(1), "trunc": _u(3),
                    "us": _u(), "nout": _u(), "nerr": _u(), "pid": _u(U32)},
    ENV_FILE_DATA: {"env": _S, "path": _S, "mode": _u(0o7777), "size": _u(), "uid": _u(U32),
                    "gid": _u(U32)},
    IMAGE_INFO: {"id": _S, "name": _S, "n": _u(U32), "unp": _u(), "cached": _u(), "ent": _u(),
                 "bytes": _u(), "us": _u()},
    TRAJ_DECISION: {"ev": _u(1), "traj": _S, "env": _S, "act": _u(2), "why": _S,
                    "bub": _u(), "berr": _u(U32), "cost": _u(), "cerr": _u(U32),
                    "held": _u(), "ckpt": _OPT_S, "ckus": _u(opt=True), "abrt": _u(1, opt=True)},
}
# The fds each reply carries.
NFDS: Dict[int, int] = {ENV_FILE_DATA: 1}
# Strings the C side keeps in longer buffers than PROTO_MAX_STR.
_STR_MAX: Dict[Tuple[int, str], int] = {
    (ENV_FILE_DATA, "path"): PROTO_PATH_MAX - 1,
    (ENV_ITEM, "path"): PROTO_PATH_MAX - 1,
    (ENV_ITEM, "p2"): PROTO_PATH_MAX - 1,
    (ENV_ITEM, "txt"): PROTO_PATH_MAX - 1,
}


@dataclass
class Message:
    """A decoded reply: its type, its fields (every schema field, optional ones 0 or "") and
    its fd (-1: none; the receiver owns it)."""

    type: int
    fields: Dict[str, Any]
    fd: int = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def encode(mtype: int, fields: Dict[str, Any]) -> bytes:
    """One request packet. The supervisor's decoder is the judge of ranges; sizes are checked
    here so an oversize request is refused before anything is sent."""
    m: Dict[str, Any] = {"v": PROTO_VERSION, "t": mtype}
    m.update(fields)
    data: bytes = msgpack.packb(m, use_bin_type=True)
    if len(data) > PROTO_MAX_MSG:
        raise ValueError(f"request of {len(data)} bytes exceeds the protocol's {PROTO_MAX_MSG}")
    return data


def check_str(name: str, s: str, limit: int = PROTO_MAX_STR) -> str:
    if not isinstance(s, str):
        raise TypeError(f"{name} must be a str, not {type(s).__name__}")
    b = s.encode()
    if len(b) > limit or "\0" in s:
        raise ValueError(f"{name} must be at most {limit} bytes without NUL: {s[:80]!r}")
    return s


def _no_dup_pairs(pairs: List[Tuple[Any, Any]]) -> Dict[Any, Any]:
    d: Dict[Any, Any] = {}
    for k, v in pairs:
        if k in d:
            raise ProtocolError(f"key {k!r} appears twice")
        d[k] = v
    return d


def _check(mtype: int, key: str, spec: _Spec, v: Any) -> Any:
    kind, lo, hi, _ = spec
    if kind == "u":
        if type(v) is not int or not lo <= v <= hi:
            raise ProtocolError(f"type {mtype} field {key!r}: {v!r} is not an integer in {lo}..{hi}")
    elif kind == "s":
        limit = _STR_MAX.get((mtype, key), PROTO_MAX_STR)
        if type(v) is not str or len(v.encode()) > limit or "\0" in v:
            raise ProtocolError(f"type {mtype} field {key!r}: not a str of at most {limit} bytes")
    elif kind == "b":
        if type(v) is not bytes or not lo <= len(v) <= hi:
            raise ProtocolError(f"type {mtype} field {key!r}: not a bin of {lo}..{hi} bytes")
    elif kind == "uuids":
        if type(v) is not list or len(v) > PROTO_MAX_DEVICES or any(
                type(u) is not bytes or len(u) != PROTO_UUID_LEN for u in v):
            raise ProtocolError(f"type {mtype} field {key!r}: not an array of 16-byte uuids")
    return v


def decode(data: bytes, fds: Sequence[int]) -> Message:
    """A reply packet and the fds that came with it. On any error every fd is closed and
    ProtocolError raised; on success the message owns its fd."""
    try:
        if len(data) > PROTO_MAX_MSG:
            raise ProtocolError(f"reply of {len(data)} bytes exceeds {PROTO_MAX_MSG}")
        if not data:
            raise ProtocolError("empty reply")
        try:
            m = msgpack.unpackb(
                data, raw=False, use_list=True, strict_map_key=False,
                object_pairs_hook=_no_dup_pairs,
                max_str_len=PROTO_PATH_MAX, max_bin_len=PROTO_EXEC_CHUNK_MAX,
                max_array_len=PROTO_MAX_DEVICES, max_map_len=PROTO_MAX_KEYS, max_ext_len=0)
        except ProtocolError:
            raise
        except Exception as e:  # msgpack raises several types; all mean a bad packet
            raise ProtocolError(f"undecodable reply: {type(e).__name__}: {e}") from None
        if not isinstance(m, dict):
            raise ProtocolError(f"reply is a {type(m).__name__}, not a map")
        v = m.get("v")
        if type(v) is not int:
            raise ProtocolError("reply without a protocol version")
        if v != PROTO_VERSION:
            raise ProtocolError(f"protocol version {v} (this client speaks {PROTO_VERSION})",
                                errno.EPROTONOSUPPORT)
        t = m.get("t")
        schema = SCHEMAS.get(t) if type(t) is int else None
        if schema is None or not isinstance(t, int):
            raise ProtocolError(f"unexpected reply type {t!r}")
        fields: Dict[str, Any] = {}
        for key, spec in schema.items():
            if key in m:
                fields[key] = _check(t, key, spec, m[key])
            elif spec[3]:
                fields[key] = "" if spec[0] == "s" else 0
            else:
                raise ProtocolError(f"type {t} misses field {key!r}")
        if len(fds) != NFDS.get(t, 0):
            raise ProtocolError(f"type {t} came with {len(fds)} fds, expected {NFDS.get(t, 0)}")
        msg = Message(t, fields, fds[0] if fds else -1)
        fds = ()
        return msg
    finally:
        for fd in fds:
            os.close(fd)


# SCM_RIGHTS room for a few more fds than any reply carries, so extra ones are seen (and
# closed) rather than silently cut (MSG_CTRUNC is an error too).
_CMSG_ROOM = socket.CMSG_SPACE(4 * 4)
RECV_SIZE = PROTO_MAX_MSG + 1


def unpack_recvmsg(data: bytes, ancdata: List[Tuple[int, int, bytes]], flags: int) -> Message:
    """Decode what one socket.recvmsg() returned."""
    fds: List[int] = []
    for level, ctype, cdata in ancdata:
        if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(cdata[: len(cdata) - len(cdata) % a.itemsize])
            fds.extend(a)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ProtocolError("reply truncated (oversize packet or too many fds)")
    return decode(data, fds)


def recv_args() -> Tuple[int, int, int]:
    return RECV_SIZE, _CMSG_ROOM, getattr(socket, "MSG_CMSG_CLOEXEC", 0)


def ancillary(fds: Sequence[int]) -> List[Tuple[int, int, bytes]]:
    if not fds:
        return []
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


def memfd_with(data: bytes, name: str = "belayer") -> int:
    """A memfd holding data at offset 0 (the form exec's stdin and write's content take)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, size: int, limit: int) -> bytes:
    """At most min(size, limit) bytes of fd from offset 0 (a FILE_DATA's sealed memfd)."""
    want = min(size, limit)
    out = bytearray()
    while len(out) < want:
        chunk = os.pread(fd, min(1 << 20, want - len(out)), len(out))
        if not chunk:
            break
        out += chunk
    if len(out) != size:
        raise ProtocolError(f"file content of {len(out)} bytes where the reply said {size}")
    return bytes(out)


def error_for(m: Message) -> Optional[Exception]:
    from .errors import SupervisorError

    if m.type != ERROR:
        return None
    return SupervisorError(m.fields["code"], m.fields["msg"], m.fields["re"])
