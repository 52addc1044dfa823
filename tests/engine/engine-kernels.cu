/* SPDX-License-Identifier: MIT */
/*
 * The engine's kernels for a real GPU, compiled to PTX by nvcc at build time and embedded in
 * the engine. The bodies live in engine-kernels.h, shared with the host implementations the
 * emulated driver runs (engine-kernels-host.c): thread i computes element i.
 */
#include <stdint.h>

#include "engine-kernels.h"

#define GPU_KERNEL(name, type)                                                \
	extern "C" __global__ void name(struct type a)                        \
	{                                                                     \
		uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; \
		if (i < name##_count(&a))                                     \
			name##_at(&a, i);                                     \
	}

ENGINE_KERNELS(GPU_KERNEL)
