/* SPDX-License-Identifier: MIT */
/*
 * A GPU's UUID as nvidia-smi, NVML (nvmlDeviceGetUUID) and CUDA_VISIBLE_DEVICES write it:
 * "GPU-" and the 16 bytes cuDeviceGetUuid returns as 8-4-4-4-12 lowercase hex digits.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define GPU_UUID_STR_LEN 40 /* without the NUL */

/* Writes the string and its NUL into buf (GPU_UUID_STR_LEN + 1 bytes). */
void gpu_uuid_format(const uint8_t uuid[PROTO_UUID_LEN], char buf[GPU_UUID_STR_LEN + 1]);
/* Parses exactly GPU_UUID_STR_LEN characters at s (hex digits of either case): 0, or -EINVAL
 * with ret untouched. */
int gpu_uuid_parse(const char *s, uint8_t ret[PROTO_UUID_LEN]);
