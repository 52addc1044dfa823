# SPDX-License-Identifier: MIT
"""`pip install ./python` works offline with Debian's python3 (setuptools, no build
isolation), and the installed package is complete (py.typed included)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]


def test_offline_pip_install() -> None:
    with tempfile.TemporaryDirectory(prefix="belayer-pip.") as tmp:
        # A copy, so the build's leftovers (build/, *.egg-info) stay out of the source tree.
        src = Path(tmp) / "src"
        shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("tests", "__pycache__",
                                                                  "build", "*.egg-info"))
        target = Path(tmp) / "site"
        r = subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--no-index",
                            "--no-build-isolation", "--no-deps", "--target", str(target),
                            str(src)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert (target / "belayer" / "py.typed").exists()
        r = subprocess.run(["/usr/bin/python3", "-I", "-c",
                            f"import sys; sys.path.insert(0, {str(target)!r}); import belayer; "
                            "print(belayer.__file__, belayer.Client, belayer.AsyncClient)"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and str(target) in r.stdout, r.stderr
