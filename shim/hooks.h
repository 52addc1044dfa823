/* SPDX-License-Identifier: MIT */
/*
 * The exported wrappers' tables (hooks-cuda.c, hooks-nccl.c), for the dlsym hook (hooks-dl.c),
 * which answers a hooked name with its wrapper.
 */
#pragma once

#include "shim-real.h"

struct hook_info {
	const char *name;
	const char *proc;
	int version;
	int ptds;
	void *wrapper;
};

extern const struct hook_info cuda_hooks[_HOOK_CUDA_MAX];
extern const struct hook_info nccl_hooks[_NCCL_HOOK_MAX];
