# SPDX-License-Identifier: MIT
"""belayer_tag, the import hook that tags an unmodified engine's allocations, against a
recording stand-in for the shim's API and fake engine packages with the real module, class
and method names. tests/shim/test-tag-hook.py runs it under the real shim."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Iterator, List

import pytest

SRC = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SRC))

import belayer_tag  # noqa: E402


class Recorder:
    def __init__(self) -> None:
        self.calls: List[str] = []

    def shim(self) -> belayer_tag.Shim:
        def set_tag(tag: bytes) -> int:
            self.calls.append("set " + tag.decode())
            return 0

        return belayer_tag.Shim(set_tag, lambda: self.calls.append("clear"),
                                lambda: self.calls.append("tags_only"))


VLLM_RUNNER = """
class GPUModelRunner:
    def __init__(self, calls):
        self.calls = calls

    def load_model(self, load_dummy_weights=False):
        self.calls.append("in load_model")
        self.initialize_kv_cache_tensors(None, [])  # nested: kv inside weights
        return "model"

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes):
        self.calls.append("in kv")
        if kv_cache_config == "fail":
            raise RuntimeError("out of memory")
        return {}
"""

SGLANG_RUNNER_OLD = """
class ModelRunner:
    def load_model(self):
        pass
"""


def write_engine(root: Path, module: str, text: str) -> None:
    parts = module.split(".")
    d = root
    for p in parts[:-1]:
        d = d / p
        d.mkdir(exist_ok=True)
        (d / "__init__.py").touch()
    (d / (parts[-1] + ".py")).write_text(textwrap.dedent(text))


@pytest.fixture
def engines() -> Iterator[Path]:
    """A directory on sys.path for fake engine packages; the hook and the fakes go after."""
    saved_path, saved_meta = list(sys.path), list(sys.meta_path)
    with tempfile.TemporaryDirectory(prefix="belayer-tag.") as tmp:
        sys.path.insert(0, tmp)
        try:
            yield Path(tmp)
        finally:
            sys.path[:], sys.meta_path[:] = saved_path, saved_meta
            for name in list(sys.modules):
                if name.split(".")[0] in ("vllm", "sglang"):
                    del sys.modules[name]


def test_wraps_at_import_nests_and_restores(engines: Path) -> None:
    write_engine(engines, "vllm.v1.worker.gpu_model_runner", VLLM_RUNNER)
    rec = Recorder()
    assert belayer_tag.install(rec.shim())
    assert "vllm" not in sys.modules  # the hook imports no engine
    assert rec.calls == []

    from vllm.v1.worker import gpu_model_runner  # type: ignore[import-not-found]

    # Positive mode as soon as the runner's module is in, before the runner allocates.
    assert rec.calls == ["tags_only"]
    runner = gpu_model_runner.GPUModelRunner(rec.calls)
    rec.calls.clear()
    assert runner.load_model() == "model"
    assert rec.calls == ["set weights", "in load_model", "set kv", "in kv", "set weights",
                         "clear"]
    rec.calls.clear()
    with pytest.raises(RuntimeError):
        runner.initialize_kv_cache_tensors("fail", [])
    assert rec.calls == ["set kv", "in kv", "clear"]
    # The module keeps its real loader.
    assert not isinstance(gpu_model_runner.__loader__, belayer_tag._Loader)


def test_missing_method_one_line_and_nothing_wrapped(engines: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    write_engine(engines, "sglang.srt.model_executor.model_runner", SGLANG_RUNNER_OLD)
    rec = Recorder()
    assert belayer_tag.install(rec.shim())
    from sglang.srt.model_executor import model_runner  # type: ignore[import-not-found]

    model_runner.ModelRunner().load_model()
    assert rec.calls == []  # not wrapped, positive mode left off
    err = capfd.readouterr().err.splitlines()
    assert err == ["belayer_tag: sglang.srt.model_executor.model_runner.ModelRunner."
                   "init_memory_pool not found: not tagging this engine (the shim keeps its "
                   "phase heuristic)"]


SGLANG_MIXIN = """
class ModelRunnerKVCacheMixin:
    def init_memory_pool(self, pre_model_load_memory):
        self.calls.append("in init_memory_pool")
"""

SGLANG_RUNNER = """
from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin


class ModelRunner(ModelRunnerKVCacheMixin):
    def __init__(self, calls):
        self.calls = calls

    def load_model(self):
        self.calls.append("in load_model")
"""


def test_inherited_method_is_wrapped(engines: Path) -> None:
    """Recent SGLang defines init_memory_pool in a mixin (model_runner_kv_cache_mixin.py)."""
    write_engine(engines, "sglang.srt.model_executor.model_runner_kv_cache_mixin", SGLANG_MIXIN)
    write_engine(engines, "sglang.srt.model_executor.model_runner", SGLANG_RUNNER)
    rec = Recorder()
    assert belayer_tag.install(rec.shim())
    from sglang.srt.model_executor import model_runner

    runner = model_runner.ModelRunner(rec.calls)
    runner.load_model()
    runner.init_memory_pool(0)
    assert rec.calls == ["tags_only", "set weights", "in load_model", "clear", "set kv",
                         "in init_memory_pool", "clear"]


def test_module_imported_before_install_is_patched(engines: Path) -> None:
    write_engine(engines, "vllm.v1.worker.gpu_model_runner", VLLM_RUNNER)
    from vllm.v1.worker import gpu_model_runner

    rec = Recorder()
    assert belayer_tag.install(rec.shim())
    assert rec.calls == ["tags_only"]
    gpu_model_runner.GPUModelRunner(rec.calls).initialize_kv_cache_tensors(None, [])
    assert rec.calls == ["tags_only", "set kv", "in kv", "clear"]


def test_without_the_shim_nothing_is_installed(engines: Path) -> None:
    """This interpreter has no libbelayer.so loaded."""
    before = list(sys.meta_path)
    assert belayer_tag.Shim.find() is None
    assert not belayer_tag.install()
    assert sys.meta_path == before


def test_pth_install_runs_at_startup() -> None:
    """`python3 -m belayer_tag install DIR` writes a .pth that site runs in every interpreter:
    quiet, and inert without the shim."""
    with tempfile.TemporaryDirectory(prefix="belayer-tag-site.") as site_dir:
        r = subprocess.run([sys.executable, str(SRC / "belayer_tag.py"), "install", site_dir],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        pth = Path(site_dir) / belayer_tag.PTH_NAME
        assert r.stdout.strip() == str(pth)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        r = subprocess.run([sys.executable, "-c",
                            f"import site; site.addsitedir({site_dir!r}); import sys; "
                            "print('belayer_tag' in sys.modules, "
                            "[type(f).__name__ for f in sys.meta_path].count('Finder'))"],
                           capture_output=True, text=True, env=env, cwd=site_dir)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert r.stdout.split() == ["True", "0"]
        r = subprocess.run([sys.executable, str(SRC / "belayer_tag.py"), "uninstall", site_dir],
                           capture_output=True, text=True)
        assert r.returncode == 0 and not pth.exists(), r.stderr


def test_mypy_strict() -> None:
    with tempfile.TemporaryDirectory(prefix="belayer-mypy.") as cache:
        r = subprocess.run(["/usr/bin/python3", "-m", "mypy", "--strict", "--cache-dir", cache,
                            "belayer_tag.py"], cwd=SRC, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
