# SPDX-License-Identifier: MIT
"""Belayer's Python SDK: sync (Client) and asyncio (AsyncClient) clients of the supervisor's
socket, speaking the same bounded msgpack protocol as belayerctl (common/proto.h), and
PrefixTracker, the turn/prefix contract of checkpoints and restores.

    import belayer
    c = belayer.Client("/run/belayer/supervisor.sock", timeout=30)
    with c.create("t1", root="/srv/base") as env:
        r = env.exec("echo hi", timeout=10)
"""

from .aio import AsyncClient, AsyncEnvironment
from .client import Client, Environment, default_socket
from .errors import (BelayerError, ConnectionLost, PrefixMismatch, ProtocolError,
                     SupervisorError, Timeout)
from .prefix import PrefixTracker, Rewind, TurnMark, prefix_hash
from .types import (Decision, EnvInfo, Event, ExecResult, FileData, Image, Limits, Manifest,
                    Metric, Worker)

__all__ = [
    "AsyncClient", "AsyncEnvironment", "BelayerError", "Client", "ConnectionLost", "Decision",
    "EnvInfo", "Environment", "Event", "ExecResult", "FileData", "Image", "Limits", "Manifest", "Metric",
    "PrefixMismatch", "PrefixTracker", "ProtocolError", "Rewind", "SupervisorError", "Timeout",
    "TurnMark", "Worker", "default_socket", "prefix_hash",
]
__version__ = "0.1.0"
