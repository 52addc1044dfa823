/* SPDX-License-Identifier: MIT */
/*
 * A caching allocator of device memory with PyTorch's segment policy, so that the driver sees
 * the cuMemAlloc_v2 calls a vLLM/SGLang worker makes (c10/cuda/CUDACachingAllocator.cpp):
 *   - a request is rounded up to a multiple of 512 bytes (kMinBlockSize);
 *   - requests of at most 1 MiB (kSmallSize) are served from the small pool, whose segments
 *     are 2 MiB (kSmallBuffer); larger ones from the large pool, whose segments are 20 MiB
 *     (kLargeBuffer) for requests under 10 MiB (kMinLargeAlloc) and the request rounded up to
 *     2 MiB (kRoundLarge) from 10 MiB on;
 *   - the smallest free block that fits is used (lowest address among equals) and split when
 *     the rest is at least 512 bytes (small pool) or more than 1 MiB (large pool); a new
 *     segment (one cuMemAlloc_v2) is made only when no free block fits;
 *   - a freed block returns to its segment and merges with free neighbours; segments stay
 *     allocated, except that an out-of-memory cuMemAlloc_v2 gives the empty ones back and is
 *     retried once.
 * No streams (the engine uses one), no max_split_size / expandable segments / rounding knobs.
 *
 * Pools are PyTorch's private memory pools (torch.cuda.MemPool): a block is only ever carved
 * from its own pool's segments. The engine keeps weights and the KV cache in pools of their
 * own, as vLLM's sleep mode (CuMemAllocator tags "weights" / "kv_cache") and SGLang's
 * torch_memory_saver regions do, so no weights segment also holds per-step buffers.
 *
 * Sleep mode (--enable-sleep-mode, dev_alloc_use_cumem): the segments of the weights and KV
 * pools are made as vLLM's CuMemAllocator makes them (vllm/device_allocator/cumem.py, the
 * pluggable allocator of csrc/cumem_allocator.cpp: my_malloc reserves an address range, then
 * create_and_map does cuMemCreate + cuMemMap + cuMemSetAccess with the program's own handle),
 * instead of cuMemAlloc_v2. dev_sleep and dev_wake_up are CuMemAllocator.sleep and wake_up:
 * sleep backs up the weights segments to host memory (level 1; level 2 discards them too),
 * then unmaps and releases every segment of both pools (unmap_and_release), keeping each
 * reservation; wake_up re-creates and maps each at the same address (create_and_map) and copies
 * the backed-up bytes back. The KV cache comes back with undefined contents, as in vLLM.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <cuda.h>

enum dev_pool {
	DEV_POOL_DEFAULT,
	DEV_POOL_WEIGHTS,
	DEV_POOL_KV,
	DEV_POOL_MAX,
};

/* A block of at least bytes from pool: 0 or -errno (-ENOMEM when the driver is out). */
int dev_alloc(enum dev_pool pool, CUdeviceptr *ret, uint64_t bytes);
/* Returns the block at p (as dev_alloc gave it) to its segment: 0 or -EINVAL if unknown. */
int dev_free(CUdeviceptr p);

/* Sleep mode: the weights and KV pools' segments made with cuMemCreate on device dev from
 * now on. */
void dev_alloc_use_cumem(int dev);
/* CuMemAllocator.sleep(level): 0, -EINVAL (not in sleep mode, asleep already, bad level) or
 * another -errno (the driver). */
int dev_sleep(int level);
/* CuMemAllocator.wake_up(tags): the sleeping segments of the pools in mask (a bit per enum
 * dev_pool; all: ~0u) mapped again. */
int dev_wake_up(unsigned mask);
/* Whether any segment of a pool in mask is asleep. */
bool dev_asleep(unsigned mask);
