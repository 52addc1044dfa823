/* SPDX-License-Identifier: MIT */
/* What the shim knows of each CUDA device (shim-device.c), probed once per device. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "proto.h"

#define MAX_DEVS 64

struct dev_info {
	bool probed;
	bool posix_fd;
	size_t granularity;
	bool uuid_ok;
	uint8_t uuid[PROTO_UUID_LEN];
	bool rdma_vmm; /* GPUDirect RDMA of VMM memory created with gpuDirectRDMACapable */
};

/* With shim_busy held: dev's properties, NULL for a device number out of range. */
const struct dev_info *shim_device_info(CUdevice dev);
/* The device's UUID (cached), zeros when unknown. */
void shim_device_uuid(CUdevice dev, uint8_t uuid[PROTO_UUID_LEN]);
/* Access for dev and every peer that can reach it, as cudaMalloc memory offers. */
CUresult shim_set_access(CUdeviceptr va, size_t size, CUdevice dev);
