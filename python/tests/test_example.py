# SPDX-License-Identifier: MIT
"""examples/agent_rollout.py at a small size: with an environment killed mid-command and a
command killed mid-run, every trajectory ends equal to its failure-free run."""

from __future__ import annotations

import subprocess
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_rollout.py"


def test_agent_rollout_small(supervisor) -> None:
    if supervisor.proc is None or supervisor.proc.poll() is not None:
        supervisor.start()
    r = subprocess.run(["/usr/bin/python3", str(EXAMPLE), "--socket", supervisor.sock,
                        "--root", str(supervisor.base), "-n", "2", "--turns", "4"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("run-")]
    assert len(rows) == 2 and all(row[7] == "yes" for row in rows), r.stdout
    assert [int(row[2]) for row in rows] == [1, 1], f"each trajectory failed once:\n{r.stdout}"
    assert "every trajectory equals its failure-free run" in r.stdout
