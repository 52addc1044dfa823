# SPDX-License-Identifier: MIT
"""PrefixTracker: the turn/prefix contract (pure unit tests)."""

from __future__ import annotations

import hashlib
import struct

import pytest

import belayer
from belayer import PrefixMismatch, PrefixTracker, prefix_hash


def reference_hash(tokens):
    h = hashlib.blake2b(digest_size=8, person=b"belayer-prefix")
    for t in tokens:
        h.update(struct.pack("<Q", t))
    return int.from_bytes(h.digest(), "little")


class M:  # what restore() returns, as far as rewind reads it
    def __init__(self, turn, plen, phash):
        self.turn, self.prefix_tokens, self.prefix_hash = turn, plen, phash


def test_hash_is_the_documented_one() -> None:
    toks = [0, 1, 151643, (1 << 64) - 1, 7]
    assert prefix_hash(toks) == reference_hash(toks)
    assert prefix_hash([]) == reference_hash([])
    assert prefix_hash([1, 2]) != prefix_hash([2, 1])
    # Pinned: a change of the hash breaks every stored checkpoint's contract.
    assert prefix_hash([1, 2, 3]) == reference_hash([1, 2, 3]) == int.from_bytes(
        hashlib.blake2b(struct.pack("<3Q", 1, 2, 3), digest_size=8,
                        person=b"belayer-prefix").digest(), "little")
    with pytest.raises(ValueError):
        prefix_hash([-1])


def test_marks_are_incremental_prefix_hashes() -> None:
    prompt, t1, t2 = [5, 6, 7], [8, 9], [10]
    tr = PrefixTracker(prompt)
    assert tr.mark(0) == belayer.TurnMark(0, 3, prefix_hash(prompt))
    m1 = tr.add_turn(t1)
    m2 = tr.add_turn(t2)
    assert m1 == belayer.TurnMark(1, 5, prefix_hash(prompt + t1))
    assert m2 == belayer.TurnMark(2, 6, prefix_hash(prompt + t1 + t2))
    assert m2.checkpoint_args() == {"turn": 2, "prefix_tokens": 6,
                                    "prefix_hash": prefix_hash(prompt + t1 + t2)}
    assert (tr.turn, tr.tokens) == (2, 6)


def test_rewind_drops_later_turns_and_continues() -> None:
    tr = PrefixTracker([1, 2])
    m1 = tr.add_turn([3, 4, 5])
    tr.add_turn([6])
    tr.add_turn([7, 8])
    rw = tr.rewind(M(m1.turn, m1.prefix_tokens, m1.prefix_hash))
    assert rw == belayer.Rewind(turn=1, prefix_tokens=5, turns_dropped=2, tokens_dropped=3)
    assert (tr.turn, tr.tokens) == (1, 5)
    # The context goes on from the restored turn as if the dropped turns never happened.
    m2 = tr.add_turn([60, 61])
    assert m2 == belayer.TurnMark(2, 7, prefix_hash([1, 2, 3, 4, 5, 60, 61]))
    # Nothing to drop when the checkpoint is the last turn.
    assert tr.rewind(M(2, 7, m2.prefix_hash)).turns_dropped == 0
    # Back to the prompt.
    assert tr.rewind(M(0, 2, prefix_hash([1, 2]))) == belayer.Rewind(0, 2, 2, 5)


def test_rewind_refuses_a_foreign_prefix() -> None:
    tr = PrefixTracker([1])
    m = tr.add_turn([2])
    with pytest.raises(PrefixMismatch):
        tr.rewind(M(1, m.prefix_tokens, m.prefix_hash ^ 1))
    with pytest.raises(PrefixMismatch):
        tr.rewind(M(1, m.prefix_tokens + 1, m.prefix_hash))
    with pytest.raises(PrefixMismatch):
        tr.rewind(M(5, 0, 0))
    # The refused rewinds changed nothing.
    assert (tr.turn, tr.tokens) == (1, 2)


def test_with_a_real_checkpoint(client: belayer.Client, supervisor) -> None:
    tr = PrefixTracker(list(range(100)))
    with client.create("py-prefix", root=str(supervisor.base)) as env:
        for turn in range(1, 4):
            r = env.exec(f"echo {turn} >> /work/log; cat /work/log")
            tr.add_turn([1000 + turn] * 5 + list(r.stdout))
            if turn == 2:
                env.checkpoint(**tr.mark().checkpoint_args(), trajectory="tp")
        rw = tr.rewind(env.restore())
        assert (rw.turn, rw.turns_dropped) == (2, 1)
        assert rw.tokens_dropped == 5 + len(b"1\n2\n3\n")
        assert env.read("/work/log") == b"1\n2\n"
