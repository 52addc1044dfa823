# SPDX-License-Identifier: MIT
"""The blocking client. Each call opens its own connection to the supervisor (as belayerctl
does), so calls from several threads do not share state, and a call that fails leaves
nothing behind; every call has an explicit timeout (the client's default, or timeout=)."""

from __future__ import annotations

import errno
import os
import select
import socket
import time
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

from . import _ops
from . import _proto as P
from .errors import ConnectionLost, ProtocolError, SupervisorError, Timeout
from .types import (Decision, Event, ExecResult, FileData, Image, Limits, Manifest, Metric,
                    Worker)

T = TypeVar("T")

DEFAULT_SOCKET = "/run/belayer/supervisor.sock"
DEFAULT_TIMEOUT = 30.0
# An import of a several-GiB image takes minutes (belayerctl waits an hour too).
IMAGE_TIMEOUT = 3600.0


def default_socket() -> str:
    """$BELAYER_SOCKET, else /run/belayer/supervisor.sock (belayerctl's default)."""
    return os.environ.get("BELAYER_SOCKET") or DEFAULT_SOCKET


class _Conn:
    def __init__(self, path: str, deadline: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.deadline = deadline
        try:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            self.sock.connect(path)
        except socket.timeout:
            self.sock.close()
            raise Timeout(f"connecting to the supervisor at {path} timed out") from None
        except OSError as e:
            self.sock.close()
            raise ConnectionLost(f"cannot reach the supervisor at {path}: {e.strerror}",
                                 e.errno or 0) from None

    def close(self) -> None:
        self.sock.close()

    def _left(self) -> Optional[float]:
        """Seconds to the deadline (None: no deadline, an event stream's wait)."""
        if self.deadline == float("inf"):
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Timeout("the supervisor did not answer in time")
        return left

    def send(self, req: _ops.Send) -> None:
        self.sock.settimeout(self._left())
        try:
            self.sock.sendmsg([req.data], P.ancillary(req.fds))
        except socket.timeout:
            raise Timeout("sending to the supervisor timed out") from None
        except OSError as e:
            raise ConnectionLost(f"the supervisor went away: {e.strerror}", e.errno or 0) from None

    def recv(self) -> P.Message:
        # poll, then a non-blocking recvmsg: settimeout's wait would restart on EINTR and
        # lose the deadline's precision, poll says it plainly.
        while True:
            left = self._left()
            r, _, _ = select.select([self.sock], [], [], left)
            if r:
                break
        try:
            self.sock.setblocking(False)
            data, anc, flags, _ = self.sock.recvmsg(*P.recv_args())
        except BlockingIOError:
            return self.recv()
        except OSError as e:
            raise ConnectionLost(f"the supervisor went away: {e.strerror}", e.errno or 0) from None
        if not data and not anc:
            raise ConnectionLost("the supervisor closed the connection")
        return P.unpack_recvmsg(data, anc, flags)


def _drive(op: "_ops.Op[T]", conn: _Conn) -> T:
    try:
        req = next(op)
        while True:
            # On an error the caller's op.close() runs the operation's cleanup (its fds).
            if req is _ops.RECV:
                req = op.send(conn.recv())
            else:
                conn.send(req)
                req = op.send(None)
    except StopIteration as e:
        result: T = e.value
        return result


class Client:
    """A connection factory to one supervisor. socket: its path (default: $BELAYER_SOCKET,
    else /run/belayer/supervisor.sock); timeout: every call's default, in seconds; busy_wait:
    an environment operation refused because the environment runs another job (EBUSY: a
    checkpoint committing, a restore) is retried until the call's timeout (False: raised)."""

    def __init__(self, socket: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 busy_wait: bool = True) -> None:
        self.socket = socket or default_socket()
        self.timeout = timeout
        self.busy_wait = busy_wait

    def _run(self, op: "_ops.Op[T]", timeout: Optional[float]) -> T:
        t = self.timeout if timeout is None else timeout
        conn = _Conn(self.socket, time.monotonic() + t)
        try:
            return _drive(op, conn)
        finally:
            op.close()
            conn.close()

    def _run_env(self, make: Callable[[], "_ops.Op[T]"], timeout: Optional[float]) -> T:
        """An environment operation (make: a fresh op per try), retried on EBUSY (busy_wait)."""
        t = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + t
        pauses = _ops.busy_pauses(deadline)
        while True:
            try:
                return self._run(make(), max(deadline - time.monotonic(), 0.001))
            except SupervisorError as e:
                pause = next(pauses, None) if self.busy_wait and e.errno == errno.EBUSY else None
                if pause is None:
                    raise
            time.sleep(pause)

    # ---- environments ----------------------------------------------------------------------

    def create(self, id: str, root: Optional[str] = None, *, image: Optional[str] = None,
               cmd: str = "", limits: Optional[Limits] = None, net: Optional[str] = None,
               timeout: Optional[float] = None, destroy_on_exit: bool = True) -> "Environment":
        """Start environment id from a base directory (root=) or a container image (image=:
        a stored image's name or id, or oci:DIR[:TAG] / docker-archive:FILE[:REF], imported
        when not stored: give a timeout to match) running cmd (a shell string; "": the
        image's Entrypoint/Cmd, or the supervisor's idle init). net: "none", "slirp",
        "host" or None ([env] net)."""
        _ops.check_env_id(id)
        info = self._run(_ops.create(id, root, image, cmd, limits, net), timeout)
        return Environment(self, info.env, info, destroy_on_exit)

    def environment(self, id: str, destroy_on_exit: bool = False) -> "Environment":
        """A handle on an existing environment (nothing is sent)."""
        return Environment(self, _ops.check_env_id(id), None, destroy_on_exit)

    def list(self, timeout: Optional[float] = None) -> List[Manifest]:
        """Every environment."""
        return self._run(_ops.manifests(P.OP_LIST, ""), timeout)

    def checkpoints(self, env: str, timeout: Optional[float] = None) -> List[Manifest]:
        """The checkpoints of env, oldest first."""
        return self._run(_ops.manifests(P.OP_LIST, env), timeout)

    def exec(self, env: str, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
             cwd: str = "", env_vars: Optional[Mapping[str, str]] = None, user: str = "",
             stdin: Union[bytes, str, None] = None, max_output: int = 0,
             call_timeout: Optional[float] = None) -> ExecResult:
        """Run cmd (a shell string, or an argv list) in env. timeout: the command's, in
        seconds (None: the supervisor's default, 60 s), after which its process group is killed
        and the result says timed_out; the call itself waits that long plus a margin unless
        call_timeout says otherwise."""
        return self._run_env(lambda: _ops.exec_(env, cmd, timeout, cwd, env_vars, user, stdin,
                                                max_output),
                             call_timeout if call_timeout is not None else _ops.exec_timeout_s(timeout))

    def read(self, env: str, path: str, *, max_bytes: int = 0,
             timeout: Optional[float] = None) -> bytes:
        """A file's content (max_bytes: refuse a longer file; 0: the supervisor's default)."""
        return self.read_file(env, path, max_bytes=max_bytes, timeout=timeout).data

    def read_file(self, env: str, path: str, *, max_bytes: int = 0,
                  timeout: Optional[float] = None) -> FileData:
        """A file's content with its mode and owner."""
        return self._run_env(lambda: _ops.file_read(env, path, max_bytes), timeout)

    def write(self, env: str, path: str, data: Union[bytes, str], *, mode: int = 0o644,
              user: str = "", timeout: Optional[float] = None) -> int:
        """Write (create or replace) a file; returns the bytes written."""
        return self._run_env(lambda: _ops.file_write(env, path, data, mode, user), timeout)

    def checkpoint(self, env: str, turn: int = 0, prefix_tokens: int = 0, prefix_hash: int = 0,
                   *, trajectory: str = "", new: bool = False,
                   timeout: Optional[float] = None) -> Manifest:
        """A checkpoint of env after turn (see PrefixTracker for the prefix). Its kind says
        what it took: "full", "fs-only" (no process ran since the last dump), or "skipped"
        (nothing changed: the head's manifest, no new checkpoint; new=True takes one even
        then)."""
        return self._run_env(
            lambda: _ops.checkpoint(env, turn, prefix_tokens, prefix_hash, trajectory, new),
            timeout)

    def restore(self, env: str, checkpoint: Optional[str] = None, *,
                timeout: Optional[float] = None) -> Manifest:
        """Restore env to checkpoint (None: its latest); returns that checkpoint's manifest."""
        return self._run_env(lambda: _ops.restore(env, checkpoint), timeout)

    def fork(self, env: str, as_: str, count: int = 1, *, checkpoint: Optional[str] = None,
             timeout: Optional[float] = None, destroy_on_exit: bool = True) -> List["Environment"]:
        """count new environments from a checkpoint of env (None: its latest), named as_
        (count 1) or as_-1 .. as_-count. All or none."""
        infos = self._run_env(lambda: _ops.fork(env, as_, count, checkpoint), timeout)
        return [Environment(self, i.env, i, destroy_on_exit) for i in infos]

    def destroy(self, env: str, *, timeout: Optional[float] = None) -> None:
        """Kill env, unmount it and forget it (its checkpoints stay on disk)."""
        self._run_env(lambda: _ops.destroy(env), timeout)

    # ---- container images ------------------------------------------------------------------

    def images(self, *, timeout: Optional[float] = None) -> List[Image]:
        """The stored images."""
        return self._run(_ops.image_request(P.IMAGE_LIST), timeout)

    def import_image(self, ref: str, name: str = "", *,
                     timeout: Optional[float] = IMAGE_TIMEOUT) -> Image:
        """Import oci:DIR[:TAG] or docker-archive:FILE[:REF] (relative paths are made
        absolute) under name; the default timeout is belayerctl's, an hour."""
        infos = self._run(_ops.image_request(P.IMAGE_IMPORT, ref, name), timeout)
        if len(infos) != 1:
            raise ProtocolError(f"import answered {len(infos)} images")
        return infos[0]

    def remove_image(self, ref: str, *, timeout: Optional[float] = None) -> None:
        """Remove a stored image by name or id (EBUSY while an environment uses it)."""
        self._run(_ops.image_request(P.IMAGE_RM, ref), timeout)

    def gc_images(self, *, timeout: Optional[float] = None) -> int:
        """Remove the layers no image lists; returns how many."""
        return self._run(_ops.image_gc(), timeout)

    # ---- trajectories ----------------------------------------------------------------------

    def step_end(self, trajectory: str, env: str, *, turn: int = 0, prompt_tokens: int = 0,
                 generated_tokens: int = 0, decode_mtps: int = 0, prefix_tokens: int = 0,
                 prefix_hash: int = 0, timeout: Optional[float] = None) -> Decision:
        """The observation of turn went back to the model: an inference bubble starts, and the
        policy may checkpoint env in it. prefix_tokens/prefix_hash (a PrefixTracker mark's:
        ``**mark.step_args()``) are recorded by that checkpoint, so that a restore to it can be
        rewound like one the framework took itself."""
        return self._run(_ops.step(P.STEP_END, trajectory, env, turn, prompt_tokens,
                                   generated_tokens, decode_mtps, 0, prefix_tokens,
                                   prefix_hash), timeout)

    def step_begin(self, trajectory: str, env: str, *, turn: int = 0, output_tokens: int = 0,
                   timeout: Optional[float] = None) -> Decision:
        """The next action arrived (output_tokens: the generation's length): the bubble is
        over. The reply may be held while the policy's checkpoint finishes (held_us)."""
        return self._run(_ops.step(P.STEP_BEGIN, trajectory, env, turn, 0, 0, 0, output_tokens),
                         timeout)

    # ---- the supervisor --------------------------------------------------------------------

    def status(self, *, timeout: Optional[float] = None) -> List[Metric]:
        return self._run(_ops.status(), timeout)

    def workers(self, *, timeout: Optional[float] = None) -> List[Worker]:
        return self._run(_ops.workers(), timeout)

    def promote(self, engine: str, *, timeout: Optional[float] = None) -> None:
        """Fail engine over to its shadow group now; events() follows the recovery."""
        self._run(_ops.promote(engine), timeout)

    def events(self, *, replay: int = 0, timeout: Optional[float] = None,
               idle_timeout: Optional[float] = None) -> Iterator[Event]:
        """The supervisor's event stream: replay recent events, then live ones until the
        generator is closed. timeout bounds the subscription; idle_timeout (None: none) the
        wait for each live event (Timeout then)."""
        t = self.timeout if timeout is None else timeout
        conn = _Conn(self.socket, time.monotonic() + t)
        op = _ops.subscribe(replay)
        try:
            replayed = _drive(op, conn)
            yield from replayed
            while True:
                conn.deadline = time.monotonic() + idle_timeout if idle_timeout else float("inf")
                yield _ops.event_of(conn.recv())
        finally:
            op.close()
            conn.close()


class Environment:
    """One environment of a Client. As a context manager it is destroyed on exit when
    destroy_on_exit (the default for create and fork)."""

    def __init__(self, client: Client, id: str, info: Optional[Manifest] = None,
                 destroy_on_exit: bool = True) -> None:
        self.client = client
        self.id = id
        self.info = info
        self.destroy_on_exit = destroy_on_exit

    def __repr__(self) -> str:
        return f"Environment({self.id!r})"

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.destroy_on_exit:
            self.destroy()

    def exec(self, cmd: Union[str, Sequence[str]], **kw: Any) -> ExecResult:
        return self.client.exec(self.id, cmd, **kw)

    def read(self, path: str, **kw: Any) -> bytes:
        return self.client.read(self.id, path, **kw)

    def read_file(self, path: str, **kw: Any) -> FileData:
        return self.client.read_file(self.id, path, **kw)

    def write(self, path: str, data: Union[bytes, str], **kw: Any) -> int:
        return self.client.write(self.id, path, data, **kw)

    def checkpoint(self, turn: int = 0, prefix_tokens: int = 0, prefix_hash: int = 0,
                   **kw: Any) -> Manifest:
        return self.client.checkpoint(self.id, turn, prefix_tokens, prefix_hash, **kw)

    def checkpoints(self, **kw: Any) -> List[Manifest]:
        return self.client.checkpoints(self.id, **kw)

    def restore(self, checkpoint: Optional[str] = None, **kw: Any) -> Manifest:
        return self.client.restore(self.id, checkpoint, **kw)

    def fork(self, as_: str, count: int = 1, **kw: Any) -> List["Environment"]:
        return self.client.fork(self.id, as_, count, **kw)

    def destroy(self, **kw: Any) -> None:
        self.client.destroy(self.id, **kw)

    def step_end(self, trajectory: str, **kw: Any) -> Decision:
        return self.client.step_end(trajectory, self.id, **kw)

    def step_begin(self, trajectory: str, **kw: Any) -> Decision:
        return self.client.step_begin(trajectory, self.id, **kw)
