/* SPDX-License-Identifier: MIT */
/*
 * The emulated libnvidia-ml.so.1: what its two files share. Devices are the emulator's
 * (emu-state): count, capacity, memory in use, UUID (the same bytes libcuda reports), XID and
 * ECC events. Handles are addresses in one static array, valid for the life of the process,
 * as NVML's are. Test-only.
 */
#pragma once

#include <stdbool.h>

#include "emu-state.h"
#include "nvml-abi.h"
#include "util.h"

struct nvmlDevice_st {
	int index;
};

extern struct nvmlDevice_st nvml_devices[EMU_MAX_DEVICES];

/* NVML_SUCCESS while initialized (nvmlInit_v2 not yet balanced by nvmlShutdown), else
 * NVML_ERROR_UNINITIALIZED. */
nvmlReturn_t nvml_check_init(void);
/* The index of a valid handle, or -1. */
int nvml_device_index(nvmlDevice_t device);
/* Fires an injected fault for func (emu_fault_take); true and *ret set when one did. */
bool nvml_fault(const char *func, nvmlReturn_t *ret);

#define NVML_ENTER(name)                       \
	do {                                   \
		nvmlReturn_t enter_;           \
		if (nvml_fault(name, &enter_)) \
			return enter_;         \
		enter_ = nvml_check_init();    \
		if (enter_ != NVML_SUCCESS)    \
			return enter_;         \
	} while (0)
