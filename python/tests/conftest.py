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
                subprocess.run(["umount", "-l", str(e / "root")], stderr=subprocess.DEVNULL)
        # The killed trees leave their cgroups once the kernel has reaped them.
        for _ in range(100):
            if self.cg.is_dir():
                for sub in self.cg.iterdir():
                    if sub.is_dir():
                        try:
                            sub.rmdir()
                        except OSError:
                            pass
                try:
                    self.cg.rmdir()
                except OSError:
                    time.sleep(0.05)
                    continue
            break
        # The v1 cgroups of the environments' limits mirror the v2 parent's name.
        for hier in Path("/sys/fs/cgroup").iterdir():
            v1 = hier / self.cg.name
            if hier.name != "unified" and v1.is_dir():
                for sub in sorted(v1.glob("**/"), key=lambda p: -len(p.parts)):
                    try:
                        sub.rmdir()
                    except OSError:
                        pass
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
