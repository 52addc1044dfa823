# SPDX-License-Identifier: MIT
"""belayer_tag (python/belayer_tag.py) under the real shim, without vLLM (review finding A2).

An environment gets the hook the way the README tells operators (`python -m belayer_tag
install` into a venv), then a vLLM-like worker (tag-hook-worker.py on the stand-in package
engines/vllm, real module/class/method names) runs in it under LD_PRELOAD=libbelayer.so with
the emulated libcuda, announcing to shim-receiver. Each allocation's class must be the truth:
weights only inside load_model, KV only inside initialize_kv_cache_tensors, every block
table, workspace and graph pool `other` — as a primary, and as a shadow (BELAYER_ROLE=shadow),
where the block table must read back what was written to it after a write into the KV cache
(scratch aliasing, finding A2). The same worker without the hook (the heuristic) must not
pass: that is what the hook changes.

Usage: test-tag-hook.py LIBBELAYER EMU_LIB_DIR SHIM_RECEIVER [--no-hook]
       (--no-hook: expect the truth without the hook, to show the heuristic failing)
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TIMEOUT = 30

TRUTH = {
    "block_table": "other",
    "weights0": "weights",
    "weights1": "weights",
    "attn_workspace": "other",
    "block_table_final": "other",
    "kv0": "kv",
    "kv1": "kv",
    "graph_pool": "other",
}


def wait_for(pred, what):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    sys.exit(f"timed out waiting for {what}")


def run(args, python, tmp, name, role="primary"):
    """Runs the worker with `python` as `role`; returns ({allocation: class} as announced,
    what the block table read back)."""
    sock, out = tmp / f"{name}.sock", tmp / f"{name}.txt"
    emu_dir = tmp / f"{name}-emu"
    emu_dir.mkdir()
    recv = subprocess.Popen([args.receiver, str(sock), str(out)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "BELAYER_EMU_DIR": str(emu_dir)})
    try:
        if recv.stdout.readline().strip() != "ready":
            sys.exit("shim-receiver did not start")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(LD_PRELOAD=args.shim, LD_LIBRARY_PATH=args.emu_lib_dir,
                   BELAYER_SOCKET=str(sock), BELAYER_EMU_DIR=str(emu_dir),
                   BELAYER_ROLE=role, PYTHONPATH=str(HERE / "engines"),
                   PYTHONDONTWRITEBYTECODE="1")
        worker = subprocess.Popen([python, str(HERE / "tag-hook-worker.py")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        line = worker.stdout.readline()
        if not line:
            worker.wait(TIMEOUT)
            sys.exit(f"worker ({name}) exited {worker.returncode} without output")
        vas = json.loads(line)
        reads = vas.pop("block_table_reads")

        def announced():
            text = out.read_text() if out.exists() else ""
            return {k: m.group(1) for k, va in vas.items()
                    if (m := re.search(rf"^(?:announce|shadow-region) .* va={va} .*class=(\w+) ",
                                            text, re.M))}

        wait_for(lambda: len(announced()) == len(vas), f"{name}: every allocation announced")
        worker.stdin.close()
        if worker.wait(TIMEOUT) != 0:
            sys.exit(f"worker ({name}) exited {worker.returncode}")
        return announced(), reads
    finally:
        recv.terminate()
        recv.wait(TIMEOUT)


def report(name, got):
    wrong = {k: f"{got.get(k)} (want {v})" for k, v in TRUTH.items() if got.get(k) != v}
    print(f"{name}: " + ", ".join(f"{k}={got.get(k)}" for k in TRUTH))
    return wrong


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("shim")
    parser.add_argument("emu_lib_dir")
    parser.add_argument("receiver")
    parser.add_argument("--no-hook", action="store_true")
    args = parser.parse_args()
    no_hook = args.no_hook
    with tempfile.TemporaryDirectory(prefix="belayer-tag-hook.") as t:
        tmp = Path(t)
        # An engine environment with the hook installed as the README says.
        venv = tmp / "venv"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)],
                       check=True)
        subprocess.run([str(venv / "bin" / "python"), str(ROOT / "python" / "belayer_tag.py"),
                        "install"], check=True, stdout=subprocess.DEVNULL)
        python = "/usr/bin/python3" if no_hook else str(venv / "bin" / "python")
        label = "without the hook" if no_hook else "with the hook"
        for role in ("primary", "shadow"):
            got, reads = run(args, python, tmp, role, role)
            wrong = report(f"{label}, {role}", got)
            print(f"{label}, {role}: the block table reads back {reads!r}")
            if wrong:
                sys.exit(f"{role}: misclassed: " +
                         "; ".join(f"{k} {v}" for k, v in wrong.items()))
            # In a shadow, weights and KV are scratch, aliased with each other: the block
            # table must have memory of its own.
            if reads != "block-table-rows":
                sys.exit(f"{role}: the block table reads back {reads!r}")
        if no_hook:
            return
        # Control: the same worker in an environment without the hook.
        got, reads = run(args, "/usr/bin/python3", tmp, "control", "shadow")
        print(f"without the hook, shadow: the block table reads back {reads!r}")
        if not report("without the hook, shadow", got):
            sys.exit("the heuristic alone got every class right: this test shows nothing")


if __name__ == "__main__":
    main()
