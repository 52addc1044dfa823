#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A small agentic rollout through the Python SDK (issue 21 item 3, at a small size).

N trajectories run side by side (asyncio), each in an environment of its own: every turn a
scripted tool-using policy (deterministic: its action depends on the whole context, as a
greedy model's does) emits a shell command, the environment executes it, and the command and
its output go into the context (bytes stand in for tokens). Steps are reported (step_begin /
step_end: the adaptive policy's bubbles) and every --every turns the trajectory checkpoints
its environment with the PrefixTracker's prefix.

First a failure-free run, then the same with faults: one trajectory's environment is killed
in the middle of a command (restored, context truncated by the tracker), another's command
is killed mid-run (its processes, not the environment: restored the same way, since a half-run
command may have left half its effects). The run ends with a table per trajectory and checks
that every final context and environment state equals the failure-free run's.

Not here (the issue's full demo): generation through the gateway with an engine stand-in and a
rollout worker killed under it, images (the tree's protocol has none yet).

Usage: agent_rollout.py --socket SOCK --root BASE_DIR [-n N] [--turns T] [--every K]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import belayer  # noqa: E402


@dataclass
class Stats:
    turns: int = 0
    failures: int = 0
    turns_redone: int = 0
    tokens_dropped: int = 0
    checkpoints: int = 0
    policy_checkpoints: int = 0
    context_hash: int = 0
    state: str = ""
    log: List[str] = field(default_factory=list)


def policy(ctx: bytearray, turn: int) -> str:
    """The scripted model: its next tool call, a function of everything it has seen."""
    h = hashlib.sha256(ctx).hexdigest()[:8]
    return (f"sleep 0.3; echo 'turn {turn} saw {h}' >> /work/notes; "
            f"echo $(wc -l < /work/notes) $(md5sum < /work/notes | cut -c1-8)")


async def inject(kind: str, info: belayer.Manifest) -> None:
    """Once the command runs (a process beside the environment's init), kills the whole
    environment (its cgroup: an OOM or a node fault) or only what runs beside init (the
    command, mid-run)."""
    cg = Path(info.cgroup)
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


async def trajectory(client: belayer.AsyncClient, name: str, root: str, turns: int, every: int,
                     fault: Optional[str], fault_turn: int) -> Stats:
    st = Stats()
    env = await client.create(name, root=root)
    async with env:
        assert env.info is not None
        info = env.info
        ctx = bytearray(f"task {name[-1]}: keep notes\n".encode())
        tracker = belayer.PrefixTracker(ctx)
        await env.checkpoint(**tracker.mark().checkpoint_args(), trajectory=name)
        st.checkpoints += 1
        injector: Optional["asyncio.Task[None]"] = None
        while tracker.turn < turns:
            turn = tracker.turn + 1
            action = policy(ctx, turn)
            d = await env.step_begin(name, turn=turn, output_tokens=len(action))
            if d.checkpoint:
                st.policy_checkpoints += 1
            if fault and turn == fault_turn:
                injector = asyncio.create_task(inject(fault, info))
                fault = None
            lost = False
            try:
                r = await env.exec(action, timeout=30)
                lost = not r.ok
            except (belayer.SupervisorError, belayer.ConnectionLost):
                lost = True
            if injector:
                await injector
                injector = None
            if lost:
                st.failures += 1
                rw = tracker.rewind(await env.restore())
                del ctx[rw.prefix_tokens:]
                st.turns_redone += rw.turns_dropped + 1  # the dropped turns and this one
                st.tokens_dropped += rw.tokens_dropped
                st.log.append(f"turn {turn}: failed, restored to turn {rw.turn}")
                continue
            ctx += action.encode() + r.stdout
            mark = tracker.add_turn(action.encode() + r.stdout)
            await env.step_end(name, turn=turn, prompt_tokens=len(ctx))
            if turn % every == 0 and turn < turns:
                await env.checkpoint(**mark.checkpoint_args(), trajectory=name)
                st.checkpoints += 1
        st.turns = tracker.turn
        st.context_hash = belayer.prefix_hash(ctx)
        st.state = hashlib.sha256(await env.read("/work/notes")).hexdigest()[:16]
    return st


async def run(client: belayer.AsyncClient, tag: str, root: str, n: int, turns: int, every: int,
              faults: bool) -> Dict[int, Stats]:
    plan = {0: ("env", max(2, turns - 1)), 1: ("command", 2)} if faults else {}
    names = [f"{tag}-{i}" for i in range(n)]
    res = await asyncio.gather(*(
        trajectory(client, names[i], root, turns, every, *plan.get(i, (None, 0)))
        for i in range(n)))
    return dict(zip(range(n), res))


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=belayer.default_socket())
    ap.add_argument("--root", required=True, help="the environments' base directory")
    ap.add_argument("-n", type=int, default=3, help="trajectories")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--every", type=int, default=2, help="checkpoint every K turns")
    a = ap.parse_args()
    client = belayer.AsyncClient(a.socket, timeout=60)
    ref = await run(client, "ref", a.root, a.n, a.turns, a.every, faults=False)
    got = await run(client, "run", a.root, a.n, a.turns, a.every, faults=True)
    print(f"{'trajectory':<12}{'turns':>6}{'failures':>9}{'redone':>8}{'tok lost':>9}"
          f"{'ckpts':>6}{'policy':>7}  equal to failure-free")
    ok = True
    for i in range(a.n):
        g, r = got[i], ref[i]
        same = (g.context_hash, g.state, g.turns) == (r.context_hash, r.state, r.turns)
        ok &= same
        print(f"{'run-%d' % i:<12}{g.turns:>6}{g.failures:>9}{g.turns_redone:>8}"
              f"{g.tokens_dropped:>9}{g.checkpoints:>6}{g.policy_checkpoints:>7}  "
              f"{'yes' if same else 'NO'} (context {g.context_hash:016x}, notes {g.state})")
        for line in g.log:
            print(f"    {line}")
    print("every trajectory equals its failure-free run" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
