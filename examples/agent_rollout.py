#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""An agentic RL rollout through Belayer, failures included: the paper's whole system in one script.

N trajectories run side by side (asyncio), each in an environment of its own, created from a
container image (--image) or a base directory (--root). Every turn of a trajectory:

  1. generate: its whole context (token ids) goes to the model through Belayer's GATEWAY,
     token-in/token-out (SGLang's /generate, streamed, greedy), tagged with the trajectory
     header X-Belayer-Trajectory. The model is the engine stand-in (tests/engine); the
     generation is the inference bubble, in which the supervisor may checkpoint the
     environment ([policy] mode = adaptive);
  2. step_begin: the action arrived (the reply may wait for a checkpoint still running);
  3. act: the scripted policy maps the generated tokens deterministically to a tool call (a
     shell command), which runs in the environment (exec);
  4. observe: the generated tokens and the observation's tokens (its bytes) join the context
     (PrefixTracker marks where each turn ends);
  5. step_end: the observation goes back to the model: a bubble starts.

First a failure-free run, then the same rollout with three faults:
  - a rollout worker dies: rank 1 of the engine's primary group is SIGKILLed while a
    trajectory's generation streams; the supervisor promotes the shadow group and the gateway
    resumes the stream on it (the trajectory sees one uninterrupted answer);
  - an environment dies in the middle of a command (its whole cgroup: an OOM, a node fault):
    restored from its latest checkpoint (the trajectory's own, or one the supervisor took in
    a bubble), context truncated to that turn by the PrefixTracker;
  - a command crashes mid-run (its processes, not the environment): restored the same way,
    since a half-run command may have left half its effects.
It prints per trajectory the turns, failures, work lost and checkpoints hidden in bubbles, and
checks that every final context and environment state equals the failure-free run's (greedy
decoding and a deterministic policy make the rollout reproducible). Exit 1 otherwise.

Without --gateway the model is a local deterministic function (no engine, no worker to kill):
the SDK's tests run the example that way.

Usage: agent_rollout.py --socket SOCK (--image REF | --root DIR) [--gateway HOST:PORT
       --engine NAME] [-n N] [--turns T] [--every K]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Protocol, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import belayer  # noqa: E402

GEN_TOKENS = 32  # tokens generated per turn
OBS_BYTES = 64  # an observation's budget in the context (its first bytes, one token each)

# ---- the model: the engine stand-in behind the gateway ----------------------------------------


class Gateway:
    """Token-in/token-out generation through the gateway: POST /generate, streamed (SSE)."""

    def __init__(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)

    async def generate(self, trajectory: str, ctx: List[int],
                       on_first: Optional[Callable[[], None]] = None) -> List[int]:
        body = json.dumps({"input_ids": ctx, "stream": True, "sampling_params": {
            "max_new_tokens": GEN_TOKENS, "temperature": 0}}).encode()
        r, w = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 10)
        try:
            w.write(b"POST /generate HTTP/1.1\r\nHost: belayer\r\nConnection: close\r\n"
                    b"Content-Type: application/json\r\n"
                    + f"X-Belayer-Trajectory: {trajectory}\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await w.drain()
            return await asyncio.wait_for(self._read(r, on_first), 120)
        finally:
            w.close()

    @staticmethod
    async def _read(r: asyncio.StreamReader, on_first: Optional[Callable[[], None]]) -> List[int]:
        head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1")
        if not head.startswith("HTTP/1.1 200"):
            raise RuntimeError(f"gateway: {head.splitlines()[0]}: {(await r.read())[:200]!r}")
        chunked = "transfer-encoding: chunked" in head.lower()
        out: List[int] = []
        buf = b""
        while True:
            if chunked:
                n = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await r.readexactly(n + 2)
                data = data[:-2]
                if n == 0:
                    break
            else:
                data = await r.read(65536)
                if not data:
                    break
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                if event == b"data: [DONE]":
                    return out
                msg = json.loads(event[6:])
                if "error" in msg:
                    raise RuntimeError(f"gateway: {msg['error']}")
                out += msg.get("output_ids", [])
                if on_first:
                    on_first()
                    on_first = None
        raise RuntimeError("gateway: the stream ended without [DONE]")


class Model(Protocol):
    async def generate(self, trajectory: str, ctx: List[int],
                       on_first: Optional[Callable[[], None]] = None) -> List[int]: ...


class LocalModel:
    """Without a gateway: a deterministic function of the context stands in for greedy decoding."""

    async def generate(self, trajectory: str, ctx: List[int],
                       on_first: Optional[Callable[[], None]] = None) -> List[int]:
        h = hashlib.sha256(struct.pack(f"<{len(ctx)}Q", *ctx)).digest()
        return [int.from_bytes(h[2 * i:2 * i + 2], "little") % 4096 for i in range(GEN_TOKENS)]


# ---- the policy: generated tokens -> a tool call ----------------------------------------------

TOOLS = [
    "echo note-{b} >> /work/notes; wc -l < /work/notes",
    "mkdir -p /work/dir{a}; echo {b} > /work/dir{a}/f; ls /work | tr '\\n' ' '",
    "cat /work/notes 2>/dev/null | md5sum | cut -c1-12",
    "seq {a} | tail -n 1; echo {b} >> /work/notes",
]


def tool_call(action: List[int]) -> str:
    """The scripted agent: which tool, with which arguments, is a function of the model's
    output. Every tool takes a moment (sleep 0.2), as a real one does."""
    h = hashlib.sha256(struct.pack(f"<{len(action)}Q", *action)).digest()
    return "sleep 0.2; " + TOOLS[h[0] % len(TOOLS)].format(a=h[1] % 10, b=h[2:5].hex())


# ---- faults -----------------------------------------------------------------------------------


async def kill_in_env(kind: str, info: belayer.Manifest) -> None:
    """Once the command runs (a process beside the environment's init), kills the whole
    environment (its cgroup) or only what runs beside init (the command, mid-run)."""
    cg = Path(info.cgroup)
    pids: List[int] = []
    for _ in range(1000):
        pids = [int(p) for p in (cg / "cgroup.procs").read_text().split() if int(p) != info.pid]
        if pids:
            break
        await asyncio.sleep(0.005)
    if kind == "env":
        (cg / "cgroup.kill").write_text("1")
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_worker(workers: List[belayer.Worker], engine: str) -> int:
    """SIGKILL rank 1 of the engine's serving (primary) group: a rollout worker dies."""
    pid = next(w.pid for w in workers if w.engine == engine and w.role == "primary"
               and w.rank == 1 and w.state == "alive")
    os.kill(pid, signal.SIGKILL)
    return pid


# ---- one trajectory ---------------------------------------------------------------------------


@dataclass
class Stats:
    turns: int = 0
    failures: int = 0
    turns_redone: int = 0
    tokens_dropped: int = 0
    checkpoints: int = 0  # the trajectory's own (turn 0, and every --every turns)
    bubble_checkpoints: int = 0  # the supervisor's, inside an inference bubble
    held_ms: float = 0.0  # how long actions waited for those (what the bubble did not hide)
    context: List[int] = field(default_factory=list)
    state: str = ""
    log: List[str] = field(default_factory=list)


@dataclass
class Run:
    client: belayer.AsyncClient
    model: Model
    tag: str
    image: Optional[str]  # the environments' image, else
    root: Optional[str]  # their base directory
    turns: int
    every: int
    engine: str = ""
    faults: Dict[int, List[Tuple[str, int]]] = field(default_factory=dict)
    worker_killed: Optional[float] = None  # when (monotonic), once done


async def trajectory(run: Run, i: int) -> Stats:
    name, st = f"{run.tag}-{i}", Stats()
    faults = dict((turn, kind) for kind, turn in run.faults.get(i, []))
    env = await run.client.create(name, run.root, image=run.image)
    async with env:
        assert env.info is not None
        info = env.info
        ctx = list(f"task {i}: explore /work, keep notes\n".encode())  # the prompt, byte tokens
        tracker = belayer.PrefixTracker(ctx)
        await env.checkpoint(**tracker.mark().checkpoint_args(), trajectory=name)
        st.checkpoints += 1
        while tracker.turn < run.turns:
            turn = tracker.turn + 1
            fault = faults.pop(turn, None)
            on_first = None
            if fault == "worker":  # mid-stream: after the first tokens arrived
                ws = await run.client.workers()

                def on_first() -> None:
                    pid = kill_worker(ws, run.engine)
                    run.worker_killed = time.monotonic()
                    st.log.append(f"turn {turn}: rollout worker (rank 1, pid {pid}) killed "
                                  "mid-generation; the stream went on")
                    st.failures += 1
            action = await run.model.generate(name, ctx, on_first)
            d = await env.step_begin(name, turn=turn, output_tokens=len(action))
            if d.checkpoint_us and not d.aborted:
                st.bubble_checkpoints += 1
                st.held_ms += d.held_us / 1000
            injector = None
            if fault in ("env", "command"):
                injector = asyncio.create_task(kill_in_env(fault, info))
            try:
                r = await env.exec(tool_call(action), timeout=30)
                lost = not r.ok
            except (belayer.SupervisorError, belayer.ConnectionLost):
                lost = True
            if injector:
                await injector
            if lost:
                st.failures += 1
                # The checkpoint restored is ours or the policy's in a bubble: both carry the
                # turn's prefix (step_end gave it), so the tracker checks and rewinds either.
                m = await env.restore()
                rw = tracker.rewind(m)
                del ctx[rw.prefix_tokens:]
                st.turns_redone += rw.turns_dropped + 1  # the dropped turns and this one
                st.tokens_dropped += rw.tokens_dropped
                what = "environment killed" if fault == "env" else "command crashed"
                st.log.append(f"turn {turn}: {what} mid-command; restored to turn {rw.turn}, "
                              f"{rw.tokens_dropped} context tokens dropped")
                continue
            turn_tokens = action + list((r.stdout + r.stderr)[:OBS_BYTES])
            ctx += turn_tokens
            mark = tracker.add_turn(turn_tokens)
            if turn == run.turns:
                break  # the trajectory ends: no next generation, no bubble
            # The bubble starts: the gateway knows the trajectory's pending request (the
            # header), so the step-end gives no figures of its own but the context's prefix,
            # which a checkpoint the policy takes in this bubble records.
            await env.step_end(name, **mark.step_args())
            if run.every and turn % run.every == 0 and turn < run.turns:
                await env.checkpoint(**mark.checkpoint_args(), trajectory=name)
                st.checkpoints += 1
        st.turns = tracker.turn
        st.context = ctx
        state = await env.exec("cd /work && find . | sort && cat notes")
        st.state = hashlib.sha256(state.stdout).hexdigest()[:12]
    return st


async def recovery(client: belayer.AsyncClient, engine: str) -> str:
    """The supervisor's summary of the recovery the worker kill caused (its event)."""
    ev = client.events(replay=256, idle_timeout=60)
    try:
        async for e in ev:
            if e.kind == "recovery" and f"engine={engine} " in e.message \
                    and "outcome=" in e.message:
                return e.message
    finally:
        await ev.aclose()  # type: ignore[attr-defined]
    return ""


async def rollout(run: Run, n: int) -> List[Stats]:
    return list(await asyncio.gather(*(trajectory(run, i) for i in range(n))))


def field_of(msg: str, key: str) -> str:
    return next((w.split("=", 1)[1] for w in msg.split() if w.startswith(key + "=")), "?")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=belayer.default_socket())
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--image", help="the environments' image: oci:DIR[:TAG] or a stored one")
    src.add_argument("--root", help="the environments' base directory")
    ap.add_argument("--gateway", help="HOST:PORT of the engine's gateway (else a local model)")
    ap.add_argument("--engine", default="agent", help="the [engine.NAME] behind the gateway")
    ap.add_argument("-n", type=int, default=4, help="trajectories")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--every", type=int, default=0,
                    help="the trajectory's own checkpoint every K turns (0: only the policy's)")
    a = ap.parse_args()
    if a.turns < 3 or a.n < 1:
        ap.error("needs --turns >= 3 and -n >= 1")
    client = belayer.AsyncClient(a.socket, timeout=120)
    image = None
    if a.image:
        img = await client.import_image(a.image, name="agent-rollout")
        image = img.name or img.id
        print(f"image {a.image}: {img.id[:19]}, {img.n_layers} layer(s)")
    model: Model = LocalModel()
    if a.gateway:
        model = Gateway(a.gateway)

    t0 = time.monotonic()
    ref = await rollout(Run(client, model, "ref", image, a.root, a.turns, a.every), a.n)
    t1 = time.monotonic()
    faults: Dict[int, List[Tuple[str, int]]] = {}
    if a.gateway:
        faults.setdefault(0, []).append(("worker", 2))
    faults.setdefault(1 % a.n, []).append(("env", a.turns - 1))
    faults.setdefault(2 % a.n, []).append(("command", 3))
    run = Run(client, model, "run", image, a.root, a.turns, a.every, a.engine, faults)
    got = await rollout(run, a.n)
    t2 = time.monotonic()

    ok = True
    print(f"failure-free run {t1 - t0:.1f} s, run with faults {t2 - t1:.1f} s; "
          f"{a.n} trajectories x {a.turns} turns, {GEN_TOKENS} tokens generated per turn")
    if a.gateway:
        msg = await recovery(client, a.engine) if run.worker_killed else ""
        outcome = field_of(msg, "outcome")
        ok &= outcome == "promoted"
        total = int(field_of(msg, "total_us")) / 1000 if msg else 0.0
        print(f"rollout worker killed: recovery {outcome} (trigger {field_of(msg, 'trigger')}), "
              f"the promoted group serving {total:.1f} ms after the kill was detected")
    print(f"{'trajectory':<12}{'turns':>6}{'failures':>9}{'redone':>8}{'tok lost':>9}"
          f"{'ckpts':>6}{'bubble':>7}{'held ms':>8}  equal to failure-free")
    for i in range(a.n):
        g, r = got[i], ref[i]
        same = (g.context, g.state, g.turns) == (r.context, r.state, r.turns)
        ok &= same
        print(f"{'run-%d' % i:<12}{g.turns:>6}{g.failures:>9}{g.turns_redone:>8}"
              f"{g.tokens_dropped:>9}{g.checkpoints:>6}{g.bubble_checkpoints:>7}"
              f"{g.held_ms:>8.1f}  {'yes' if same else 'NO'} "
              f"(context {len(g.context)} tokens {belayer.prefix_hash(g.context):016x}, "
              f"files {g.state})")
        for line in g.log:
            print(f"    {line}")
    print("every trajectory equals its failure-free run" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
