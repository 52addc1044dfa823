# SPDX-License-Identifier: MIT
"""A small PyTorch training program for the shim-pytorch check (tests/gpu/README.md).

Runs on one GPU with a torch.distributed NCCL process group of world size 1: a few large
allocations holding known values, a small MLP trained for a few steps with its gradients
all-reduced over NCCL. Prints one JSON line with the timings and, when --receiver-log names
the output of tests/shim/shim-receiver (the shim's test receiver), whether every caching-allocator
segment of at least --threshold bytes was announced by libbelayer.so with a class.

Run it with and without LD_PRELOAD=libbelayer.so and compare alloc_s / loop_s; run.sh does.
Exit status 0 when the program ran correctly (and, with --receiver-log, every large segment
was covered by announced regions), 1 otherwise.
"""

import argparse
import json
import os
import sys
import time

from receiver_log import announcements

CLASSES = ("weights", "kv", "nccl", "other")


def parse_receiver_log(path, pid):
    """Announced regions of process pid: a list of (va, size, class)."""
    return [(a["va"], a["size"], a.get("class", "?")) for a in announcements(path, pid)]


def covered_bytes(start, size, regions):
    """Bytes of [start, start + size) inside the union of the announced regions."""
    end = start + size
    spans = sorted((max(va, start), min(va + sz, end)) for va, sz, _ in regions
                   if va < end and va + sz > start)
    total, cur = 0, start
    for lo, hi in spans:
        lo = max(lo, cur)
        if hi > lo:
            total += hi - lo
            cur = hi
    return total


def check_coverage(segments, regions):
    """Segments (address, size) not fully covered by announced regions."""
    return [(a, s) for a, s in segments if covered_bytes(a, s, regions) < s]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True, help="directory for the FileStore rendezvous")
    ap.add_argument("--receiver-log", help="shim-receiver's output file")
    ap.add_argument("--threshold", type=int, default=2 << 20,
                    help="smallest segment that must be announced (BELAYER_ALLOC_THRESHOLD)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--big-mib", type=int, default=256, help="size of each large allocation")
    ap.add_argument("--wait-s", type=float, default=20.0,
                    help="how long announcements may lag behind the allocations")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    out = {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"),
           "shim": "libbelayer" in os.environ.get("LD_PRELOAD", ""),
           "torch": torch.__version__, "errors": []}
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method="file://" + os.path.join(args.store, "store"),
                            rank=0, world_size=1, device_id=dev)

    # Weights-like: a few large allocations with known contents.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    big = [torch.full((args.big_mib << 20,), i + 1, dtype=torch.uint8, device=dev)
           for i in range(4)]
    torch.cuda.synchronize()
    out["alloc_s"] = round(time.perf_counter() - t0, 4)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 4096, device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        return loss

    for _ in range(3):  # warm-up: cuBLAS handles, NCCL buffers, allocator segments
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    out["loop_s"] = round(time.perf_counter() - t0, 4)
    out["steps"] = args.steps
    out["loss"] = float(loss)
    if not torch.isfinite(loss).item():
        out["errors"].append("loss is not finite")
    for i, b in enumerate(big):
        if not bool((b == i + 1).all()):
            out["errors"].append(f"large allocation {i} lost its contents")

    segments = [(s["address"], s["total_size"]) for s in torch.cuda.memory_snapshot()
                if s["total_size"] >= args.threshold]
    out["segments"] = len(segments)
    out["segment_bytes"] = sum(s for _, s in segments)
    out["max_reserved"] = torch.cuda.max_memory_reserved(dev)

    if args.receiver_log:
        # Announcements travel through the shim's queue and thread: wait for them, bounded.
        deadline = time.monotonic() + args.wait_s
        while True:
            regions = parse_receiver_log(args.receiver_log, os.getpid())
            missing = check_coverage(segments, regions)
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        classes = {}
        for _, _, c in regions:
            classes[c] = classes.get(c, 0) + 1
        out["announced"] = len(regions)
        out["classes"] = classes
        out["uncovered"] = [f"0x{a:x}+{s}" for a, s in missing]
        if missing:
            out["errors"].append(f"{len(missing)} of {len(segments)} segments >= "
                                 f"{args.threshold} bytes not announced")
        bad = sorted({c for _, _, c in regions if c not in CLASSES})
        if bad:
            out["errors"].append("regions without a class: " + ",".join(bad))
        if not regions:
            out["errors"].append("nothing announced")

    dist.destroy_process_group()
    out["ok"] = not out["errors"]
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
