# SPDX-License-Identifier: MIT
"""The reply decoder on random and mutated packets: it returns a message or raises
ProtocolError, nothing else, and closes every fd it is given when it refuses."""

from __future__ import annotations

import os
import random

import msgpack

from belayer import ProtocolError
from belayer import _proto as P

SEEDS = [
    {"v": 1, "t": 14, "re": 30, "n": 1},
    {"v": 1, "t": 4, "code": 2, "re": 33, "msg": "env exec x: no such environment"},
    {"v": 1, "t": 34, "fd": 1, "data": b"hello\n"},
    {"v": 1, "t": 35, "code": 0, "sig": 0, "tmo": 0, "trunc": 0, "us": 5, "nout": 6, "nerr": 0,
     "pid": 2},
    {"v": 1, "t": 61, "ev": 1, "traj": "t", "env": "e", "act": 1, "why": "bubble", "bub": 1,
     "berr": 2, "cost": 3, "cerr": 4, "held": 0, "ckpt": "", "ckus": 0, "abrt": 0},
    {"v": 1, "t": 9, "pid": 1, "uid": 0, "eng": "e", "role": 0, "rank": -1,
     "devs": [b"\x01" * 16], "state": 0, "nreg": 0, "bytes": 0, "ms": 0},
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and b:
            del b[rng.randrange(len(b)):][: rng.randint(1, 8)]
        elif op == 2:
            b[rng.randrange(len(b) + 1):0] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif b:
            b[rng.randrange(len(b))] = rng.choice([0xc1, 0xdc, 0xdd, 0xde, 0xdf, 0xd9, 0xdb, 0xc6])
    return bytes(b)


def test_decoder_survives_mutations() -> None:
    rng = random.Random(21)
    packets = [msgpack.packb(s, use_bin_type=True) for s in SEEDS]
    for p in packets:
        P.decode(p, [])  # every seed is valid
    ok = bad = 0
    for _ in range(20000):
        data = mutate(rng, rng.choice(packets)) if rng.random() < 0.9 else os.urandom(rng.randint(0, 64))
        try:
            P.decode(data, [])
            ok += 1
        except ProtocolError:
            bad += 1
    assert bad > 10000 and ok > 100, (ok, bad)


def test_refused_packets_close_their_fds() -> None:
    rng = random.Random(7)
    for _ in range(200):
        r, w = os.pipe()
        os.close(w)
        try:
            P.decode(os.urandom(rng.randint(0, 32)), [r])
        except ProtocolError:
            try:
                os.fstat(r)
            except OSError:
                continue
            raise AssertionError("fd left open")
        raise AssertionError("random bytes with an fd accepted")
