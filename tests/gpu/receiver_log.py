# SPDX-License-Identifier: MIT
"""Reading the output of tests/shim/shim-receiver (the shim's test receiver) for the PyTorch
programs of tests/gpu (shim-torch.py, gpu-exp-torch.py)."""


def announcements(path, pid):
    """The announce lines of process pid in the receiver's output, in order, as dicts of their
    key=value words; va, size and version as ints (version -1 when absent or unreadable)."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        words = line.split()
        if not words or words[0] != "announce":
            continue
        kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        try:
            if int(kv.get("pid", "-1")) != pid:
                continue
            kv["va"] = int(kv["va"], 16)
            kv["size"] = int(kv["size"])
        except (KeyError, ValueError):
            continue
        try:
            kv["version"] = int(kv.get("version", "-1"))
        except ValueError:
            kv["version"] = -1
        out.append(kv)
    return out
