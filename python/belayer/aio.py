# SPDX-License-Identifier: MIT
"""The asyncio client: the same calls as belayer.Client, as coroutines that never block the
event loop. The socket is non-blocking; a packet (and its SCM_RIGHTS fds) is read with
recvmsg when loop.add_reader says it is there, written with sendmsg when add_writer says
there is room. Every call is bounded by its timeout (asyncio.wait_for), and cancelling one
closes its connection."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from typing import Any, AsyncIterator, Callable, List, Mapping, Optional, Sequence, TypeVar, Union

from . import _ops
from . import _proto as P
from .client import DEFAULT_TIMEOUT, IMAGE_TIMEOUT, default_socket
from .errors import ConnectionLost, ProtocolError, SupervisorError, Timeout
from .types import (Decision, Event, ExecResult, FileData, Image, Limits, Manifest, Metric,
                    Worker)

T = TypeVar("T")


class _AConn:
    def __init__(self, path: str) -> None:
        self.path = path
        self.loop = asyncio.get_running_loop()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.setblocking(False)

    async def connect(self) -> None:
        try:
            await self.loop.sock_connect(self.sock, self.path)
        except OSError as e:
            raise ConnectionLost(f"cannot reach the supervisor at {self.path}: {e.strerror}",
                                 e.errno or 0) from None

    def close(self) -> None:
        self.sock.close()

    async def _when(self, add: Callable[..., None], remove: Callable[[int], Any],
                    attempt: Callable[[], T]) -> T:
        while True:
            try:
                return attempt()
            except (BlockingIOError, InterruptedError):
                pass
            fut: asyncio.Future[None] = self.loop.create_future()
            def ready() -> None:
                if not fut.done():
                    fut.set_result(None)

            add(self.sock.fileno(), ready)
            try:
                await fut
            finally:
                remove(self.sock.fileno())

    async def send(self, req: _ops.Send) -> None:
        try:
            await self._when(self.loop.add_writer, self.loop.remove_writer,
                             lambda: self.sock.sendmsg([req.data], P.ancillary(req.fds)))
        except OSError as e:
            raise ConnectionLost(f"the supervisor went away: {e.strerror}", e.errno or 0) from None

    async def recv(self) -> P.Message:
        try:
            data, anc, flags, _ = await self._when(self.loop.add_reader, self.loop.remove_reader,
                                                   lambda: self.sock.recvmsg(*P.recv_args()))
        except OSError as e:
            raise ConnectionLost(f"the supervisor went away: {e.strerror}", e.errno or 0) from None
        if not data and not anc:
            raise ConnectionLost("the supervisor closed the connection")
        return P.unpack_recvmsg(data, anc, flags)


async def _drive(op: "_ops.Op[T]", conn: _AConn) -> T:
    try:
        req = next(op)
        while True:
            if req is _ops.RECV:
                req = op.send(await conn.recv())
            else:
                await conn.send(req)
                req = op.send(None)
    except StopIteration as e:
        result: T = e.value
        return result


class AsyncClient:
    """belayer.Client's calls as coroutines (see there for each one's meaning)."""

    def __init__(self, socket: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 busy_wait: bool = True) -> None:
        self.socket = socket or default_socket()
        self.timeout = timeout
        self.busy_wait = busy_wait

    async def _run_env(self, make: Callable[[], "_ops.Op[T]"], timeout: Optional[float]) -> T:
        """An environment operation (make: a fresh op per try), retried on EBUSY (busy_wait)."""
        t = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + t
        pauses = _ops.busy_pauses(deadline)
        while True:
            try:
                return await self._run(make(), max(deadline - time.monotonic(), 0.001))
            except SupervisorError as e:
                pause = next(pauses, None) if self.busy_wait and e.errno == errno.EBUSY else None
                if pause is None:
                    raise
            await asyncio.sleep(pause)

    async def _run(self, op: "_ops.Op[T]", timeout: Optional[float]) -> T:
        t = self.timeout if timeout is None else timeout
        conn = _AConn(self.socket)

        async def call() -> T:
            await conn.connect()
            return await _drive(op, conn)

        try:
            return await asyncio.wait_for(call(), t)
        except asyncio.TimeoutError:
            raise Timeout(f"the supervisor did not answer within {t} s") from None
        finally:
            op.close()
            conn.close()

    async def create(self, id: str, root: Optional[str] = None, *, image: Optional[str] = None,
                     cmd: str = "", limits: Optional[Limits] = None, net: Optional[str] = None,
                     timeout: Optional[float] = None,
                     destroy_on_exit: bool = True) -> "AsyncEnvironment":
        info = await self._run(_ops.create(id, root, image, cmd, limits, net), timeout)
        return AsyncEnvironment(self, info.env, info, destroy_on_exit)

    def environment(self, id: str, destroy_on_exit: bool = False) -> "AsyncEnvironment":
        return AsyncEnvironment(self, _ops.check_env_id(id), None, destroy_on_exit)

    async def list(self, timeout: Optional[float] = None) -> List[Manifest]:
        return await self._run(_ops.manifests(P.OP_LIST, ""), timeout)

    async def checkpoints(self, env: str, timeout: Optional[float] = None) -> List[Manifest]:
        return await self._run(_ops.manifests(P.OP_LIST, env), timeout)

    async def exec(self, env: str, cmd: Union[str, Sequence[str]], *,
                   timeout: Optional[float] = None, cwd: str = "",
                   env_vars: Optional[Mapping[str, str]] = None, user: str = "",
                   stdin: Union[bytes, str, None] = None, max_output: int = 0,
                   call_timeout: Optional[float] = None) -> ExecResult:
        return await self._run_env(
            lambda: _ops.exec_(env, cmd, timeout, cwd, env_vars, user, stdin, max_output),
            call_timeout if call_timeout is not None else _ops.exec_timeout_s(timeout))

    async def read(self, env: str, path: str, *, max_bytes: int = 0,
                   timeout: Optional[float] = None) -> bytes:
        return (await self.read_file(env, path, max_bytes=max_bytes, timeout=timeout)).data

    async def read_file(self, env: str, path: str, *, max_bytes: int = 0,
                        timeout: Optional[float] = None) -> FileData:
        return await self._run_env(lambda: _ops.file_read(env, path, max_bytes), timeout)

    async def write(self, env: str, path: str, data: Union[bytes, str], *, mode: int = 0o644,
                    user: str = "", timeout: Optional[float] = None) -> int:
        return await self._run_env(lambda: _ops.file_write(env, path, data, mode, user), timeout)

    async def checkpoint(self, env: str, turn: int = 0, prefix_tokens: int = 0,
                         prefix_hash: int = 0, *, trajectory: str = "", new: bool = False,
                         timeout: Optional[float] = None) -> Manifest:
        return await self._run_env(
            lambda: _ops.checkpoint(env, turn, prefix_tokens, prefix_hash, trajectory, new),
            timeout)

    async def restore(self, env: str, checkpoint: Optional[str] = None, *,
                      timeout: Optional[float] = None) -> Manifest:
        return await self._run_env(lambda: _ops.restore(env, checkpoint), timeout)

    async def fork(self, env: str, as_: str, count: int = 1, *, checkpoint: Optional[str] = None,
                   timeout: Optional[float] = None,
                   destroy_on_exit: bool = True) -> List["AsyncEnvironment"]:
        infos = await self._run_env(lambda: _ops.fork(env, as_, count, checkpoint), timeout)
        return [AsyncEnvironment(self, i.env, i, destroy_on_exit) for i in infos]

    async def destroy(self, env: str, *, timeout: Optional[float] = None) -> None:
        await self._run_env(lambda: _ops.destroy(env), timeout)

    # ---- container images ------------------------------------------------------------------

    async def images(self, *, timeout: Optional[float] = None) -> List[Image]:
        """The stored images."""
        return await self._run(_ops.image_request(P.IMAGE_LIST), timeout)

    async def import_image(self, ref: str, name: str = "", *,
                     timeout: Optional[float] = IMAGE_TIMEOUT) -> Image:
        """Import oci:DIR[:TAG] or docker-archive:FILE[:REF] (relative paths are made
        absolute) under name; the default timeout is belayerctl's, an hour."""
        infos = await self._run(_ops.image_request(P.IMAGE_IMPORT, ref, name), timeout)
        if len(infos) != 1:
            raise ProtocolError(f"import answered {len(infos)} images")
        return infos[0]

    async def remove_image(self, ref: str, *, timeout: Optional[float] = None) -> None:
        """Remove a stored image by name or id (EBUSY while an environment uses it)."""
        await self._run(_ops.image_request(P.IMAGE_RM, ref), timeout)

    async def gc_images(self, *, timeout: Optional[float] = None) -> int:
        """Remove the layers no image lists; returns how many."""
        return await self._run(_ops.image_gc(), timeout)

    async def step_end(self, trajectory: str, env: str, *, turn: int = 0,
                       prompt_tokens: int = 0, generated_tokens: int = 0, decode_mtps: int = 0,
                       prefix_tokens: int = 0, prefix_hash: int = 0,
                       timeout: Optional[float] = None) -> Decision:
        return await self._run(_ops.step(P.STEP_END, trajectory, env, turn, prompt_tokens,
                                         generated_tokens, decode_mtps, 0, prefix_tokens,
                                         prefix_hash), timeout)

    async def step_begin(self, trajectory: str, env: str, *, turn: int = 0,
                         output_tokens: int = 0, timeout: Optional[float] = None) -> Decision:
        return await self._run(
            _ops.step(P.STEP_BEGIN, trajectory, env, turn, 0, 0, 0, output_tokens), timeout)

    async def status(self, *, timeout: Optional[float] = None) -> List[Metric]:
        return await self._run(_ops.status(), timeout)

    async def workers(self, *, timeout: Optional[float] = None) -> List[Worker]:
        return await self._run(_ops.workers(), timeout)

    async def promote(self, engine: str, *, timeout: Optional[float] = None) -> None:
        await self._run(_ops.promote(engine), timeout)

    async def events(self, *, replay: int = 0, timeout: Optional[float] = None,
                     idle_timeout: Optional[float] = None) -> AsyncIterator[Event]:
        """Replayed, then live events until the iterator is closed (aclose, or leaving an
        async for). timeout bounds the subscription, idle_timeout each live event's wait."""
        t = self.timeout if timeout is None else timeout
        conn = _AConn(self.socket)
        op = _ops.subscribe(replay)
        try:
            async def sub() -> List[Event]:
                await conn.connect()
                return await _drive(op, conn)

            try:
                replayed = await asyncio.wait_for(sub(), t)
            except asyncio.TimeoutError:
                raise Timeout(f"subscribing to events took over {t} s") from None
            for e in replayed:
                yield e
            while True:
                try:
                    m = await asyncio.wait_for(conn.recv(), idle_timeout)
                except asyncio.TimeoutError:
                    raise Timeout(f"no event within {idle_timeout} s") from None
                yield _ops.event_of(m)
        finally:
            op.close()
            conn.close()


class AsyncEnvironment:
    """One environment of an AsyncClient; `async with` destroys it on exit when
    destroy_on_exit."""

    def __init__(self, client: AsyncClient, id: str, info: Optional[Manifest] = None,
                 destroy_on_exit: bool = True) -> None:
        self.client = client
        self.id = id
        self.info = info
        self.destroy_on_exit = destroy_on_exit

    def __repr__(self) -> str:
        return f"AsyncEnvironment({self.id!r})"

    async def __aenter__(self) -> "AsyncEnvironment":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.destroy_on_exit:
            await self.destroy()

    async def exec(self, cmd: Union[str, Sequence[str]], **kw: Any) -> ExecResult:
        return await self.client.exec(self.id, cmd, **kw)

    async def read(self, path: str, **kw: Any) -> bytes:
        return await self.client.read(self.id, path, **kw)

    async def read_file(self, path: str, **kw: Any) -> FileData:
        return await self.client.read_file(self.id, path, **kw)

    async def write(self, path: str, data: Union[bytes, str], **kw: Any) -> int:
        return await self.client.write(self.id, path, data, **kw)

    async def checkpoint(self, turn: int = 0, prefix_tokens: int = 0, prefix_hash: int = 0,
                         **kw: Any) -> Manifest:
        return await self.client.checkpoint(self.id, turn, prefix_tokens, prefix_hash, **kw)

    async def checkpoints(self, **kw: Any) -> List[Manifest]:
        return await self.client.checkpoints(self.id, **kw)

    async def restore(self, checkpoint: Optional[str] = None, **kw: Any) -> Manifest:
        return await self.client.restore(self.id, checkpoint, **kw)

    async def fork(self, as_: str, count: int = 1, **kw: Any) -> List["AsyncEnvironment"]:
        return await self.client.fork(self.id, as_, count, **kw)

    async def destroy(self, **kw: Any) -> None:
        await self.client.destroy(self.id, **kw)

    async def step_end(self, trajectory: str, **kw: Any) -> Decision:
        return await self.client.step_end(trajectory, self.id, **kw)

    async def step_begin(self, trajectory: str, **kw: Any) -> Decision:
        return await self.client.step_begin(trajectory, self.id, **kw)
