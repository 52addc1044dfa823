# SPDX-License-Identifier: MIT
"""The turn/prefix contract (README "The turn/prefix contract for RL frameworks") as an API.

The supervisor stores a checkpoint's turn, prefix length and prefix hash and hands them back
on restore; it never computes the hash. This module defines it, so every framework computes
the same one: BLAKE2b with an 8-byte digest and the personalization b"belayer-prefix", over
the token ids of the prefix, each as an unsigned 64-bit little-endian integer; the digest read
as a little-endian integer is prefix_hash. The empty prefix hashes to that of no bytes.

    tracker = PrefixTracker(prompt_tokens)        # turn 0: the prompt
    ...                                           # turn N: action + observation went in
    mark = tracker.add_turn(action_tokens + observation_tokens)
    env.checkpoint(**mark.checkpoint_args())     # turn, prefix_tokens, prefix_hash
    ...                                           # after a failure:
    rw = tracker.rewind(env.restore())            # PrefixMismatch if it is not our prefix
    context = context[:rw.prefix_tokens]          # rw.turns_dropped, rw.tokens_dropped
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Sequence

from .errors import PrefixMismatch

_PERSON = b"belayer-prefix"
_MAX_TOKEN = (1 << 64) - 1


def _pack(tokens: Sequence[int]) -> bytes:
    try:
        return struct.pack(f"<{len(tokens)}Q", *tokens)
    except struct.error:
        raise ValueError("token ids must be ints in 0..2^64-1") from None


def prefix_hash(tokens: Sequence[int]) -> int:
    """The contract's hash of a whole token prefix."""
    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    h.update(_pack(list(tokens)))
    return int.from_bytes(h.digest(), "little")


@dataclass(frozen=True)
class TurnMark:
    """Where turn ends in the context: what a checkpoint after that turn records."""

    turn: int
    prefix_tokens: int
    prefix_hash: int

    def checkpoint_args(self) -> Dict[str, int]:
        """Keyword arguments for Client.checkpoint / Environment.checkpoint."""
        return {"turn": self.turn, "prefix_tokens": self.prefix_tokens,
                "prefix_hash": self.prefix_hash}


@dataclass(frozen=True)
class Rewind:
    """What to drop after a restore: keep turns 0..turn and the first prefix_tokens tokens."""

    turn: int
    prefix_tokens: int
    turns_dropped: int
    tokens_dropped: int


class PrefixTracker:
    """The token boundaries of a trajectory's turns and their prefix hashes.

    Turn 0 is the initial prompt (tokens given to the constructor); add_turn appends turn
    1, 2, ... (what the turn added to the context: the model's action and the environment's
    observation). Hashing is incremental: a turn costs its own tokens, not the prefix's."""

    def __init__(self, initial_tokens: Iterable[int] = ()) -> None:
        self._h = hashlib.blake2b(digest_size=8, person=_PERSON)
        self._marks: List[TurnMark] = []
        self._states: List[Any] = []
        self._n = 0
        self._push(list(initial_tokens))

    def _push(self, tokens: List[int]) -> TurnMark:
        self._h.update(_pack(tokens))
        self._n += len(tokens)
        mark = TurnMark(len(self._marks), self._n, int.from_bytes(self._h.digest(), "little"))
        self._marks.append(mark)
        self._states.append(self._h.copy())
        return mark

    def add_turn(self, tokens: Iterable[int]) -> TurnMark:
        """Append the next turn's tokens; returns its mark (pass it to checkpoint)."""
        return self._push(list(tokens))

    @property
    def turn(self) -> int:
        """The last turn added (0: only the prompt)."""
        return len(self._marks) - 1

    @property
    def tokens(self) -> int:
        """Tokens in the context so far."""
        return self._n

    def mark(self, turn: int = -1) -> TurnMark:
        """The mark of turn (default: the last one)."""
        return self._marks[turn]

    def rewind(self, manifest: Any) -> Rewind:
        """After a restore: manifest is what restore() returned (anything with turn,
        prefix_tokens and prefix_hash). Checks the checkpoint's prefix is this context's,
        forgets the later turns, and says how much to drop. PrefixMismatch otherwise: the
        checkpoint was not taken with this tracker's marks (or another trajectory's)."""
        turn, plen, phash = manifest.turn, manifest.prefix_tokens, manifest.prefix_hash
        if turn >= len(self._marks):
            raise PrefixMismatch(f"checkpoint of turn {turn}, but the context has only "
                                 f"{self.turn} turns")
        mark = self._marks[turn]
        if (mark.prefix_tokens, mark.prefix_hash) != (plen, phash):
            raise PrefixMismatch(
                f"checkpoint of turn {turn} recorded {plen} tokens hashing to {phash:#018x}; "
                f"this context has {mark.prefix_tokens} hashing to {mark.prefix_hash:#018x}")
        rw = Rewind(turn, plen, self.turn - turn, self._n - plen)
        del self._marks[turn + 1:]
        del self._states[turn + 1:]
        self._h = self._states[turn].copy()
        self._n = plen
        return rw
