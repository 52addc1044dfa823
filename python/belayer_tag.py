# SPDX-License-Identifier: MIT
"""Tags an unmodified vLLM or SGLang engine's GPU memory for libbelayer.so.

The shim can only guess which allocations are weights and which are the KV cache (its phase
heuristic around the engine's cuMemGetInfo probe), and guesses wrong for index tables such as
vLLM's block tables (review finding A2). This module makes the engine say it instead, without
changing the engine's source: installed as a ``.pth`` file in the engine's Python environment
(``python3 -m belayer_tag install``), it runs at every interpreter start and

* does nothing unless libbelayer.so is loaded in the process (``belayer_set_tag`` resolves in
  ``ctypes.CDLL(None)``);
* then waits, with a ``sys.meta_path`` finder, for a known engine's model-runner module to be
  imported (it never imports an engine itself), and wraps by name the methods that allocate
  weights and KV: ``belayer_set_tag("weights")`` / ``("kv")`` for the call, the previous tag
  restored afterwards (nesting, exceptions);
* and switches the shim to positive classification (``belayer_tags_only()``) when it wraps,
  before the engine allocates anything: from then on every allocation outside those calls is
  ``other`` (real memory in a shadow, never swapped at promotion).

A class or method not found (another engine version) is one line on stderr: nothing is
wrapped for that engine and the shim keeps its heuristic. Standard library only.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

# module -> (class, ((method, tag), ...)). What each call allocates, from the engines' source:
# README.md, "Tagging vLLM and SGLang".
ENGINES: Dict[str, Tuple[str, Tuple[Tuple[str, str], ...]]] = {
    # vLLM v1 (vllm/v1/worker/gpu_model_runner.py): load_model builds the model and loads
    # its parameters; initialize_kv_cache_tensors allocates only the KV tensors
    # (allocate_kv_cache). Its caller initialize_kv_cache also re-creates the input batch
    # (block tables) and the attention metadata builders: those stay untagged, `other`.
    "vllm.v1.worker.gpu_model_runner": (
        "GPUModelRunner",
        (("load_model", "weights"), ("initialize_kv_cache_tensors", "kv")),
    ),
    # SGLang (python/sglang/srt/model_executor/model_runner.py; recent versions define
    # init_memory_pool in model_runner_kv_cache_mixin.py, inherited: found all the same).
    "sglang.srt.model_executor.model_runner": (
        "ModelRunner",
        (("load_model", "weights"), ("init_memory_pool", "kv")),
    ),
}

PTH_NAME = "belayer_tag.pth"

_local = threading.local()


def _log(msg: str) -> None:
    try:
        sys.stderr.write(f"belayer_tag: {msg}\n")
    except Exception:  # a closed stderr must not break the engine
        pass


class Shim:
    """libbelayer.so's tagging API, resolved in the running process."""

    def __init__(self, set_tag: Callable[[bytes], int], clear_tag: Callable[[], None],
                 tags_only: Optional[Callable[[], None]]) -> None:
        self.set_tag = set_tag
        self.clear_tag = clear_tag
        self.tags_only = tags_only

    @classmethod
    def find(cls) -> Optional["Shim"]:
        """The shim's functions, or None when libbelayer.so is not loaded."""
        try:
            import ctypes

            lib = ctypes.CDLL(None)
            set_tag = lib.belayer_set_tag
            clear_tag = lib.belayer_clear_tag
        except (OSError, AttributeError):
            return None
        set_tag.argtypes = [ctypes.c_char_p]
        set_tag.restype = ctypes.c_int
        clear_tag.argtypes = []
        clear_tag.restype = None
        tags_only = getattr(lib, "belayer_tags_only", None)
        if tags_only is not None:
            tags_only.argtypes = []
            tags_only.restype = None
        return cls(set_tag, clear_tag, tags_only)


def _stack() -> List[bytes]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def wrap(fn: Callable[..., Any], tag: str, shim: Shim) -> Callable[..., Any]:
    """fn, with the shim's tag set to `tag` for the call and the previous one restored."""
    btag = tag.encode()

    @functools.wraps(fn)
    def tagged(*args: Any, **kwargs: Any) -> Any:
        stack = _stack()
        stack.append(btag)
        shim.set_tag(btag)
        try:
            return fn(*args, **kwargs)
        finally:
            stack.pop()
            if stack:
                shim.set_tag(stack[-1])
            else:
                shim.clear_tag()

    tagged.__belayer_tag__ = tag  # type: ignore[attr-defined]
    return tagged


def patch(module: Any, shim: Shim) -> bool:
    """Wraps the methods ENGINES lists for this module; all of them or none."""
    clsname, methods = ENGINES[module.__name__]
    cls = getattr(module, clsname, None)
    found = []
    for name, tag in methods:
        fn = getattr(cls, name, None) if cls is not None else None
        if not callable(fn):
            _log(f"{module.__name__}.{clsname}.{name} not found: not tagging this engine "
                 "(the shim keeps its phase heuristic)")
            return False
        found.append((name, tag, fn))
    for name, tag, fn in found:
        if getattr(fn, "__belayer_tag__", None) is None:
            setattr(cls, name, wrap(fn, tag, shim))
    if shim.tags_only is not None:
        shim.tags_only()
    return True


class _Loader:
    """The engine module's own loader, then patch()."""

    def __init__(self, inner: Any, shim: Shim) -> None:
        self._inner = inner
        self._shim = shim

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # The module sees its real loader; only this call goes through us.
        module.__loader__ = self._inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        try:
            patch(module, self._shim)
        except Exception as e:  # never break the engine's import
            _log(f"{module.__name__}: not tagging: {e!r}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Finder:
    """A sys.meta_path finder that hands the ENGINES modules to _Loader."""

    def __init__(self, shim: Shim) -> None:
        self.shim = shim

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in ENGINES:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self.shim)
        return spec


def install(shim: Optional[Shim] = None) -> bool:
    """What the .pth file runs. True when the finder is in place."""
    try:
        if any(isinstance(f, Finder) for f in sys.meta_path):
            return True
        shim = shim or Shim.find()
        if shim is None:
            return False
        for name in ENGINES:
            if name in sys.modules:  # imported before us: patch it now
                patch(sys.modules[name], shim)
        sys.meta_path.insert(0, Finder(shim))
        return True
    except Exception as e:
        _log(f"not installed: {e!r}")
        return False


def _pth_text() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    # A path line first, so the import works from a source checkout too.
    return f"{here}\nimport belayer_tag; belayer_tag.install()\n"


def main(argv: List[str]) -> int:
    usage = "usage: python3 -m belayer_tag install|uninstall [SITE_DIR]"
    if len(argv) not in (1, 2) or argv[0] not in ("install", "uninstall"):
        print(usage, file=sys.stderr)
        return 2
    site_dir = argv[1] if len(argv) == 2 else sysconfig.get_paths()["purelib"]
    pth = os.path.join(site_dir, PTH_NAME)
    if argv[0] == "install":
        with open(pth, "w", encoding="utf-8") as f:
            f.write(_pth_text())
        print(pth)
    elif os.path.exists(pth):
        os.unlink(pth)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
