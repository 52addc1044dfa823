# SPDX-License-Identifier: MIT
"""belayer.Client against a real supervisor and real environments."""

from __future__ import annotations

import errno
import subprocess
import threading
from pathlib import Path

import pytest

import belayer


def test_exec_files_checkpoint_restore(client: belayer.Client, supervisor) -> None:
    with client.create("py-sync", root=str(supervisor.base)) as env:
        r = env.exec("echo out; echo err >&2; exit 3", timeout=20)
        assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == (b"out\n", b"err\n", 3, False)
        assert not r.truncated and r.wall_us > 0 and r.status == 3

        r = env.exec(["/bin/cat"], stdin=b"from stdin\x00\xff", timeout=20)
        assert r.ok and r.stdout == b"from stdin\x00\xff"
        r = env.exec("pwd; echo $FOO", cwd="/tmp", env_vars={"FOO": "bar"}, timeout=20)
        assert r.stdout == b"/tmp\nbar\n"

        r = env.exec("sleep 30", timeout=0.5)
        assert r.timed_out and r.status == 124

        r = env.exec("head -c 100000 /dev/zero", max_output=1000, timeout=20)
        assert r.stdout_truncated and len(r.stdout) == 1000 and r.stdout_bytes == 100000

        data = bytes(range(256)) * 100
        assert env.write("/work/blob", data, mode=0o600) == len(data)
        f = env.read_file("/work/blob")
        assert f.data == data and f.mode & 0o7777 == 0o600
        assert env.exec("md5sum < /work/blob | cut -c1-8").stdout.strip()

        env.write("/work/state", "turn-1\n")
        m1 = env.checkpoint(turn=1, prefix_tokens=10, prefix_hash=0xABCDEF, trajectory="t-sync")
        assert (m1.env, m1.turn, m1.prefix_tokens, m1.prefix_hash) == ("py-sync", 1, 10, 0xABCDEF)
        assert m1.checkpoint and m1.trajectory == "t-sync"
        # No tracer in these tests: nothing vouches that the processes did not run.
        assert m1.kind == "full" and m1.commit_us > 0 and m1.path
        # Nor a pre-copy (it copies the tracer's dirty set before the freeze).
        assert (m1.precopy_rounds, m1.precopy_bytes, m1.precopy_frozen_bytes) == (0, 0, 0)
        info = [e for e in client.list() if e.env == "py-sync"][0]
        # The memory mode is the kernel's capability (issue 23 item 3).
        assert info.memory_mode == ("pre-dump" if info.soft_dirty else "full")
        assert info.kind == ""

        env.exec("echo turn-2 > /work/state")
        assert env.read("/work/state") == b"turn-2\n"
        m = env.restore()
        assert m.checkpoint == m1.checkpoint and m.turn == 1 and m.prefix_hash == 0xABCDEF
        assert env.read("/work/state") == b"turn-1\n"
        assert [c.checkpoint for c in env.checkpoints()] == [m1.checkpoint]
        assert "py-sync" in [e.env for e in client.list()]

        forks = env.fork("py-sync-f", count=2)
        try:
            assert [f.id for f in forks] == ["py-sync-f-1", "py-sync-f-2"]
            for f in forks:
                assert f.read("/work/state") == b"turn-1\n"
            forks[0].write("/work/state", "fork-1\n")
            assert forks[1].read("/work/state") == b"turn-1\n"
        finally:
            for f in forks:
                f.destroy()
    assert "py-sync" not in [e.env for e in client.list()]


def test_supervisor_errors_carry_errno(client: belayer.Client, supervisor) -> None:
    with pytest.raises(belayer.SupervisorError) as e:
        client.exec("no-such-env", "true")
    assert e.value.errno == errno.ENOENT and e.value.supervisor_message
    with client.create("py-err", root=str(supervisor.base)) as env:
        with pytest.raises(belayer.SupervisorError) as e:
            env.read("/no/such/file")
        assert e.value.errno == errno.ENOENT
        with pytest.raises(belayer.SupervisorError):
            client.create("py-err", root=str(supervisor.base))
    with pytest.raises(ValueError):
        client.create("py-img", root=str(supervisor.base), image="oci:/x")
    with pytest.raises(belayer.SupervisorError):
        client.create("py-img", image="no-such-image")
    with pytest.raises(ValueError):
        client.create("../bad", root="/")


def test_steps_and_supervisor(client: belayer.Client, supervisor) -> None:
    with client.create("py-step", root=str(supervisor.base)) as env:
        d = env.step_end("traj-sync", turn=1, prompt_tokens=500)
        assert d.event == "end" and d.trajectory == "traj-sync" and d.env == "py-step"
        assert d.action in ("none", "checkpoint", "checkpoint-sync") and d.why
        d = env.step_begin("traj-sync", turn=1, output_tokens=40)
        assert d.event == "begin"
    metrics = client.status()
    assert metrics and all(isinstance(m.name, str) for m in metrics)
    assert client.workers() == []
    ev = client.events(replay=1000, idle_timeout=5)
    try:
        first = next(ev)
        assert first.ts_us > 0 and first.kind
    finally:
        ev.close()
    with pytest.raises(belayer.SupervisorError):
        client.promote("no-such-engine")


def test_environment_killed_mid_exec_restore_and_rewind(client: belayer.Client, supervisor) -> None:
    """The README's loop: an environment killed under a command answers SIGKILL, later calls
    fail, and a restore brings back the checkpointed turn the tracker rewinds to."""
    tr = belayer.PrefixTracker([1, 2, 3])
    with client.create("py-killed", root=str(supervisor.base)) as env:
        env.write("/work/notes", "turn-1\n")
        tr.add_turn([10, 11])
        env.checkpoint(**tr.mark().checkpoint_args(), trajectory="tk")
        env.exec("echo turn-2 >> /work/notes")
        tr.add_turn([20, 21, 22])
        threading.Timer(0.5, lambda: (supervisor.cg / "py-killed" / "cgroup.kill").write_text("1")).start()
        r = env.exec("sleep 20", timeout=30)
        assert r.signal == 9 and not r.timed_out
        with pytest.raises(belayer.SupervisorError):
            env.exec("true")
        rw = tr.rewind(env.restore())
        assert (rw.turn, rw.prefix_tokens, rw.turns_dropped, rw.tokens_dropped) == (1, 5, 1, 3)
        assert env.read("/work/notes") == b"turn-1\n"
        assert env.exec("cat /work/notes").stdout == b"turn-1\n"


def test_create_limits_and_network(client: belayer.Client, supervisor) -> None:
    limits = belayer.Limits(pids=23, memory=256 << 20)
    with client.create("py-lim", root=str(supervisor.base), limits=limits, net="none") as env:
        assert env.info is not None and env.info.net == "none"
        # The v1 cgroups of its init (hybrid hierarchy: pids and memory are v1 here).
        cgs = dict(line.split(":", 2)[1:] for line in
                   Path(f"/proc/{env.info.pid}/cgroup").read_text().splitlines())
        assert (Path("/sys/fs/cgroup/pids" + cgs["pids"]) / "pids.max").read_text() == "23\n"
        mem = Path("/sys/fs/cgroup/memory" + cgs["memory"]) / "memory.limit_in_bytes"
        assert int(mem.read_text()) == 256 << 20
        # Its own network namespace: loopback only.
        r = env.exec("cat /proc/net/dev")
        names = [line.split(b":")[0].strip() for line in r.stdout.splitlines()[2:]]
        assert names == [b"lo"], r.stdout
    with pytest.raises(ValueError):
        client.create("py-lim2", root=str(supervisor.base), net="wifi")


def test_image_environment(client: belayer.Client, supervisor, tmp_path) -> None:
    """An environment from an OCI layout (tests/image/gen-image.py's busybox image), the
    store's images, rm refused while in use."""
    gen = Path(__file__).resolve().parents[2] / "tests" / "image" / "gen-image.py"
    subprocess.run(["/usr/bin/python3", str(gen), str(tmp_path / "oci"), "good"], check=True)
    img = client.import_image(f"oci:{tmp_path / 'oci'}", "py-busybox", timeout=120)
    assert img.name == "py-busybox" and img.n_layers == 2 and img.id
    assert "py-busybox" in [i.name for i in client.images()]
    with client.create("py-image", image="py-busybox", timeout=120) as env:
        r = env.exec(["/bin/sh", "-c", "echo from-image; ls /bin/busybox"])
        assert r.ok and r.stdout == b"from-image\n/bin/busybox\n", r
        with pytest.raises(belayer.SupervisorError) as e:
            client.remove_image("py-busybox")
        assert e.value.errno == errno.EBUSY
    client.remove_image("py-busybox")
    assert "py-busybox" not in [i.name for i in client.images()]
    assert client.gc_images() >= 0
