# SPDX-License-Identifier: MIT
"""Fixtures: a real supervisor (BELAYER_SUPERVISOR: its binary) on a temporary directory,
with a cgroup v2 parent under /sys/fs/cgroup/unified and an empty base root, as
tests/helpers/test-lib.sh's env_fixture makes; every environment, mount and cgroup is
removed at the end, failed or not."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree's package

import belayer  # noqa: E402

UNIFIED = Path("/sys/fs/cgroup/unified")


class Supervisor:
    def __init__(self, binary: str, tmp: Path, cg: Path) -> None:
        self.binary, self.dir, self.cg = binary, tmp, cg
        self.sock = str(tmp / "sv.sock")
        self.log = tmp / "sv.log"
        self.base = tmp / "base"
        self.proc: "subprocess.Popen[bytes] | None" = None
        for d in ("usr", "etc", "dev", "proc", "tmp", "work"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        for link in ("bin", "lib", "lib64", "sbin"):
            (self.base / link).symlink_to(f"usr/{link}")
        (tmp / "conf.ini").write_text(
            f"[supervisor]\nsocket = {self.sock}\nstate_dir = {tmp}/state\n"
            "[journal]\nenabled = no\n[health]\ninterval = 0\n"
            f"[env]\ncgroup = {cg}\ntrace = no\n")

    def start(self) -> None:
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        start = self.log.stat().st_size if self.log.exists() else 0
        log = open(self.log, "ab")
        self.proc = subprocess.Popen([self.binary, "-c", str(self.dir / "conf.ini")],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        for _ in range(400):
            if b"Listening on" in self.log.read_bytes()[start:]:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.025)
        raise RuntimeError(f"supervisor did not start: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def cleanup(self) -> None:
        self.stop()
        envs = self.dir / "state" / "envs"
        if self.cg.is_dir():
            for sub in self.cg.iterdir():
                if sub.is_dir():
                    try:
                        (sub / "cgroup.kill").write_text("1")
                    except OSError:
                        pass
        if envs.is_dir():
            for e in envs.iterdir():
                for m in ("root", "disk"):
                    subprocess.run(["umount", "-l", str(e / m)], stderr=subprocess.DEVNULL)
        # The killed trees leave their cgroups once the kernel has reaped them: the v2 ones
        # and their v1 mirrors (limits, device rules: <mount><own cgroup>/<name>/ENV), as
        # tests/helpers/test-lib.sh's env_fixture_cleanup removes them.
        for _ in range(50):
            for d in [*(p for p in (self.cg.iterdir() if self.cg.is_dir() else []) if p.is_dir()),
                      self.cg]:
                try:
                    d.rmdir()
                except OSError:
                    pass
            mirrors = subprocess.run(
                ["find", "/sys/fs/cgroup", "-mindepth", "2", "-maxdepth", "8", "-type", "d",
                 "-name", self.cg.name], capture_output=True, text=True).stdout.split()
            for m in map(Path, mirrors):
                for d in [*(p for p in m.iterdir() if p.is_dir()), m]:
                    try:
                        d.rmdir()
                    except OSError:
                        pass
            if not self.cg.exists() and not mirrors:
                break
            time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def supervisor() -> Iterator[Supervisor]:
    binary = os.environ.get("BELAYER_SUPERVISOR")
    if not binary:
        pytest.fail("BELAYER_SUPERVISOR (the supervisor binary) is not set; run through meson")
    if os.geteuid() != 0 or not (UNIFIED / "cgroup.procs").exists():
        pytest.fail("needs root and a cgroup v2 hierarchy at /sys/fs/cgroup/unified")
    tmp = Path(tempfile.mkdtemp(prefix="belayer-pytest."))
    sv = Supervisor(binary, tmp, UNIFIED / f"belayer-pytest-{os.getpid()}")
    try:
        sv.start()
        yield sv
    finally:
        sv.cleanup()


@pytest.fixture
def client(supervisor: Supervisor) -> belayer.Client:
    if supervisor.proc is None or supervisor.proc.poll() is not None:
        supervisor.start()
    return belayer.Client(supervisor.sock, timeout=30)


@pytest.fixture
def aclient(supervisor: Supervisor) -> belayer.AsyncClient:
    if supervisor.proc is None or supervisor.proc.poll() is not None:
        supervisor.start()
    return belayer.AsyncClient(supervisor.sock, timeout=30)
