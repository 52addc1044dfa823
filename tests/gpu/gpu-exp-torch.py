# SPDX-License-Identifier: MIT
"""The PyTorch experiments of the shim review (E2, E7, E8; tests/gpu/README.md).

  gpu-exp-torch.py e2|e7|e8 --shim LIB --socket SOCK --receiver-log FILE --store DIR

Each experiment starts its workloads as child processes of this script (the same file with
--child), with and without LD_PRELOAD=LIB, and prints what experiments.sh reads: detail lines,
then one line "summary: TEXT"; exit 0 = PASS, 1 = FAIL.

  e2  capture interference (review A3): 50 x {all_reduce of a world-size-1 NCCL group on a
      side stream, then at once a torch.cuda.graph capture in the default global mode of a
      matmul plus an allocation that forces a new segment}, under the shim announcing to the
      receiver (its NCCL poller and connection thread running), then the control: the shim
      with BELAYER_NCCL_TRACK=0 and no socket. FAIL when a capture under the shim fails and
      the control's do not.
  e7  PyTorch-level behaviour under the shim: (a) a converted tensor shared with
      torch.multiprocessing to a shimmed child and to an unshimmed one; (b) the pointer
      attributes a ctypes user of libcuda sees (RANGE_START/SIZE, IS_LEGACY_CUDA_IPC_CAPABLE,
      ALLOWED_HANDLE_TYPES, P2P_TOKENS, IS_GPU_DIRECT_RDMA_CAPABLE) with and without the shim;
      (c) the write census: the shim's weights-version announcements after each kind of write
      into a weights region (copy_ H2D non_blocking, D2D contiguous and strided, fill_, zero_,
      cudaMemcpy2D). FAIL only when the shimmed child cannot read the shared tensor or a
      tensor's contents are wrong; the rest are findings in the detail lines.
  e8  conversion cost (review C1): torch.empty + torch.cuda.empty_cache cycles whose segments
      are 2 MiB (a 1 MiB request), 20 MiB, 256 MiB and 2 GiB, with and without the shim: median and p90 latency of the
      allocation and of the free. PASS with the figures unless the workload fails.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from receiver_log import announcements

# cuda.h CUpointer_attribute values (CUDA 13.0 include/cuda.h, enum CUpointer_attribute_enum).
POINTER_ATTRIBUTES = {
    "P2P_TOKENS": 5,
    "IS_LEGACY_CUDA_IPC_CAPABLE": 10,
    "RANGE_START_ADDR": 11,
    "RANGE_SIZE": 12,
    "ALLOWED_HANDLE_TYPES": 14,
    "IS_GPU_DIRECT_RDMA_CAPABLE": 15,
}
MIB = 1 << 20


# --- receiver log (tests/shim/shim-receiver) ----------------------------------------------

def region_of(path, pid, ptr, wait_s=10.0):
    """The announced region holding ptr (the latest announcement), waiting for it bounded."""
    deadline = time.monotonic() + wait_s
    while True:
        hits = [a for a in announcements(path, pid) if a["va"] <= ptr < a["va"] + a["size"]]
        if hits or time.monotonic() > deadline:
            return hits[-1] if hits else None
        time.sleep(0.05)


def max_version(path, pid, region_id):
    return max((a["version"] for a in announcements(path, pid) if a.get("id") == region_id),
               default=-1)


# --- children (run with or without the shim) -----------------------------------------------

def child_env(args, shim, track=True, socket=True):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if shim:
        env["LD_PRELOAD"] = args.shim
        env["BELAYER_ENGINE_ID"] = "gpu-exp"
        if socket:
            env["BELAYER_SOCKET"] = args.socket
        else:
            env.pop("BELAYER_SOCKET", None)
        if not track:
            env["BELAYER_NCCL_TRACK"] = "0"
    return env


def run_child(args, what, env, timeout):
    """Runs this script as a child for `what`; returns its JSON result (or an error dict)."""
    cmd = [sys.executable, os.path.abspath(__file__), what, "--child", "--shim", args.shim,
           "--socket", args.socket, "--receiver-log", args.receiver_log, "--store",
           args.store, "--cycles", str(args.cycles)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {p.returncode}: " + " | ".join(tail)}


def init_pg(torch, store):
    import torch.distributed as dist
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    path = os.path.join(store, f"store-{os.getpid()}")
    dist.init_process_group("nccl", init_method="file://" + path, rank=0, world_size=1,
                            device_id=dev)
    return dist, dev


def child_e2(args):
    import torch
    dist, dev = init_pg(torch, args.store)
    side = torch.cuda.Stream()
    a = torch.randn(1024, 1024, device=dev)
    w = torch.randn(1024, 1024, device=dev)
    buf = torch.ones(1 << 20, device=dev)
    failures, errors = 0, []
    # warm-up outside capture, as the CUDA Graphs notes ask (cuBLAS handle and workspace)
    with torch.cuda.stream(side):
        (a @ w).sum()
    torch.cuda.synchronize()
    for i in range(50):
        with torch.cuda.stream(side):
            dist.all_reduce(buf)
        g = torch.cuda.CUDAGraph()
        try:
            # capture_error_mode defaults to "global" (torch.cuda.graph documentation)
            with torch.cuda.graph(g, capture_error_mode="global"):
                y = a @ w
                # a size no cached block fits: a new segment (cudaMalloc) during capture
                z = torch.empty((64 + 2 * i) * MIB, dtype=torch.uint8, device=dev)
                z.fill_(1)
            g.replay()
            torch.cuda.synchronize()
            if not torch.allclose(y, a @ w):
                failures += 1
                errors.append(f"iteration {i}: replay gave a wrong product")
        except Exception as e:  # a capture invalidated by another thread's call
            failures += 1
            if len(errors) < 5:
                errors.append(f"iteration {i}: {type(e).__name__}: {str(e).splitlines()[0]}")
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # a sticky error: later iterations would only repeat it
                errors.append(f"after iteration {i}: {type(e2).__name__}: {e2}")
                return {"captures": i + 1, "failed": failures, "errors": errors}
        del g
    dist.destroy_process_group()
    return {"captures": 50, "failed": failures, "errors": errors}


def pointer_attributes(ptr):
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    out = {}
    for name, attr in POINTER_ATTRIBUTES.items():
        data = (ctypes.c_uint64 * 2)()
        r = cuda.cuPointerGetAttribute(ctypes.byref(data), ctypes.c_int(attr),
                                       ctypes.c_uint64(ptr))
        if r != 0:
            out[name] = f"error {r}"
        elif name in ("RANGE_START_ADDR",):
            out[name] = f"ptr{data[0] - ptr:+d}"
        elif name == "P2P_TOKENS":
            out[name] = f"{data[0]:#x}/{data[1]:#x}"
        elif name in ("IS_LEGACY_CUDA_IPC_CAPABLE", "IS_GPU_DIRECT_RDMA_CAPABLE"):
            out[name] = int(data[0] & 0xffffffff)
        else:
            out[name] = int(data[0])
    return out


def share_reader(q, r):
    import torch
    try:
        t = q.get(timeout=40)
        r.put(("ok", int(t.sum().item())))
    except Exception as e:
        r.put(("error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))


def share_with(torch, t, env_shim):
    """Shares t with a spawned child (env: with LD_PRELOAD or without); its answer."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    saved = os.environ.get("LD_PRELOAD")
    if env_shim:
        os.environ["LD_PRELOAD"] = env_shim
    else:
        os.environ.pop("LD_PRELOAD", None)
    try:
        q, r = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=share_reader, args=(q, r))
        p.start()
    finally:
        if saved is not None:
            os.environ["LD_PRELOAD"] = saved
    q.put(t)
    try:
        res = r.get(timeout=45)
    except Exception:
        res = ("error", "no answer in 45 s")
    p.join(30)
    if p.is_alive():
        p.kill()
    return res


def cuda_memcpy2d(torch, dst, src_host):
    """cudaMemcpy2D H2D of 64 rows x 4 KiB into dst through the runtime torch loaded."""
    import ctypes
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            rt = ctypes.CDLL(name)
            break
        except OSError:
            rt = None
    if rt is None:
        return "libcudart not loadable by ctypes"
    r = rt.cudaMemcpy2D(ctypes.c_void_p(dst.data_ptr()), ctypes.c_size_t(8192),
                        ctypes.c_void_p(src_host.data_ptr()), ctypes.c_size_t(4096),
                        ctypes.c_size_t(4096), ctypes.c_size_t(64), ctypes.c_int(1))
    return None if r == 0 else f"cudaMemcpy2D returned {r}"


def child_e7(args):
    import torch
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    shim = "libbelayer" in os.environ.get("LD_PRELOAD", "")
    out = {"shim": shim, "errors": []}
    # First large allocation, before any cuMemGetInfo: the phase heuristic calls it weights.
    w = torch.zeros(64 * MIB, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    out["attributes"] = pointer_attributes(w.data_ptr())
    seg = [s for s in torch.cuda.memory_snapshot() if s["address"] <= w.data_ptr()
           < s["address"] + s["total_size"]]
    if seg:
        out["segment"] = {"start": f"ptr{seg[0]['address'] - w.data_ptr():+d}",
                          "size": seg[0]["total_size"]}
    if not shim:
        return out

    # (c) the write census
    reg = region_of(args.receiver_log, os.getpid(), w.data_ptr())
    if reg is None:
        out["errors"].append("the weights tensor's region was never announced")
        return out
    out["region"] = {"id": reg.get("id"), "class": reg.get("class"), "size": reg["size"]}
    host = torch.ones(8 * MIB, dtype=torch.uint8).pin_memory()
    src = torch.full((8 * MIB,), 3, dtype=torch.uint8, device=dev)
    wide = torch.full((4096, 4096), 5, dtype=torch.uint8, device=dev)
    ops = [
        ("copy_ H2D non_blocking", lambda: w[:8 * MIB].copy_(host, non_blocking=True)),
        ("copy_ D2D contiguous", lambda: w[:8 * MIB].copy_(src)),
        ("copy_ D2D strided", lambda: w[:16 * MIB].view(4096, 4096)[:, :2048]
         .copy_(wide[:, :2048])),
        ("fill_", lambda: w[:8 * MIB].fill_(7)),
        ("zero_", lambda: w[:8 * MIB].zero_()),
        ("cudaMemcpy2D H2D", lambda: cuda_memcpy2d(torch, w, host)),
    ]
    census = []
    ran_2d = False
    for name, fn in ops:
        before = max_version(args.receiver_log, os.getpid(), reg.get("id"))
        err = fn()
        torch.cuda.synchronize()
        if isinstance(err, str):
            census.append(f"{name}: not run ({err})")
            continue
        ran_2d = ran_2d or name.startswith("cudaMemcpy2D")
        deadline = time.monotonic() + 1.0  # announcements travel through the shim's thread
        after = before
        while time.monotonic() < deadline and after == before:
            time.sleep(0.05)
            after = max_version(args.receiver_log, os.getpid(), reg.get("id"))
        census.append(f"{name}: version {before} -> {after}"
                      f" ({'bumped' if after > before else 'NOT seen'})")
    out["census"] = census
    # zero_, then (if it ran) 64 rows of 4096 ones at a pitch of 8192 from cudaMemcpy2D
    want = 64 * 4096 if ran_2d else 0
    if int(w[:8 * MIB].sum().item()) != want:
        out["errors"].append("the weights tensor does not hold what zero_ and cudaMemcpy2D "
                             "wrote")

    # (a) torch.multiprocessing sharing
    t = torch.arange(1 << 20, dtype=torch.int64, device=dev)
    t_sum = int(t.sum().item())
    out["share"] = {}
    for who, env_shim in (("shimmed child", os.environ.get("LD_PRELOAD")),
                          ("unshimmed child", None)):
        status, val = share_with(torch, t, env_shim)
        if status == "ok" and val == t_sum:
            out["share"][who] = "read the shared tensor correctly"
        elif status == "ok":
            out["share"][who] = f"read WRONG contents (sum {val}, want {t_sum})"
        else:
            out["share"][who] = f"failed: {val}"
    if not out["share"]["shimmed child"].startswith("read the shared"):
        out["errors"].append("a shimmed child could not use the shared tensor: "
                             + out["share"]["shimmed child"])
    return out


def child_e8(args):
    import torch
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    out = {"sizes": {}}
    # requests whose caching-allocator segments are 2 MiB (a small-pool block: requests up to
    # 1 MiB), 20 MiB, 256 MiB and 2 GiB
    for mib in (1, 20, 256, 2048):
        alloc, free, segment = [], [], 0
        t_end = time.monotonic() + 12.0  # each size's own bound
        for _ in range(args.cycles):
            before = torch.cuda.memory_reserved(dev)
            t0 = time.perf_counter()
            x = torch.empty(mib * MIB, dtype=torch.uint8, device=dev)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            segment = segment or torch.cuda.memory_reserved(dev) - before
            del x
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            alloc.append(t1 - t0)
            free.append(t2 - t1)
            if time.monotonic() > t_end:
                break

        def q(v, p):
            v = sorted(v)
            return round(v[min(len(v) - 1, int(p * len(v)))] * 1e6, 1)
        out["sizes"][str(mib)] = {"cycles": len(alloc), "segment_mib": segment >> 20,
                                  "alloc_med_us": q(alloc, 0.5),
                                  "alloc_p90_us": q(alloc, 0.9), "free_med_us": q(free, 0.5),
                                  "free_p90_us": q(free, 0.9)}
    return out


# --- the experiments ----------------------------------------------------------------------

def exp_e2(args):
    shim = run_child(args, "e2", child_env(args, True), 70)
    ctl = run_child(args, "e2", child_env(args, True, track=False, socket=False), 70)
    for tag, r in (("under the shim", shim), ("control (BELAYER_NCCL_TRACK=0, no socket)", ctl)):
        if "error" in r:
            print(f"{tag}: the workload failed: {r['error']}")
        else:
            print(f"{tag}: {r['failed']} of {r['captures']} captures failed")
            for e in r["errors"]:
                print(f"  {e}")
    if "error" in shim or "error" in ctl:
        print("summary: the capture workload did not run (above)")
        return 1
    if shim["failed"] and not ctl["failed"]:
        print(f"summary: {shim['failed']} of 50 global-mode captures failed under the shim, "
              "none in the control: the shim's threads invalidate captures (A3)")
        return 1
    if shim["failed"]:
        print(f"summary: captures fail with and without NCCL tracking ({shim['failed']}, "
              f"{ctl['failed']} of 50): not the shim's threads alone")
        return 1
    print("summary: 50 global-mode captures next to all_reduce, none invalidated under the "
          "shim")
    return 0


def exp_e7(args):
    base = run_child(args, "e7", child_env(args, False), 60)
    shim = run_child(args, "e7", child_env(args, True), 150)
    for tag, r in (("without the shim", base), ("under the shim", shim)):
        if "error" in r:
            print(f"{tag}: the workload failed: {r['error']}")
            continue
        print(f"{tag}: pointer attributes of a 64 MiB tensor: {json.dumps(r['attributes'])}"
              f"; caching-allocator segment {json.dumps(r.get('segment'))}")
    if "error" in base or "error" in shim:
        print("summary: the workload did not run (above)")
        return 1
    print(f"under the shim: the tensor's region {json.dumps(shim.get('region'))}")
    for line in shim.get("census", []):
        print(f"  write census: {line}")
    for who, res in shim.get("share", {}).items():
        print(f"  torch.multiprocessing share to a {who}: {res}")
    diff = sorted(k for k in POINTER_ATTRIBUTES if base["attributes"].get(k) !=
                  shim["attributes"].get(k) and k != "P2P_TOKENS")
    if shim["errors"]:
        print("summary: " + "; ".join(shim["errors"]))
        return 1
    seen = sum(1 for c in shim.get("census", []) if c.endswith("(bumped)"))
    print(f"summary: shimmed child shares OK; unshimmed child: "
          f"{shim['share'].get('unshimmed child', '?')}; attributes differing from "
          f"cudaMalloc memory: {', '.join(diff) or 'none'}; write census: {seen} of "
          f"{len(shim.get('census', []))} write kinds bump the weights version")
    return 0


def exp_e8(args):
    base = run_child(args, "e8", child_env(args, False), 70)
    shim = run_child(args, "e8", child_env(args, True), 70)
    if "error" in base or "error" in shim:
        print(f"without the shim: {base.get('error', 'ok')}; under the shim: "
              f"{shim.get('error', 'ok')}")
        print("summary: the allocation workload failed (above)")
        return 1
    parts = []
    for mib, b in base["sizes"].items():
        s = shim["sizes"][mib]
        print(f"{mib} MiB request ({s['segment_mib']} MiB reserved): alloc median {b['alloc_med_us']} -> {s['alloc_med_us']} us "
              f"(p90 {b['alloc_p90_us']} -> {s['alloc_p90_us']}), free+empty_cache median "
              f"{b['free_med_us']} -> {s['free_med_us']} us (p90 {b['free_p90_us']} -> "
              f"{s['free_p90_us']}); {b['cycles']}/{s['cycles']} cycles")
        parts.append(f"{s['segment_mib']}M {b['alloc_med_us']:.0f}->{s['alloc_med_us']:.0f}us/"
                     f"{b['free_med_us']:.0f}->{s['free_med_us']:.0f}us")
    print("summary: alloc/free medians without -> with the shim: " + ", ".join(parts))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("e2", "e7", "e8"))
    ap.add_argument("--child", action="store_true", help="run one workload, print JSON")
    ap.add_argument("--shim", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--receiver-log", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--cycles", type=int, default=200)
    args = ap.parse_args()
    if args.child:
        r = {"e2": child_e2, "e7": child_e7, "e8": child_e8}[args.what](args)
        print(json.dumps(r), flush=True)
        return 0
    return {"e2": exp_e2, "e7": exp_e7, "e8": exp_e8}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
