/* SPDX-License-Identifier: MIT */
/*
 * A host kernel library, loaded by the emulated driver from BELAYER_EMU_KERNELS at cuInit:
 * its constructor registers host implementations of the PTX entries the kernel test loads.
 */
#include <stddef.h>
#include <stdint.h>

#include "belayer-emu.h"

/* vec_add(const float *a, const float *b, float *c, unsigned n): c = a + b, over the grid. */
static void vec_add(const struct belayer_emu_launch *l, void **params)
{
	CUdeviceptr a = *(CUdeviceptr *)params[0];
	CUdeviceptr b = *(CUdeviceptr *)params[1];
	CUdeviceptr c = *(CUdeviceptr *)params[2];
	unsigned n = *(unsigned *)params[3];
	uint64_t threads = (uint64_t)l->grid[0] * l->block[0];
	const float *ha, *hb;
	float *hc;

	if (threads < n)
		n = (unsigned)threads; /* threads past the grid do not exist */
	ha = belayer_emu_translate(a, n * sizeof(float));
	hb = belayer_emu_translate(b, n * sizeof(float));
	hc = belayer_emu_translate(c, n * sizeof(float));
	if (!ha || !hb || !hc)
		return; /* an illegal address: the driver makes it sticky (cuda-graph.c) */
	for (unsigned i = 0; i < n; i++)
		hc[i] = ha[i] + hb[i];
}

__attribute__((constructor)) static void register_kernels(void)
{
	(void)belayer_emu_register_kernel("vec_add", vec_add);
}
