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
        assert (target / "belayer_tag.py").exists()  # the engine import hook ships with it
        r = subprocess.run(["/usr/bin/python3", "-I", "-c",
                            f"import sys; sys.path.insert(0, {str(target)!r}); import belayer; "
                            "print(belayer.__file__, belayer.Client, belayer.AsyncClient)"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and str(target) in r.stdout, r.stderr


def test_readme_venv_install() -> None:
    """The README's command, as a user types it: a venv of Debian's python3 with system site
    packages (python3-msgpack, python3-wheel), then pip from it, offline."""
    with tempfile.TemporaryDirectory(prefix="belayer-venv.") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("tests", "__pycache__",
                                                                  "build", "*.egg-info"))
        venv = Path(tmp) / "venv"
        r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                            str(venv)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index",
                            "--no-build-isolation", str(src)],
                           capture_output=True, text=True, cwd=tmp)
        assert r.returncode == 0, r.stdout + r.stderr
        r = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import belayer, msgpack; print(belayer.__file__)"],
                           capture_output=True, text=True, cwd=tmp)
        assert r.returncode == 0 and str(venv) in r.stdout, r.stdout + r.stderr
