# SPDX-License-Identifier: MIT
"""belayer_tag (python/belayer_tag.py) under the real shim, without vLLM (review finding A2).

An environment gets the hook the way the README tells operators (`python -m belayer_tag
install` into a venv), then a vLLM-like worker (tag-hook-worker.py on the stand-in package
engines/vllm, real module/class/method names) runs in it under LD_PRELOAD=libbelayer.so with
the emulated libcuda, announcing to shim-receiver. Each allocation's class must be the truth:
weights only inside load_model, KV only inside initialize_kv_cache_tensors, every block
table, workspace and graph pool `other`. The same worker without the hook (the heuristic)
must not pass: that is what the hook changes.

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


def classes(args, python, tmp, name):
    """Runs the worker with `python`; returns {allocation: class} as announced."""
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
                   PYTHONPATH=str(HERE / "engines"), PYTHONDONTWRITEBYTECODE="1")
        worker = subprocess.Popen([python, str(HERE / "tag-hook-worker.py")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        line = worker.stdout.readline()
        if not line:
            worker.wait(TIMEOUT)
            sys.exit(f"worker ({name}) exited {worker.returncode} without output")
        vas = json.loads(line)

        def announced():
            text = out.read_text() if out.exists() else ""
            return {k: m.group(1) for k, va in vas.items()
                    if (m := re.search(rf"^announce .* va={va} .*class=(\w+) ", text, re.M))}

        wait_for(lambda: len(announced()) == len(vas), f"{name}: every allocation announced")
        worker.stdin.close()
        if worker.wait(TIMEOUT) != 0:
            sys.exit(f"worker ({name}) exited {worker.returncode}")
        return announced()
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
        wrong = report("with the hook" if not no_hook else "without the hook",
                       classes(args, python, tmp, "run"))
        if wrong:
            sys.exit("misclassed: " + "; ".join(f"{k} {v}" for k, v in wrong.items()))
        if no_hook:
            return
        # Control: the same worker in an environment without the hook.
        if not report("without the hook", classes(args, "/usr/bin/python3", tmp, "control")):
            sys.exit("the heuristic alone got every class right: this test shows nothing")


if __name__ == "__main__":
    main()
