# SPDX-License-Identifier: MIT
"""A vLLM v1 worker process as far as the shim can see, on the stand-in runner
(engines/vllm): the order of vllm/v1/worker/gpu_worker.py (init_device, load_model,
determine_available_memory, initialize_from_config, compile_or_warm_up_model), with the
driver reached through ctypes as cudart reaches it. Prints one JSON line, name -> VA of each
allocation and what the block table reads back after a step's writes, then holds until stdin
closes (tests/shim/test-tag-hook.py)."""

import ctypes
import json
import sys

from vllm.v1.worker.gpu_model_runner import MIB, GPUModelRunner


class Device:
    def __init__(self):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.cuda.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
        self.cuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
        self.cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_size_t]
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.cuda.cuInit(0), "cuInit")
        self.check(self.cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.check(self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                   "cuDevicePrimaryCtxRetain")
        self.check(self.cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    @staticmethod
    def check(r, what):
        if r != 0:
            sys.exit(f"tag-hook-worker: {what}: CUresult {r}")

    def alloc(self, size):
        p = ctypes.c_uint64()
        self.check(self.cuda.cuMemAlloc_v2(ctypes.byref(p), size), "cuMemAlloc_v2")
        return p.value

    def write(self, va, data):
        self.check(self.cuda.cuMemcpyHtoD_v2(va, data, len(data)), "cuMemcpyHtoD_v2")

    def read(self, va, n):
        buf = ctypes.create_string_buffer(n)
        self.check(self.cuda.cuMemcpyDtoH_v2(buf, va, n), "cuMemcpyDtoH_v2")
        return buf.raw

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(self.cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)),
                   "cuMemGetInfo_v2")


device = Device()
device.mem_info()  # init_device: the baseline snapshot, before any weight
runner = GPUModelRunner(device)
runner.load_model()
device.mem_info()  # determine_available_memory: the KV-sizing probe
runner.initialize_kv_cache({"num_layers": 2})
runner.va["graph_pool"] = device.alloc(20 * MIB)  # capture_model: a graph pool segment
# A step: the block table gets its rows, then the attention workspace and the KV cache are
# written. In a shadow, scratch regions alias each other; the block table must read back what
# was written to it.
device.write(runner.va["block_table"], b"block-table-rows")
device.write(runner.va["attn_workspace"], b"attn-workspace..")
device.write(runner.va["kv0"], b"kv-cache-entries")
out = {k: hex(v) for k, v in runner.va.items()}
out["block_table_reads"] = device.read(runner.va["block_table"], 16).decode("latin-1")
print(json.dumps(out), flush=True)
sys.stdin.read()
