# SPDX-License-Identifier: MIT
"""What the clients return (plain dataclasses, built from decoded replies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ._proto import ACTION_NAMES, EVENT_KIND_NAMES, NET_NAMES

_NET_BY_NUM = {v: k for k, v in NET_NAMES.items()}


@dataclass(frozen=True)
class Limits:
    """An environment's resource limits at create. None: the configured default;
    NO_LIMIT: none at all."""

    pids: Optional[int] = None
    memory: Optional[int] = None  # bytes
    cpu_millis: Optional[int] = None  # thousandths of a CPU
    disk: Optional[int] = None  # bytes of the writable layer

    NO_LIMIT = (1 << 64) - 1


@dataclass(frozen=True)
class ExecResult:
    """How a command ended. exit_code is -1 when it died of a signal (signal then says which)
    or timed out (timed_out; its process group was killed)."""

    stdout: bytes
    stderr: bytes
    exit_code: int
    signal: int
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_bytes: int  # the stream's whole size, kept or not
    stderr_bytes: int
    wall_us: int
    pid: int

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.signal and not self.timed_out

    @property
    def status(self) -> int:
        """A shell's view: 124 for a timeout, 128 + N for signal N, else the exit code."""
        return 124 if self.timed_out else 128 + self.signal if self.signal else self.exit_code


@dataclass(frozen=True)
class Manifest:
    """An environment (list, create, fork) or a checkpoint's manifest (checkpoint, restore,
    checkpoints): PROTO_ENV_INFO. Sizes in bytes, times in µs."""

    env: str
    checkpoint: str
    parent: str
    trajectory: str
    turn: int
    prefix_tokens: int
    prefix_hash: int
    pid: int
    nproc: int
    fs_bytes: int
    fs_files: int
    criu_bytes: int
    freeze_us: int
    dump_us: int
    fs_us: int
    total_us: int
    root: str
    cgroup: str
    full_diff: bool
    net: str
    # A checkpoint's kind (issue 23 item 3): "full", "fs-only" (the processes' images of the
    # last full one: none of them ran since) or "skipped" (nothing changed: no checkpoint was
    # taken, checkpoint is the head's); "" for an environment.
    kind: str = ""
    # An environment's memory checkpoint mode ("full": every dump copies all memory) and
    # whether the kernel tracks soft-dirty pages (what a "pre-dump" mode needs).
    memory_mode: str = ""
    soft_dirty: bool = False
    commit_us: int = 0
    path: str = ""
    # A pre-copied checkpoint (issue 23 item 2): the rounds that copied its delta while the
    # environment ran, the bytes they copied, the bytes copied again frozen (0: not pre-copied).
    precopy_rounds: int = 0
    precopy_bytes: int = 0
    precopy_frozen_bytes: int = 0

    @classmethod
    def _from(cls, f: Dict[str, Any]) -> "Manifest":
        return cls(f["env"], f["ckpt"], f["par"], f["traj"], f["turn"], f["plen"], f["phash"],
                   f["pid"], f["nproc"], f["fsb"], f["fsn"], f["criub"], f["frz"], f["dump"],
                   f["fs"], f["tot"], f["root"], f["cg"], bool(f["full"]),
                   _NET_BY_NUM.get(f["net"], "default"), f.get("kind", ""), f.get("mem", ""),
                   bool(f.get("sdirty", 0)), f.get("commit", 0), f.get("path", ""),
                   f.get("pcr", 0), f.get("pcb", 0), f.get("pcfb", 0))


EnvInfo = Manifest


@dataclass(frozen=True)
class Decision:
    """The checkpoint policy's answer to a step (PROTO_TRAJ_DECISION). action: "none",
    "checkpoint" (in the bubble) or "checkpoint-sync" (the next action waits for it).
    held_us: how long a step-begin's reply waited for a running checkpoint. checkpoint: on a
    step-begin, the policy's checkpoint of the bubble that just ended ("" none)."""

    event: str
    trajectory: str
    env: str
    action: str
    why: str
    bubble_us: int
    bubble_err_pm: int
    cost_us: int
    cost_err_pm: int
    held_us: int
    checkpoint: str
    checkpoint_us: int
    aborted: bool

    @classmethod
    def _from(cls, f: Dict[str, Any]) -> "Decision":
        return cls("begin" if f["ev"] == 0 else "end", f["traj"], f["env"],
                   ACTION_NAMES[f["act"]], f["why"], f["bub"], f["berr"], f["cost"],
                   f["cerr"], f["held"], f["ckpt"], f["ckus"], bool(f["abrt"]))


@dataclass(frozen=True)
class Metric:
    """One series of the supervisor's metrics (status())."""

    name: str
    labels: str
    kind: str
    value: int
    help: str
    scale: int

    @classmethod
    def _from(cls, f: Dict[str, Any]) -> "Metric":
        return cls(f["name"], f["lbl"], ("counter", "gauge", "histogram")[f["kind"]], f["val"],
                   f["help"], f["scale"])


@dataclass(frozen=True)
class Worker:
    """One inference worker the supervisor knows (workers())."""

    pid: int
    uid: int
    engine: str
    role: str
    rank: int
    devices: List[str]
    state: str
    n_regions: int
    bytes: int
    age_ms: int
    parked: bool
    port: int
    ready: bool

    @classmethod
    def _from(cls, f: Dict[str, Any]) -> "Worker":
        return cls(f["pid"], f["uid"], f["eng"], ("primary", "shadow")[f["role"]], f["rank"],
                   [_uuid(u) for u in f["devs"]], ("alive", "dead", "unconfirmed")[f["state"]],
                   f["nreg"], f["bytes"], f["ms"], bool(f["park"]), f["port"], bool(f["rdy"]))


@dataclass(frozen=True)
class Event:
    """One event of the supervisor's stream (events())."""

    ts_us: int
    kind: str
    pid: int
    id: int
    message: str

    @classmethod
    def _from(cls, f: Dict[str, Any]) -> "Event":
        k = f["kind"]
        name = EVENT_KIND_NAMES[k] if k < len(EVENT_KIND_NAMES) else f"kind-{k}"
        return cls(f["ts"], name, f["pid"], f["id"], f["msg"])


@dataclass(frozen=True)
class Image:
    """A stored container image (images(), import_image()): its id (the config's digest),
    name, layer count and, for an import, its figures (layers unpacked, layers the store
    already held, entries, bytes unpacked, µs)."""

    id: str
    name: str
    n_layers: int
    unpacked: int
    cached: int
    entries: int
    bytes: int
    us: int

    @classmethod
    def _from(cls, f: Dict[str, Any]) -> "Image":
        return cls(f["id"], f["name"], f["n"], f["unp"], f["cached"], f["ent"], f["bytes"],
                   f["us"])


@dataclass(frozen=True)
class FileData:
    """A file read from an environment, with its mode and owner."""

    data: bytes
    mode: int
    uid: int
    gid: int


def _uuid(u: bytes) -> str:
    h = u.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
