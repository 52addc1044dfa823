# SPDX-License-Identifier: MIT
"""A stand-in for vLLM v1's vllm/v1/worker/gpu_model_runner.py, as far as belayer_tag and the
shim can see: the class and method names of the real one, and allocations in the places the
real one makes them (tests/shim/test-tag-hook.py). `device` allocates with cuMemAlloc_v2 on
the driver, as PyTorch's caching allocator does (through cudart) for its segments."""

MIB = 1 << 20
KV_TENSOR = 16 * MIB  # one layer's KV tensor
BLOCK_TABLE = 20 * MIB  # a large-pool segment holding block tables and slot mapping


class GPUModelRunner:
    def __init__(self, device):
        self.device = device
        self.va = {}
        # InputBatch at runner init: its BlockTable's CpuGpuBuffers (vllm/v1/worker/
        # block_table.py), before any weight or probe.
        self.va["block_table"] = device.alloc(BLOCK_TABLE)

    def load_model(self, load_dummy_weights=False):
        # model_loader.load_model: the parameters.
        self.va["weights0"] = self.device.alloc(8 * MIB)
        self.va["weights1"] = self.device.alloc(8 * MIB)

    def initialize_kv_cache(self, kv_cache_config, is_profiling=False):
        # initialize_metadata_builders: an attention backend's workspace, first after the
        # probe and as large as a KV tensor.
        self.va["attn_workspace"] = self.device.alloc(KV_TENSOR)
        # may_reinitialize_input_batch: a new InputBatch for the final block sizes.
        self.va["block_table_final"] = self.device.alloc(BLOCK_TABLE)
        self.initialize_kv_cache_tensors(kv_cache_config, [16])

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes,
                                    kv_cache_allocation_context=None):
        # allocate_kv_cache: one tensor per layer.
        for i in range(kv_cache_config["num_layers"]):
            self.va[f"kv{i}"] = self.device.alloc(KV_TENSOR)
        return {}
