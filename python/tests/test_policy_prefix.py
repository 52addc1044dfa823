# SPDX-License-Identifier: MIT
"""A checkpoint the policy takes in a bubble records the context's prefix the step end gave
(PROTO_TRAJ_STEP "pfx", "phash"), so that a framework rewinds after restoring it exactly as
after restoring one of its own checkpoints; without the prefix the tracker refuses it."""
import errno
import os
import tempfile
import time
from pathlib import Path

import pytest

import belayer
from conftest import UNIFIED, Supervisor


@pytest.fixture
def every_turn() -> "Supervisor":
    binary = os.environ["BELAYER_SUPERVISOR"]
    tmp = Path(tempfile.mkdtemp(prefix="belayer-pytest-policy."))
    sv = Supervisor(binary, tmp, UNIFIED / f"belayer-pytest-policy-{os.getpid()}")
    conf = tmp / "conf.ini"
    conf.write_text(conf.read_text() + "[policy]\nmode = every-turn\n")
    try:
        sv.start()
        yield sv
    finally:
        sv.cleanup()


def idle(call):
    """call, again while the policy's checkpoint still commits (EBUSY after its thaw)."""
    for _ in range(600):
        try:
            return call()
        except belayer.SupervisorError as e:
            if e.errno != errno.EBUSY:
                raise
        time.sleep(0.05)
    return call()


def policy_checkpoint(env, turn: int) -> belayer.Manifest:
    """The policy's checkpoint of turn, once committed."""
    for _ in range(600):
        done = [c for c in idle(env.checkpoints) if c.turn == turn]
        if done:
            return done[-1]
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint of turn {turn}")


def test_bubble_checkpoint_carries_the_prefix(every_turn: Supervisor) -> None:
    client = belayer.Client(every_turn.sock, timeout=60)
    tr = belayer.PrefixTracker([1, 2, 3])
    with client.create("pfx", root=str(every_turn.base)) as env:
        env.write("/work/notes", "turn-1\n")
        mark = tr.add_turn([10, 11, 12])
        d = env.step_end("traj-pfx", **mark.step_args())
        assert d.action == "checkpoint-sync", d
        env.step_begin("traj-pfx", turn=mark.turn, output_tokens=3)
        m = policy_checkpoint(env, mark.turn)
        assert m.trajectory == "traj-pfx"
        assert (m.prefix_tokens, m.prefix_hash) == (mark.prefix_tokens, mark.prefix_hash)
        # the next turn, then a failure: the policy's checkpoint rewinds like the framework's
        idle(lambda: env.write("/work/notes", "turn-2\n"))
        tr.add_turn([20, 21])
        rw = tr.rewind(idle(lambda: env.restore(m.checkpoint)))
        assert (rw.turn, rw.prefix_tokens, rw.turns_dropped) == (mark.turn, 6, 1)
        assert idle(lambda: env.read("/work/notes")) == b"turn-1\n"
        # a step end without the prefix: its checkpoint cannot be rewound to, and says so
        mark = tr.add_turn([30])
        env.step_end("traj-pfx", turn=mark.turn)
        env.step_begin("traj-pfx", turn=mark.turn)
        m = policy_checkpoint(env, mark.turn)
        assert m.prefix_tokens == 0
        with pytest.raises(belayer.PrefixMismatch):
            tr.rewind(idle(lambda: env.restore(m.checkpoint)))
