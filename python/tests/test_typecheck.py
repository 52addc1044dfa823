# SPDX-License-Identifier: MIT
"""The package is typed (py.typed) and its annotations hold: mypy --strict passes (Debian's
mypy, from tools/dev setup)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]


def test_mypy_strict() -> None:
    with tempfile.TemporaryDirectory(prefix="belayer-mypy.") as cache:
        r = subprocess.run(["/usr/bin/python3", "-m", "mypy", "--strict", "--cache-dir", cache,
                            "belayer"], cwd=SRC, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
