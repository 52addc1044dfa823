/* SPDX-License-Identifier: MIT */
/*
 * Host implementations, for the emulated driver (BELAYER_EMU_KERNELS), of the PTX kernels
 * the real-GPU checks launch: on a GPU the PTX runs, on the emulator these do (tests/emu
 * README, Kernels).
 */
#include <stddef.h>
#include <stdint.h>

#include "belayer-emu.h"

/* belayer_gpu_fault_store(u64 *p): *p = p. An address not mapped with access makes the
 * emulator fault the launch, as the GPU's MMU does (gpu-vmm-survive --case fault). */
static void fault_store(const struct belayer_emu_launch *l, void **params)
{
	CUdeviceptr p = *(CUdeviceptr *)params[0];
	uint64_t *h = belayer_emu_translate(p, sizeof(*h));

	(void)l;
	if (h)
		*h = (uint64_t)p;
}

__attribute__((constructor)) static void register_kernels(void)
{
	(void)belayer_emu_register_kernel("belayer_gpu_fault_store", fault_store);
}
