# SPDX-License-Identifier: MIT
"""belayer.AsyncClient against a real supervisor and real environments."""

from __future__ import annotations

import asyncio
import errno
import time

import pytest

import belayer


def run(coro):
    return asyncio.run(coro)


def test_async_environment_lifecycle(aclient: belayer.AsyncClient, supervisor) -> None:
    async def main() -> None:
        a, b = await asyncio.gather(aclient.create("py-async-a", root=str(supervisor.base)),
                                    aclient.create("py-async-b", root=str(supervisor.base)))
        async with a, b:
            # Two commands side by side: the loop is free while both run.
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            t = asyncio.create_task(ticker())
            t0 = time.monotonic()
            ra, rb = await asyncio.gather(a.exec("sleep 1; echo a", timeout=20),
                                          b.exec(["/bin/sh", "-c", "sleep 1; cat"], stdin="b"))
            wall = time.monotonic() - t0
            t.cancel()
            assert (ra.stdout, rb.stdout) == (b"a\n", b"b")
            # One after the other they would take 2 s at least.
            assert wall < 1.9, f"the two execs did not overlap ({wall:.2f} s)"
            assert ticks >= 20, f"the event loop was blocked ({ticks} ticks in {wall:.2f} s)"

            assert await a.write("/work/f", b"one") == 3
            m = await a.checkpoint(turn=2, prefix_tokens=7, prefix_hash=99, trajectory="ta")
            await a.write("/work/f", b"two")
            r = await a.restore(m.checkpoint)
            assert (r.turn, r.prefix_tokens, r.prefix_hash) == (2, 7, 99)
            assert await a.read("/work/f") == b"one"

            (f,) = await a.fork("py-async-fork")
            async with f:
                assert f.id == "py-async-fork"
                assert await f.read("/work/f") == b"one"

            d = await a.step_end("traj-async", turn=2, prompt_tokens=100)
            assert d.event == "end" and d.env == "py-async-a"
            d = await a.step_begin("traj-async", turn=2, output_tokens=10)
            assert d.event == "begin"
            with pytest.raises(belayer.SupervisorError) as e:
                await a.read("/nope")
            assert e.value.errno == errno.ENOENT
        assert not {"py-async-a", "py-async-b", "py-async-fork"} & {
            e.env for e in await aclient.list()}
        assert await aclient.status()
        assert await aclient.workers() == []
        assert isinstance(await aclient.images(), list)

    run(main())


def test_async_events(aclient: belayer.AsyncClient, supervisor) -> None:
    async def main() -> None:
        it = aclient.events(replay=1000, idle_timeout=5)
        try:
            e = await it.__anext__()
            assert e.ts_us > 0 and e.kind
        finally:
            await it.aclose()

    run(main())
