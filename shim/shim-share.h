/* SPDX-License-Identifier: MIT */
/* Tracked memory the program shares with other processes (shim-share.c). */
#pragma once

#include <stdint.h>

#include <cuda.h>

/* Converted region id is being shared (legacy IPC): it leaves the layout as `other`, and in a
 * shadow gets real memory of its own first. Returns 0 or -errno (the region stays as it was). */
int share_converted(uint64_t id);
/* User region of handle h (a fake one in a shadow) is being shared: the same, for a program's
 * cuMemCreate handle. *ret_real: the handle the driver knows its memory by. -ENOENT: not ours;
 * -EIO: no real memory could be made for it (it stays as it was). */
int share_handle(CUmemGenericAllocationHandle h, CUmemGenericAllocationHandle *ret_real);
/* The region mapped at va is being shared (retained, bound). *ret_fake: its fake handle when it
 * has one (a retain reference counted on it), else 0. */
int share_address(uint64_t va, CUmemGenericAllocationHandle *ret_fake);

/* The wrappers' logic: each shares what it is given first, then calls the driver with real
 * handles only. */
CUresult share_export(void *shareable, CUmemGenericAllocationHandle handle,
		      CUmemAllocationHandleType type, unsigned long long flags);
CUresult share_retain(CUmemGenericAllocationHandle *handle, void *addr);
CUresult share_get_properties(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle);
CUresult share_multicast_bind_mem(CUmemGenericAllocationHandle mc, size_t mc_offset,
				  CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
				  unsigned long long flags);
CUresult share_multicast_bind_addr(CUmemGenericAllocationHandle mc, size_t mc_offset,
				   CUdeviceptr ptr, size_t size, unsigned long long flags);
