/* SPDX-License-Identifier: MIT */
/*
 * A shadow's scratch memory (shim-shadow-scratch.c): one allocation granule per device, mapped
 * over and over across the range of every weights and kv region, and the fake handles a
 * program's scratch-backed cuMemCreate gets.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "proto.h"

/* Shadow: whether a new region of this class is backed by scratch. */
bool shadow_wants_scratch(enum region_class cls);
/* With shim_busy held: maps the device's scratch allocation over [va, va + size) chunk by
 * chunk and grants access. Returns a CUresult; on failure nothing stays mapped. */
CUresult shadow_scratch_map(int dev, uint64_t va, uint64_t size);
/* With shim_busy held: unmaps the scratch chunks of [va, va + size) (all of them, whatever
 * fails; the first failure is returned). */
CUresult shadow_scratch_unmap(int dev, uint64_t va, uint64_t size);
/* Size of one scratch chunk on dev (the allocation granularity), 0 when unknown. */
size_t shadow_granularity(int dev);
/* A fresh fake handle for a program's scratch-backed cuMemCreate. */
CUmemGenericAllocationHandle shadow_fake_handle(void);
bool shadow_handle_is_fake(CUmemGenericAllocationHandle h);
void shadow_scratch_reset_after_fork(void);
